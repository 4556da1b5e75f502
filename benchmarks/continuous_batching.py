"""Continuous against static batching in the transformers backend, side by side in this run.

    python benchmarks/continuous_batching.py [--prompts 48] [--n 8] [--batch-size 64]
        [--max-new-tokens 96] [--stop-every 24] [--rounds 3] [--model DIR]

Static batching decodes each batch until its longest sample ends, so a batch's short samples
idle on its tail; continuous batching gives a finished row's room to the next prompt
(components/model/batching.py). The sampling is the same (one seed per sample): the samples
must agree up to rounding, and the benchmark counts those whose tokens are identical.

Response lengths in RL are long-tailed. The default model is the demo's architecture, freshly
initialised (built offline; `--hidden`, `--layers`), whose draws are near uniform: with
`--stop-every k` every k-th token id ends a response, so lengths are geometric with mean about
k, cut at max_new_tokens: a few tokens to the cap, as a reasoning model's spread. `--model`
takes any checkpoint (examples/smollm2/.build/base) with its own lengths (`--stop-every 0`).

Prints, per side, the median wall seconds, samples/s and response tokens/s over alternating
rounds, and the decode steps (forwards); then continuous / static throughput.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_model  # noqa: E402
from components.model.backends import PromptRequest, SamplingSpec, sample_seed  # noqa: E402
from components.model.checkpoint import load_policy  # noqa: E402
from components.model.hf_backend import TransformersBackend  # noqa: E402
from examples.arithmetic.model import build_model, build_tokenizer  # noqa: E402


def requests(tok, prompts: int, n: int) -> list[PromptRequest]:
    out = []
    for i in range(prompts):
        ids = tok(f"{i}+{i * 7 % 97}=", add_special_tokens=False)["input_ids"]
        seeds = [sample_seed(0, 0, f"p{i}", j) for j in range(n)]
        out.append(PromptRequest(f"p{i}", ids, seeds))
    return out


def run(backend: TransformersBackend, reqs, spec) -> tuple[float, dict, dict]:
    backend.clock.take()
    t0 = time.perf_counter()
    samples = {(s.prompt_id, s.sample_index): s for b in backend.generate(reqs, spec) for s in b}
    return time.perf_counter() - t0, samples, backend.clock.take()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--stop-every", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.model is not None:
        model, tok = load_policy(a.model)
        model_name = str(a.model)
    else:
        tok = build_tokenizer()
        model = build_model(tok, hidden_size=a.hidden, num_layers=a.layers, num_heads=4).eval()
        model_name = f"fresh Qwen2 {a.hidden}x{a.layers} (examples/arithmetic's tokenizer)"
    stops = tuple(range(0, len(tok), a.stop_every)) if a.stop_every else ()
    spec = SamplingSpec(
        n=a.n,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=a.max_new_tokens,
        stop_token_ids=stops,
    )
    reqs = requests(tok, a.prompts, a.n)
    sides = {
        "static": TransformersBackend(model, tok, batch_size=a.batch_size),
        "continuous": TransformersBackend(model, tok, batch_size=a.batch_size, continuous=True),
    }
    for b in sides.values():
        b.warm_up()
    walls: dict[str, list[float]] = {k: [] for k in sides}
    out: dict[str, tuple[dict, dict]] = {}
    for r in range(a.rounds):  # alternate the order, so drift hits both sides alike
        for name in sides if r % 2 == 0 else reversed(list(sides)):
            wall, samples, phases = run(sides[name], reqs, spec)
            walls[name].append(wall)
            out[name] = (samples, phases)
    print(
        f"machine: {cpu_model()}, torch threads {torch.get_num_threads()}; model {model_name}, "
        f"{a.prompts} prompts x n={a.n}, batch_size {a.batch_size}, "
        f"max_new_tokens {a.max_new_tokens}, stop every {a.stop_every or '-'} token ids"
    )
    lengths = sorted(len(s.response_token_ids) for s in out["static"][0].values())
    q = statistics.quantiles(lengths, n=10)
    print(
        f"response lengths: median {statistics.median(lengths):.0f}, p90 {q[-1]:.0f}, "
        f"max {lengths[-1]}"
    )
    for name in sides:
        samples, phases = out[name]
        wall = statistics.median(walls[name])
        tokens = sum(len(s.response_token_ids) for s in samples.values())
        print(
            f"{name:>10}: {wall:6.2f} s (median of {', '.join(f'{w:.2f}' for w in walls[name])})"
            f"  {len(samples) / wall:7.1f} samples/s  {tokens / wall:8.0f} tokens/s"
            f"  {phases['decode_steps']} decode steps"
        )
    ref, got = out["static"][0], out["continuous"][0]
    same = sum(ref[k].response_token_ids == got[k].response_token_ids for k in ref)
    ratio = statistics.median(walls["static"]) / statistics.median(walls["continuous"])
    print(f"identical token streams: {same}/{len(ref)} (the rest diverge at a near-tie)")
    print(f"continuous / static throughput: {ratio:.2f}x")


if __name__ == "__main__":
    main()
