"""The data of the demo's standard-benchmark suite (lm_eval_tasks/: two lm-evaluation-harness
tasks), written by the prepare step: problems of the demo's own levels, drawn apart from its
held-out set, in lm-eval's JSON-lines form.

* ``arith_choice.jsonl``: the problem and four boxed answers (the right one, off by one either
  way, off by ten), ``label`` the right one's index; lm-eval scores the choice the policy finds
  most likely.
* ``arith_greedy.jsonl``: the problem and ``\\boxed{ANSWER}``, the greedy response's target.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

from examples.arithmetic.data import level_pool

FILES = ("arith_choice.jsonl", "arith_greedy.jsonl")
PER_TASK = 100


def write_jsonl_once(
    out: Path, rows: Callable[[random.Random], dict[str, list[dict]]], seed: int
) -> Path:
    """``out/lm_eval/<name>`` for each file `rows(rng)` gives (kept when every one is already
    there), each renamed into place whole: an example's lm-eval task data."""
    target = Path(out) / "lm_eval"
    tables = rows(random.Random(seed))
    if all((target / name).exists() for name in tables):
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{name}.")
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in table)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target / name)
    return target


def _rows(rng: random.Random) -> dict[str, list[dict]]:
    problems = rng.sample(level_pool(1) + level_pool(2), 2 * PER_TASK)
    choice_rows = []
    for p in problems[:PER_TASK]:
        answer = int(p.answer)
        options = [answer, answer + 1, answer - 1, answer + 10]
        rng.shuffle(options)
        choice_rows.append(
            {
                "question": p.prompt_text,
                "choices": [f"\\boxed{{{o}}}" for o in options],
                "label": options.index(answer),
            }
        )
    greedy_rows = [
        {"question": p.prompt_text, "target": f"\\boxed{{{p.answer}}}"} for p in problems[PER_TASK:]
    ]
    return dict(zip(FILES, (choice_rows, greedy_rows), strict=True))


def write_lm_eval_data(out: Path, seed: int = 7) -> Path:
    """``out/lm_eval/*.jsonl`` (kept when already there), each file renamed into place whole."""
    return write_jsonl_once(out, _rows, seed)
