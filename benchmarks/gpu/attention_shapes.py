"""The stage's decode on prompts of shapes not seen before, with each SDPA backend allowed.

    python benchmarks/gpu/attention_shapes.py BASE_DIR TRAIN_PARQUET [--rounds 4]

Each round samples 16 new prompts x 8 (the SmolLM2 example's iteration), so the attention's
key lengths are new each round, as in a run (every iteration's prompts differ); the same
prompts again give the repeat figure, as a benchmark with a warm-up measures. Settings: torch's
default choice of SDPA kernel (the backend's `attention_kernels` replaced by no restriction), and
the backend as it is, which leaves cuDNN's attention out on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.contention import SPEC, backend_and_requests, sync  # noqa: E402
from components.generate import hf_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("train")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    backend, reqs, device = backend_and_requests(
        args.base, args.train, 16 * (2 * args.rounds + 1), 8
    )
    backend.before_forward = None

    def one(rs) -> tuple[float, float]:
        sync(device)
        t = time.perf_counter()
        n = sum(len(s.response_token_ids) for b in backend.generate(rs, SPEC) for s in b)
        sync(device)
        dt = time.perf_counter() - t
        return n / dt, 1000 * dt / max(1, backend.clock.take().get("decode_steps", 1))

    one(reqs[-16:])  # CUDA start-up, on prompts used by neither setting
    as_built = hf_backend.attention_kernels
    settings = (
        ("torch's default", lambda device: contextlib.nullcontext()),
        ("as built", as_built),
    )
    for k, (name, kernels) in enumerate(settings):
        hf_backend.attention_kernels = kernels
        new = [
            one(reqs[16 * (k * args.rounds + r) : 16 * (k * args.rounds + r + 1)])
            for r in range(args.rounds)
        ]
        again = [one(reqs[16 * k * args.rounds : 16 * (k * args.rounds + 1)]) for _ in range(2)]
        print(
            f"{name}: new shapes tokens/s {[round(x) for x, _ in new]} ms/step {[round(y, 1) for _, y in new]}; "
            f"repeated {[round(x) for x, _ in again]} ms/step {[round(y, 1) for _, y in again]}"
        )


if __name__ == "__main__":
    main()
