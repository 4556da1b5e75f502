"""How far generation is from batch-, shard- and thread-invariant, measured.

    python benchmarks/generate_invariance.py [--prompts 256] [--n 8] [--max-new-tokens 24]
                                             [--checkpoint DIR]

The same prompts and sample seeds are generated under several layouts, each in its own process
(so `ATEN_CPU_CAPABILITY` and thread counts take effect): the reference (batch 64 rows, the
machine's threads), one prompt group per batch, 256-row batches, 3 shards, 1 and 4 threads, and
torch's unvectorized kernels (`ATEN_CPU_CAPABILITY=default`, standing in for another CPU). Each
layout is compared with the reference, sample by sample:

- agreement: the share of samples whose token streams are identical (the ratio to the baseline);
- every divergence is checked to be a near-tie (`draw_margin` < 1e-5 at the first differing step,
  from teacher-forced reference logits), which is the contract in docs/contracts.md;
- the largest |logprob difference| on the common prefix.

The checkpoint defaults to a freshly built model of the demo's size (a near-uniform policy, the
hardest case for ties: ~100 CDF boundaries per draw); pass the demo's base with --checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.core.commit import shard_of  # noqa: E402
from components.model.backends import PromptRequest, SamplingSpec, sample_seed  # noqa: E402
from components.model.checkpoint import load_policy  # noqa: E402
from components.model.hf_backend import TransformersBackend  # noqa: E402
from components.model.token_sampling import draw_margin, sample_uniforms  # noqa: E402

NEAR_TIE = 1e-5
LAYOUTS = {
    "reference (batch 64)": {"batch_size": 64},
    "one group per batch": {"batch_size": 1},
    "batch 256": {"batch_size": 256},
    "3 shards": {"batch_size": 64, "shards": 3},
    "1 thread": {"batch_size": 64, "threads": 1},
    "4 threads": {"batch_size": 64, "threads": 4},
    "unvectorized kernels": {"batch_size": 64, "env": {"ATEN_CPU_CAPABILITY": "default"}},
}


def make_requests(tok, prompts: int, n: int) -> list[PromptRequest]:
    out = []
    for i in range(prompts):
        # Lengths vary (1- to 5-digit operands) so batches carry different left padding.
        a, b = (i * 7919) % 10 ** (1 + i % 5), (i * 104729) % 10 ** (1 + (i // 5) % 5)
        ids = tok(f"{a}{'+*-'[i % 3]}{b}=", add_special_tokens=False)["input_ids"]
        pid = f"p{i:05d}"
        out.append(PromptRequest(pid, ids, [sample_seed(0, 0, pid, j) for j in range(n)]))
    return out


def spec_of(args) -> SamplingSpec:
    return SamplingSpec(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
    )


def worker(args) -> None:
    """Generate under one layout and save {key: (tokens, logprobs)}."""
    layout = json.loads(args.worker)
    if "threads" in layout:
        torch.set_num_threads(layout["threads"])
    model, tok = load_policy(Path(args.checkpoint))
    reqs = make_requests(tok, args.prompts, args.n)
    backend = TransformersBackend(model, tok, batch_size=layout["batch_size"])
    shards = layout.get("shards", 1)
    out = {}
    for s in range(shards):
        part = [r for r in reqs if shard_of(r.prompt_id, shards) == s]
        for batch in backend.generate(part, spec_of(args)):
            for x in batch:
                out[(x.prompt_id, x.sample_index)] = (x.response_token_ids, x.response_logprobs)
    torch.save(out, args.out)


def compare(ref: dict, got: dict, model, prompts: dict, spec: SamplingSpec) -> dict:
    same, diverged, worst_margin, worst_lp = 0, 0, 0.0, 0.0
    for key, (ta, la) in ref.items():
        tb, lb = got[key]
        t = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        common = min(len(ta), len(tb)) if t is None else t
        diffs = [abs(x - y) for x, y in zip(la[:common], lb[:common], strict=True)]
        worst_lp = max([worst_lp, *diffs])
        if t is None and ta == tb:
            same += 1
            continue
        diverged += 1
        with torch.no_grad():
            logits = model(torch.tensor([prompts[key[0]] + ta[:t]])).logits[0, -1]
        u = sample_uniforms([sample_seed(0, 0, key[0], key[1])], t + 1)[0, t]
        worst_margin = max(worst_margin, draw_margin(logits, float(u), spec))
    return {
        "samples": len(ref),
        "agreement": same / len(ref),
        "diverged": diverged,
        "worst_margin": worst_margin,
        "max_logprob_diff": worst_lp,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

            tok = build_tokenizer()
            save_checkpoint(build_model(tok, seed=0), tok, Path(tmp, "policy"))
            args.checkpoint = str(Path(tmp, "policy"))
        results = {}
        for name, layout in LAYOUTS.items():
            out = Path(tmp, f"{len(results)}.pt")
            cmd = [sys.executable, __file__, "--worker", json.dumps(layout), "--out", str(out)]
            for flag in ("prompts", "n", "max_new_tokens", "temperature", "top_p", "top_k"):
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            cmd += ["--checkpoint", args.checkpoint]
            env = {**os.environ, **layout.get("env", {})}
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            results[name] = torch.load(out)
        model, tok = load_policy(Path(args.checkpoint))
        prompts = {r.prompt_id: r.prompt_token_ids for r in make_requests(tok, args.prompts, 1)}
        spec = spec_of(args)
        ref = results.pop("reference (batch 64)")
        draws = sum(len(t) for t, _ in ref.values())
        print(f"{len(ref)} samples, {draws} draws per layout; reference: batch 64 rows")
        print(
            f"{'layout':24s} {'agreement':>10s} {'diverged':>9s} {'worst margin':>13s} "
            f"{'max |dlogp|':>12s}"
        )
        ok = True
        for name, got in results.items():
            r = compare(ref, got, model, prompts, spec)
            ok &= r["worst_margin"] < NEAR_TIE
            print(
                f"{name:24s} {r['agreement']:10.5f} {r['diverged']:9d} "
                f"{r['worst_margin']:13.2e} {r['max_logprob_diff']:12.2e}"
            )
        print("every divergence a near-tie (margin < 1e-5):", "yes" if ok else "NO")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
