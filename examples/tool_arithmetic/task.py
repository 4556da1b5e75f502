"""The tool-use demo's task: products of two 3-digit numbers, which the tiny policy cannot
compute in its head but can with the `python` tool (docs/tools.md).

A problem is ``123*456=`` with ground truth ``56088``; the reward is the `math` verifier on the
final answer (``\\boxed{56088}``), never on a tool's output. The tokenizer is the arithmetic
demo's character-level one plus four single tokens for the tool-call format
(``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``), and a chat
template with a tool role, so the generate stage renders an observation the way the warm-up
taught it (components/generate/multiturn.py, ``observation_encoder``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from examples.arithmetic.data import Problem
from examples.arithmetic.data import write_table as write_arithmetic_table
from examples.arithmetic.model import build_tokenizer as build_char_tokenizer

DATA_SOURCE = "tool_arithmetic"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
#: The user message, then for a tool message its content in <tool_response> tags.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "<tool_response>{{ message['content'] }}</tool_response>"
    "{% else %}{{ message['content'] }}{% endif %}{% endfor %}"
)
#: Prompt, tool call, observation and answer in tokens: about 95 for 3-digit operands.
MAX_POSITIONS = 128
LOW, HIGH = 100, 999


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(list(TOOL_TOKENS))
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_splits(*, seed: int, n_train: int, n_eval: int, n_dev: int) -> dict[str, list[Problem]]:
    """Eval and dev problems are distinct products held out of train (``a*b`` and ``b*a``
    count as one); train draws from the rest with replacement."""
    rng = random.Random(seed)
    held: set[tuple[int, int]] = set()
    splits: dict[str, list[Problem]] = {"eval": [], "dev": [], "train": []}
    for split, n in (("eval", n_eval), ("dev", n_dev)):
        while len(splits[split]) < n:
            a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
            key = (min(a, b), max(a, b))
            if key not in held:
                held.add(key)
                splits[split].append(Problem(a, "*", b, level=4))
    while len(splits["train"]) < n_train:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        if (min(a, b), max(a, b)) not in held:
            splits["train"].append(Problem(a, "*", b, level=4))
    return splits


def tool_call_text(problem: Problem) -> str:
    """The policy's first turn in a tool trace: one call of `python` that prints the product."""
    call = {"name": "python", "arguments": {"code": f"print({problem.expression})"}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def answer_text(problem: Problem) -> str:
    return f"\\boxed{{{problem.answer}}}"


def write_table(problems: Iterable[Problem], split: str, path: Path) -> Path:
    return write_arithmetic_table(problems, split, path, data_source=DATA_SOURCE)


def trace_ids(tokenizer, observe, problem: Problem, *, tool: bool) -> tuple[list[int], list[int]]:
    """(response ids, trained mask) of one warm-up trace after the prompt, exactly as the generate
    stage would hold it: a tool trace is the call, the observation as `observe` (the stage's
    observation encoder) renders the tool's output, then the answer; a direct trace is the answer
    alone. The observation is not trained on (mask 0), as train masks it in RL."""
    answer = tokenizer.encode(answer_text(problem), add_special_tokens=False)
    answer += [tokenizer.eos_token_id]
    if not tool:
        return answer, [1] * len(answer)
    call = tokenizer.encode(tool_call_text(problem), add_special_tokens=False)
    obs = observe(f"{problem.answer}\n")  # what `print` writes
    return call + obs + answer, [1] * len(call) + [0] * len(obs) + [1] * len(answer)


def grade(texts: Sequence[str], problems: Sequence[Problem]) -> list[float]:
    from components.verify.math import compute_score

    return [compute_score(t, p.answer)["score"] for t, p in zip(texts, problems, strict=True)]
