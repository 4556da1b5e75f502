"""Prepare the tool-use demo: 3-digit products in verl's Parquet format and a tiny policy warmed
on a mix of traces, all offline and deterministic in ``--seed``.

The warm-up (teacher forcing, no label smoothing) shows a ``--tool-share`` of problems solved
with the `python` tool (the call, the tool's output as the generate stage renders it, not
trained on, then ``\\boxed{...}``) and the rest answered directly with the right product, which
the model cannot compute. The base policy therefore calls the tool now and then and, when it
does, usually copies the numbers right: RL has something to find. Every ``--eval-every`` steps
the policy samples dev trajectories through rlvr's own multi-turn loop with the real tool
(temperature 1.0); warming stops at the first check whose pass@1 reaches ``--target``.

    python -m examples.tool_arithmetic.prepare --out /tmp/tool-arith
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from components.generate.multiturn import observation_encoder
from examples.arithmetic.model import build_model, count_parameters, save_checkpoint
from examples.arithmetic.prepare import already_prepared, chat_prompt, publish_demo
from examples.prepare_cli import prepare_main
from examples.tool_arithmetic.task import (
    MAX_POSITIONS,
    build_tokenizer,
    grade,
    make_splits,
    trace_ids,
    write_table,
)


@dataclass
class ToolWarmup:
    seed: int = 0
    n_train: int = 20000
    n_eval: int = 500
    n_dev: int = 200
    tool_share: float = 0.2
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    lr: float = 3e-3
    batch_size: int = 64
    max_steps: int = 3000
    eval_every: int = 250
    target: float = 0.12
    max_turns: int = 2
    max_new_tokens: int = 64


def encode(tokenizer, problems, tool_share: float, seed: int):
    """Right-padded ids, attention mask and labels (observation and prompt masked) of the
    warm-up traces; which problems get a tool trace is drawn with `seed`."""
    rng = random.Random(seed)
    observe = observation_encoder(tokenizer)
    rows = []
    for p in problems:
        prompt = tokenizer.encode(chat_prompt(tokenizer, p), add_special_tokens=False)
        ids, trained = trace_ids(tokenizer, observe, p, tool=rng.random() < tool_share)
        rows.append((prompt + ids, [0] * len(prompt) + trained))
    width = max(len(ids) for ids, _ in rows)
    if width > MAX_POSITIONS:
        raise ValueError(f"a warm-up trace has {width} tokens, more than {MAX_POSITIONS}")
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, trained) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        keep = torch.tensor(trained, dtype=torch.bool)
        labels[i, : len(row)] = torch.where(keep, torch.tensor(row), torch.tensor(-100))
    return ids, mask, labels


@torch.no_grad()
def dev_check(model, tokenizer, problems, cfg: ToolWarmup, seed: int) -> dict[str, float]:
    """Pass@1 and tool-call rate of sampled dev trajectories (temperature 1.0, the real python
    tool, rlvr's multi-turn loop on the in-memory model): what the generate stage would see."""
    from components.generate.multiturn import generate_multi_turn
    from components.generate.tools import load_tools
    from components.model.backends import PromptRequest, SamplingSpec, sample_seed
    from components.model.hf_backend import TransformersBackend

    model.eval()
    backend = TransformersBackend(model, tokenizer, batch_size=len(problems))
    requests = [
        PromptRequest(
            str(i),
            tokenizer.encode(chat_prompt(tokenizer, p), add_special_tokens=False),
            [sample_seed(seed, 0, str(i), 0)],
        )
        for i, p in enumerate(problems)
    ]
    spec = SamplingSpec(
        n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=cfg.max_new_tokens, seed=seed
    )
    tools = load_tools(["python"])
    try:
        trajs = generate_multi_turn(
            backend,
            requests,
            spec,
            tools,
            observation_encoder(tokenizer),
            max_turns=cfg.max_turns,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            max_response_tokens=MAX_POSITIONS - 16,
        )
    finally:
        tools.close()
    model.train()
    scores = grade([t.response for t in trajs], problems)
    called = [t.tool_calls > 0 for t in trajs]
    hits = [s for s, c in zip(scores, called, strict=True) if c]
    return {
        "pass@1": sum(scores) / len(scores),
        "tool_call_rate": sum(called) / len(called),
        "pass@1_when_called": sum(hits) / len(hits) if hits else 0.0,
    }


def warm_up(model, tokenizer, train, dev, cfg: ToolWarmup) -> list[dict]:
    ids, mask, labels = encode(tokenizer, train, cfg.tool_share, cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    curve: list[dict] = []
    model.train()
    bar = tqdm(total=cfg.max_steps, desc="warm-up", unit="step")
    for step in range(1, cfg.max_steps + 1):
        idx = torch.tensor(rng.sample(range(len(train)), cfg.batch_size))
        width = int(mask[idx].sum(1).max())
        logits = model(input_ids=ids[idx, :width], attention_mask=mask[idx, :width]).logits
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]),
            labels[idx, 1:width].reshape(-1),
            ignore_index=-100,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.update()
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            check = dev_check(model, tokenizer, dev, cfg, seed=cfg.seed * 100_003 + step)
            curve.append({"step": step, "loss": round(loss.item(), 4), **check})
            bar.set_postfix(loss=f"{loss.item():.3f}", **{k: f"{v:.2f}" for k, v in check.items()})
            if check["pass@1"] >= cfg.target:
                bar.total = step  # the bar ends full where the stop rule fired
                bar.refresh()
                break
    bar.close()
    return curve


def prepare(out: Path, cfg: ToolWarmup) -> Path:
    out = Path(out)
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
        max_positions=MAX_POSITIONS,
        seed=cfg.seed,
    )
    print(f"policy: Qwen2, {count_parameters(model):,} parameters, vocab {len(tokenizer)}")
    curve = warm_up(model, tokenizer, splits["train"], splits["dev"], cfg)
    last = curve[-1]
    print(
        f"warm-up stopped at step {last['step']}: dev pass@1 {last['pass@1']:.3f}, tool-call "
        f"rate {last['tool_call_rate']:.3f}, pass@1 when called {last['pass@1_when_called']:.3f}"
    )
    summary = {
        "config": asdict(cfg),
        "parameters": count_parameters(model),
        "curve": curve,
        "seconds": round(time.time() - started, 1),
    }

    return publish_demo(
        out,
        splits,
        write_table,
        lambda base: save_checkpoint(model, tokenizer, base),
        summary,
        started,
    )


def main(argv: Sequence[str] | None = None) -> None:
    prepare_main(prepare, ToolWarmup(), description=__doc__.splitlines()[0], argv=argv, threads=2)


if __name__ == "__main__":
    main()
