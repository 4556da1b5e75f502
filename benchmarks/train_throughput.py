"""Train throughput and memory, against baselines measured side by side in this run.

    python benchmarks/train_throughput.py [--rollouts 256] [--hidden 256] [--layers 4]
    python benchmarks/train_throughput.py --model examples/smollm2/.build/base --rollouts 64 \
        --micro-tokens 4096 --rounds 2

1. Throughput: training tokens/s (real prompt+response tokens, padding counted against us) of
   the train stage's update path (DeepSpeed engine, token-budget micro-batches, PPO-clip,
   token-mean with global normalizers) against a bare PyTorch loop on the same model and the same
   rollouts: fixed-size micro-batches in arrival order, forward + backward + AdamW. Goal >= 0.85.
   Rounds alternate so machine noise hits both alike; medians are reported.
2. Padding waste of the stage's micro-batch plan vs the bare loop's.
3. Memory: peak RSS of one iteration (subprocess) with N and 4N rollouts at the same mini-batch
   size: it must not grow with the rollout count beyond one mini-batch.
   With `--model` (a real checkpoint) instead: where one iteration's memory goes, as measured
   (peak RSS of the stage's iteration in a subprocess) against its floor: weights, gradients
   and Adam's two moments (16 bytes a parameter in fp32) plus one micro-batch's activations
   (the bytes autograd saves for backward, counted by a saved-tensors hook). Goal: within 2x.
4. MFU when a GPU is present (goal >= 40% on a 0.5B-1.5B model); not measured on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.core.config import TrainSection  # noqa: E402
from components.train import stage as train  # noqa: E402
from components.train import update  # noqa: E402
from components.train.batching import Rollouts, collate  # noqa: E402
from examples.arithmetic.model import build_model, build_tokenizer  # noqa: E402


def synthetic_rollouts(n: int, vocab: int, seed: int = 0, group: int = 8) -> Rollouts:
    rng = np.random.default_rng(seed)
    prompts, responses, lps = [], [], []
    for i in range(n):
        if i % group == 0:
            p = rng.integers(3, vocab, size=int(rng.integers(8, 40))).tolist()
        prompts.append(p)
        r = rng.integers(3, vocab, size=int(rng.integers(4, 96))).tolist()
        responses.append(r)
        lps.append([-1.0] * len(r))
    return Rollouts(
        prompt_ids=[f"p{i // group}" for i in range(n)],
        prompt_tokens=prompts,
        response_tokens=responses,
        rollout_logprobs=lps,
        rewards=rng.integers(0, 2, size=n).astype(np.float64),
        truncated=np.zeros(n, dtype=bool),
    )


def load_model(args, tok):
    """A fresh policy: the checkpoint of `--model`, else a tiny Qwen2 (seed 0)."""
    if args.model:
        from components.model.checkpoint import load_policy

        return load_policy(args.model)[0]
    torch.manual_seed(0)
    return build_model(tok, hidden_size=args.hidden, num_layers=args.layers, num_heads=4)


def saved_activation_bytes(model, ro: Rollouts, budget: int, pad_id: int) -> int:
    """Bytes autograd keeps for backward over the largest micro-batch of the stage's plan
    (its forward through update.sequence_logprobs, as the stage runs it)."""
    from components.train.batching import plan_micro_batches

    plan = plan_micro_batches(ro.lengths(), list(range(len(ro))), budget)
    rows = max(plan, key=lambda r: sum(ro.lengths()[i] for i in r))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = update.sequence_logprobs(model, collate(ro, rows, pad_id), 1.0, "cpu", True)
    del lp
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def stage_round(engine, ro: Rollouts, t: TrainSection, pad_id: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    _, m = update.train_iteration(
        update.Trainer(engine, "cpu", pad_id),
        update.IterationWork(
            ro, 0, temperature=1.0, horizon=96, start_step=0, total_steps=10**6, seed=0
        ),
        t,
    )
    return sum(ro.lengths()) * t.ppo_epochs / (time.perf_counter() - t0), m["train/padding_waste"]


def bare_round(model, opt, ro: Rollouts, rows_per_micro: int, mini_batches: int, pad_id: int):
    """Plain PyTorch: old-logprob pass, then per mini-batch fixed-size micro-batches, AdamW."""
    t0 = time.perf_counter()
    n = len(ro)
    real = padded = 0
    with torch.no_grad():
        for s in range(0, n, rows_per_micro):
            mb = collate(ro, list(range(s, min(n, s + rows_per_micro))), pad_id)
            model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
    for mini in np.array_split(np.arange(n), mini_batches):
        opt.zero_grad()
        for s in range(0, len(mini), rows_per_micro):
            rows = [int(r) for r in mini[s : s + rows_per_micro]]
            mb = collate(ro, rows, pad_id)
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            idx = mb.response_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
            lp = torch.log_softmax(logits.gather(1, idx).float(), -1)
            lp = lp.gather(-1, mb.response_tokens.unsqueeze(-1)).squeeze(-1)
            adv = torch.tensor(ro.rewards[rows], dtype=torch.float32).unsqueeze(1) - 0.5
            loss = -(lp * adv * mb.response_mask).sum() / mb.response_mask.sum()
            loss.backward()
            real += mb.real_tokens
            padded += mb.padded_tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return sum(ro.lengths()) / (time.perf_counter() - t0), 1 - real / padded


def peak_rss_mb(
    n: int, mini_rows: int, hidden: int, layers: int, model_dir=None, micro_tokens: int = 2048
) -> float:
    load = (
        f"from components.model.checkpoint import load_policy\n"
        f"model, tok = load_policy({str(model_dir)!r})"
        if model_dir
        else f"tok = build_tokenizer(); model = build_model(tok, hidden_size={hidden}, "
        f"num_layers={layers}, num_heads=4)"
    )
    code = f"""
