"""Prepare the arithmetic demo: datasets plus a briefly warmed base policy, all offline.

Writes, under ``--out``:

* ``train.parquet`` and ``eval.parquet`` (verl format, see ``examples.arithmetic.data``);
* ``base/``: a tiny Qwen2 policy and its character-level tokenizer, warmed by a short supervised
  run on train problems so that RL starts from a policy that sometimes answers correctly;
* ``prepare.json``: the settings and the warm-up curve;
* ``lm_eval/``: the data of the demo's standard-benchmark tasks (``lm_eval_tasks/``), written
  even where the rest already exists.

The warm-up teaches the response format ``\\boxed{ANSWER}<eos>`` after the chat-templated prompt
(teacher forcing, loss on response tokens only, label smoothing). Label smoothing leaves a little
probability on every token, so sampling at temperature 1.0 is noticeably worse than greedy
decoding: the base policy's sampled pass@1 is low while its greedy accuracy is much higher, which
gives GRPO room to improve by sharpening the policy as well as by learning. Every
``--eval-every`` steps the policy is sampled (temperature 1.0) on a dev split held out of both
Parquet files (shown on the bar, kept in prepare.json). Warming runs ``--max-steps`` (700) steps,
the same count on every machine; ``--target`` stops it at the first check whose sampled dev
pass@1 reaches the target instead. All of it is deterministic in ``--seed`` on one machine;
another CPU rounds differently, which moves the weights but not their dev pass@1 (measured: 1
thread against 2, 0.222 against 0.220 at step 700). It runs on one thread (``threads``).

Outputs are built in a temporary directory next to ``--out`` and renamed into place; if they
already exist, nothing is done. Takes about a minute on 2 CPU cores::

    python -m examples.arithmetic.prepare --out /tmp/arith [--seed 0]
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from components.core.store import ordinary_modes
from components.verify.math import compute_score
from examples.arithmetic.data import N_DEV, Problem, make_splits, write_table
from examples.arithmetic.lm_eval_data import write_lm_eval_data
from examples.arithmetic.model import (
    HIDDEN_SIZE,
    NUM_HEADS,
    NUM_LAYERS,
    build_model,
    build_tokenizer,
    count_parameters,
    save_checkpoint,
)
from examples.prepare_cli import prepare_main

OUTPUTS = ("train.parquet", "eval.parquet", "base/config.json", "base/model.safetensors")


@dataclass
class WarmupConfig:
    """Settings of the supervised warm-up and its stop rule."""

    seed: int = 0
    n_train: int = 20000
    n_eval: int = 500
    n_dev: int = N_DEV
    hidden_size: int = HIDDEN_SIZE
    num_layers: int = NUM_LAYERS
    num_heads: int = NUM_HEADS
    lr: float = 3e-3
    batch_size: int = 128
    label_smoothing: float = 0.1
    max_steps: int = 700
    eval_every: int = 100
    dev_samples: int = 2
    target: float | None = None
    """Stop at the first dev check whose sampled pass@1 reaches this; None: run `max_steps`.
    The demo runs a fixed count: its dev pass@1 at step 600 was 0.148 on one machine against a
    target of 0.15, so the rule picked a base 100 steps apart on machines whose float rounding
    differs (held-out pass@1 0.120 against 0.155), and every figure measured on the base moved."""
    max_new_tokens: int = 12
    threads: int = 1
    """CPU threads (at most the machine's). One: the same on every machine, and a tiny model
    gains nothing from more; with another process busy on 2 cores, 2 threads took 2 s a step
    against 0.08 s for 1 (the whole warm-up: 58 s, against a projected 20 minutes)."""


def chat_prompt(tokenizer: PreTrainedTokenizerFast, problem: Problem) -> str:
    """The chat-templated user message, exactly as the generate stage renders it."""
    messages = [{"role": "user", "content": problem.prompt_text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def response_text(problem: Problem) -> str:
    return f"\\boxed{{{problem.answer}}}"


def grade_math(texts: Sequence[str], problems: Sequence[Problem]) -> list[float]:
    # The same grader as the RL reward and the evaluation (the `math` verifier).
    return [compute_score(t, p.answer)["score"] for t, p in zip(texts, problems, strict=True)]


@dataclass(frozen=True)
class Task:
    """What a demo's warm-up teaches and how its datasets are written: the response for a
    problem, the grader of sampled responses (the stop rule), the Parquet writer."""

    response: Callable[[Problem], str] = response_text
    grade: Callable[[Sequence[str], Sequence[Problem]], list[float]] = grade_math
    write_table: Callable[[Iterable[Problem], str, Path], Path] = write_table


ARITHMETIC = Task()


def encode_sft(
    tokenizer: PreTrainedTokenizerFast, problems: Sequence[Problem], task: Task = ARITHMETIC
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + response + eos`` ids, attention mask and response-only labels."""
    rows: list[tuple[list[int], list[int]]] = []
    for p in problems:
        prompt = tokenizer.encode(chat_prompt(tokenizer, p), add_special_tokens=False)
        response = tokenizer.encode(task.response(p), add_special_tokens=False)
        rows.append((prompt, response + [tokenizer.eos_token_id]))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        n = len(prompt) + len(response)
        ids[i, :n] = torch.tensor(prompt + response)
        mask[i, :n] = 1
        labels[i, len(prompt) : n] = torch.tensor(response)
    return ids, mask, labels


@torch.no_grad()
def sampled_pass_at_1(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[Problem],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    greedy: bool = False,
    task: Task = ARITHMETIC,
) -> float:
    """Mean reward over ``samples`` temperature-1.0 samples (or one greedy answer) per problem."""
    model.eval()
    prompts = [chat_prompt(tokenizer, p) for p in problems for _ in range(1 if greedy else samples)]
    repeated = [p for p in problems for _ in range(1 if greedy else samples)]
    # no token_type_ids: transformers 4.x's fast tokenizer returns them and its generate()
    # refuses them for Qwen2 (the images run 4.x; 5.x returns none)
    enc = tokenizer(
        prompts,
        return_tensors="pt",
        padding=True,
        padding_side="left",
        return_token_type_ids=False,
    )
    # sampling settings only when sampling: transformers warns that a top_k or top_p given to
    # greedy decoding "may be ignored"
    sampling = (
        {"do_sample": False}
        if greedy
        else {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train()
    return sum(task.grade(texts, repeated)) / len(texts)


def warm_up(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    train: Sequence[Problem],
    dev: Sequence[Problem],
    cfg: WarmupConfig,
    task: Task = ARITHMETIC,
) -> list[dict[str, float]]:
    """Supervised warm-up with the sampled-dev stop rule; returns the dev curve."""
    ids, mask, labels = encode_sft(tokenizer, train, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    curve: list[dict[str, float]] = []
    model.train()
    bar = tqdm(total=cfg.max_steps, desc="warm-up", unit="step")
    for step in range(1, cfg.max_steps + 1):
        idx = torch.tensor(rng.sample(range(len(train)), cfg.batch_size))
        logits = model(input_ids=ids[idx], attention_mask=mask[idx]).logits[:, :-1]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels[idx, 1:].reshape(-1),
            ignore_index=-100,
            label_smoothing=cfg.label_smoothing,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.update()
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            acc = sampled_pass_at_1(
                model,
                tokenizer,
                dev,
                samples=cfg.dev_samples,
                max_new_tokens=cfg.max_new_tokens,
                seed=cfg.seed * 100_003 + step,
                task=task,
            )
            curve.append({"step": step, "loss": round(loss.item(), 4), "dev_sampled": acc})
            bar.set_postfix(loss=f"{loss.item():.3f}", dev_sampled=f"{acc:.3f}")
            if cfg.target is not None and acc >= cfg.target:
                bar.total = step  # the bar ends full where the stop rule fired
                bar.refresh()
                break
    bar.close()
    return curve


def outputs_exist(out: Path) -> bool:
    return all((out / name).exists() for name in OUTPUTS)


def publish(out: Path, write: Callable[[Path], None]) -> None:
    """Build a demo's inputs with `write(tmp)` in a temporary directory next to `out` and move
    them into place, `base/` last, so a killed prepare never leaves inputs that look whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        ordinary_modes(tmp)  # mkdtemp's 0o700: a container's uid could not read the inputs
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            tmp.rename(out)
        else:  # a partial earlier attempt: replace its pieces, base/ last
            for name in ("train.parquet", "eval.parquet", "prepare.json", "base"):
                if name == "base" and (out / name).exists():
                    shutil.rmtree(out / name)
                (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def already_prepared(out: Path) -> bool:
    """Whether `out` already holds a demo's inputs (said so: then a prepare does nothing)."""
    if outputs_exist(out):
        print(f"{out} already holds train.parquet, eval.parquet and base/; nothing to do")
        return True
    return False


def publish_demo(
    out: Path,
    splits: dict[str, Any],
    write_split: Callable[[Any, str, Path], Path],
    save_base: Callable[[Path], None],
    summary: dict[str, Any],
    started: float,
) -> Path:
    """Publish a demo's inputs (`publish`): train.parquet and eval.parquet from `splits` by
    `write_split`, the base checkpoint by `save_base(dir)`, and prepare.json."""

    def write(tmp: Path) -> None:
        write_split(splits["train"], "train", tmp / "train.parquet")
        write_split(splits["eval"], "eval", tmp / "eval.parquet")
        save_base(tmp / "base")
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n")

    publish(out, write)
    print(f"wrote {out} in {time.time() - started:.0f}s")
    return out


def prepare(out: Path, cfg: WarmupConfig, task: Task = ARITHMETIC) -> Path:
    """Write datasets and the warmed base policy under ``out`` (skipped if already there)."""
    out = Path(out)
    if task is ARITHMETIC:  # the standard-benchmark suite's data (lm_eval_tasks/), apart
        write_lm_eval_data(out)
    if already_prepared(out):
        return out
    torch.manual_seed(cfg.seed)
    started = time.time()
    splits = make_splits(seed=cfg.seed, n_train=cfg.n_train, n_eval=cfg.n_eval, n_dev=cfg.n_dev)
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        seed=cfg.seed,
    )
    print(f"policy: Qwen2, {count_parameters(model):,} parameters, vocab {len(tokenizer)}")
    curve = warm_up(model, tokenizer, splits["train"], splits["dev"], cfg, task)
    greedy = sampled_pass_at_1(
        model,
        tokenizer,
        splits["dev"],
        samples=1,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        greedy=True,
        task=task,
    )
    print(
        f"warm-up stopped at step {curve[-1]['step']}: dev pass@1 sampled "
        f"{curve[-1]['dev_sampled']:.3f}, greedy {greedy:.3f}"
    )

    summary = {
        "config": asdict(cfg),
        "parameters": count_parameters(model),
        "curve": curve,
        "dev_greedy": greedy,
        "seconds": round(time.time() - started, 1),
    }
    return publish_demo(
        out,
        splits,
        task.write_table,
        lambda base: save_checkpoint(model, tokenizer, base),
        summary,
        started,
    )


def main(
    argv: Sequence[str] | None = None,
    task: Task = ARITHMETIC,
    defaults: WarmupConfig | None = None,
    description: str | None = None,
) -> None:
    prepare_main(
        lambda out, cfg: prepare(out, cfg, task),
        defaults or WarmupConfig(),
        description=description or __doc__.splitlines()[0],
        argv=argv,
        flags=(
            ("seed", "n_train", "n_eval", "max_steps", "eval_every", "batch_size")
            + ("lr", "target", "label_smoothing")
        ),
    )


if __name__ == "__main__":
    main()