import resource, sys, torch
sys.path.insert(0, {str(ROOT)!r})
import deepspeed
from benchmarks.train_throughput import synthetic_rollouts
from components.core.config import TrainSection
from components.train import update
from components.train import stage as train
from examples.arithmetic.model import build_model, build_tokenizer
{load}
t = TrainSection(lr=1e-5, mini_batches={max(1, n // mini_rows)}, micro_batch_tokens={micro_tokens})
train.init_distributed("cpu")
engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                  config=train.deepspeed_config(t, 1, torch.float32))
ro = synthetic_rollouts({n}, len(tok))
update.train_iteration(update.Trainer(engine, "cpu", tok.pad_token_id),
                       update.IterationWork(ro, 0, temperature=1.0, horizon=96, start_step=0,
                                            total_steps=10, seed=0), t)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
    rendezvous = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}  # its own process group
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import deepspeed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mini-batches", type=int, default=2)
    ap.add_argument("--micro-tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None, help="an HF checkpoint directory")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    from benchmarks.common import cpu_model

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}")
    if args.model:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
    else:
        tok = build_tokenizer()
    ro = synthetic_rollouts(args.rollouts, len(tok))
    peak = None
    if args.model:  # first, while this process holds no model: two at once need 2x the memory
        peak = peak_rss_mb(
            args.rollouts,
            max(1, args.rollouts // args.mini_batches),
            0,
            0,
            args.model,
            args.micro_tokens,
        )
    mean_len = float(np.mean(ro.lengths()))
    rows_per_micro = max(1, int(args.micro_tokens // max(ro.lengths())))  # the same memory bound
    t = TrainSection(lr=1e-5, mini_batches=args.mini_batches, micro_batch_tokens=args.micro_tokens)
    model = load_model(args, tok)
    bare_model = load_model(args, tok)
    bare_model.load_state_dict(model.state_dict())
    activations = saved_activation_bytes(bare_model, ro, args.micro_tokens, tok.pad_token_id)
    params = sum(p.numel() for p in model.parameters())
    train.init_distributed("cpu")
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=list(model.parameters()),
        config=train.deepspeed_config(t, 1, torch.float32),
    )
    opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-5)
    print(
        f"model: {type(model).__name__} {params / 1e6:.2f}M params, vocab {len(tok)}; {args.rollouts} rollouts, mean length "
        f"{mean_len:.0f} tokens; {args.mini_batches} mini-batches; micro-batch budget "
        f"{args.micro_tokens} tokens (bare: {rows_per_micro} rows)"
    )
    stage_rates, bare_rates, stage_waste, bare_waste = [], [], [], []
    for r in range(args.rounds):

        def stage_side():
            rate, waste = stage_round(engine, ro, t, tok.pad_token_id)
            stage_rates.append(rate)
            stage_waste.append(waste)

        def bare_side():
            rate_b, waste_b = bare_round(
                bare_model, opt, ro, rows_per_micro, args.mini_batches, tok.pad_token_id
            )
            bare_rates.append(rate_b)
            bare_waste.append(waste_b)

        for side in (stage_side, bare_side) if r % 2 == 0 else (bare_side, stage_side):
            side()  # alternate who goes first
        rate, rate_b = stage_rates[-1], bare_rates[-1]
        print(f"  round {r}: stage {rate:,.0f} tok/s   bare {rate_b:,.0f} tok/s")
    s, b = statistics.median(stage_rates), statistics.median(bare_rates)
    print(
        f"\nthroughput   stage {s:,.0f} tok/s   bare PyTorch {b:,.0f} tok/s   stage/bare = {s / b:.2f}"
        "   (goal >= 0.85)"
    )
    print(
        f"padding      stage {100 * stage_waste[0]:.1f}% of computed tokens   "
        f"bare (arrival order) {100 * bare_waste[0]:.1f}%"
    )

    if peak is not None:
        floor = (16 * params + activations) / 2**20
        print(
            f"memory       peak RSS of one iteration {peak:,.0f} MB; floor {floor:,.0f} MB = "
            f"weights+grads+Adam {16 * params / 2**20:,.0f} MB + one micro-batch's saved "
            f"activations {activations / 2**20:,.0f} MB   peak/floor = {peak / floor:.2f}   "
            "(goal <= 2)"
        )
        print(json.dumps({"stage_over_bare": s / b, "peak_rss_mb": peak, "floor_mb": floor}))
        return
    mini_rows = max(1, args.rollouts // 4 // args.mini_batches)
    small = peak_rss_mb(args.rollouts // 4, mini_rows, args.hidden, args.layers)
    large = peak_rss_mb(args.rollouts, mini_rows, args.hidden, args.layers)
    print(
        f"peak RSS     {args.rollouts // 4} rollouts {small:,.0f} MB   {args.rollouts} rollouts "
        f"{large:,.0f} MB   ratio = {large / small:.2f}   (same mini-batch size: goal ~1.0)"
    )
    if torch.cuda.is_available():
        print("GPU present: run with a 0.5B-1.5B model for MFU")
    else:
        print("MFU: no GPU here; not measured")
    print(
        json.dumps(
            {"stage_over_bare": s / b, "padding_waste": stage_waste[0], "rss_ratio": large / small}
        )
    )


if __name__ == "__main__":
    main()
