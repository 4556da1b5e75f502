"""Generate beside an evaluation on one device: alone, sharing it freely, and by turns.

    python benchmarks/gpu/contention.py BASE_DIR TRAIN_PARQUET EVAL_PARQUET [--rounds 3]

A local run puts its generate, train and evaluate workers on one GPU (or one CPU). This measures
what an evaluation sampling at the same time costs generate, in three settings side by side in
one invocation: generate alone; with an evaluation process sampling the held-out set over and
over beside it; and the same with turns (components/model/device_turn.py: generate holds the device
while it samples, the evaluation waits before each of its forwards). Generate samples one
iteration's shape (16 prompts x 8, the SmolLM2 example's settings) with the stage's backend.
Prints generate's tokens/s in each (the median of --rounds) and the ratios to alone, and how many
evaluation samples were drawn meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from components.generate.rollouts import render_prompt  # noqa: E402
from components.model import device_turn  # noqa: E402
from components.model.backends import PromptRequest, SamplingSpec  # noqa: E402
from components.model.checkpoint import device_and_dtype, load_policy  # noqa: E402
from components.model.hf_backend import TransformersBackend  # noqa: E402

SPEC = SamplingSpec(n=8, temperature=0.8, top_p=1.0, top_k=0, max_new_tokens=48)


def backend_and_requests(base: str, data: str, prompts: int, n: int):
    device, dtype = device_and_dtype("bfloat16" if torch.cuda.is_available() else "float32")
    model, tok = load_policy(Path(base), dtype=dtype, device=device)
    backend = TransformersBackend(model, tok, batch_size=128, device=device)
    rows = pq.read_table(data).to_pylist()[:prompts]
    reqs = [
        PromptRequest(str(k), render_prompt(tok, r["prompt"])[1], [1000 * k + j for j in range(n)])
        for k, r in enumerate(rows)
    ]
    return backend, reqs, device


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def evaluation(base: str, data: str, stop_file: str, count_file: str) -> None:
    """The evaluation beside generate: the held-out set, 4 samples each, until `stop_file`."""
    backend, reqs, device = backend_and_requests(base, data, 79, 4)
    spec = SamplingSpec(n=4, temperature=0.8, top_p=1.0, top_k=0, max_new_tokens=48)
    drawn = 0
    Path(count_file).write_text("ready")
    while not Path(stop_file).exists():
        for batch in backend.generate(reqs, spec):
            drawn += len(batch)
            if Path(stop_file).exists():
                break
    Path(count_file).write_text(str(drawn))


def rounds(backend, reqs, device: str, k: int, hold: bool) -> list[float]:
    out = []
    for _ in range(k):
        with device_turn.holding() if hold else _nothing():
            sync(device)
            t = time.perf_counter()
            n = sum(len(s.response_token_ids) for b in backend.generate(reqs, SPEC) for s in b)
            sync(device)
        out.append(n / (time.perf_counter() - t))
        time.sleep(0.05)  # the gap a run leaves between stages, where an evaluation goes on
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def beside(args, backend, reqs, device: str, turns: bool) -> tuple[list[float], int]:
    """Generate's rounds with an evaluation process sampling beside it."""
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-contention-"))
    stop, count, lock = tmp / "stop", tmp / "count", tmp / "turn"
    env = {**os.environ}
    env.pop(device_turn.TURN_ENV, None)
    if turns:
        env[device_turn.TURN_ENV] = f"yield:{lock}"
        os.environ[device_turn.TURN_ENV] = f"hold:{lock}"
    child = subprocess.Popen(
        [sys.executable, __file__, args.base, args.train, args.eval, "--evaluation", str(tmp)],
        env=env,
    )
    try:
        while not (count.exists() and count.read_text() == "ready"):
            if child.poll() is not None:
                raise SystemExit(f"the evaluation process ended ({child.returncode})")
            time.sleep(0.1)
        time.sleep(1.0)  # it is sampling
        got = rounds(backend, reqs, device, args.rounds, hold=turns)
    finally:
        stop.touch()
        child.wait(timeout=120)
        os.environ.pop(device_turn.TURN_ENV, None)
    return got, int(count.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("train")
    ap.add_argument("eval")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--evaluation", help=argparse.SUPPRESS)  # the child's scratch directory
    args = ap.parse_args()
    if args.evaluation:
        d = Path(args.evaluation)
        evaluation(args.base, args.eval, str(d / "stop"), str(d / "count"))
        return
    backend, reqs, device = backend_and_requests(args.base, args.train, 16, 8)
    backend.before_forward = None
    rounds(backend, reqs, device, 1, hold=False)  # warm-up
    alone = rounds(backend, reqs, device, args.rounds, hold=False)
    free, drawn_free = beside(args, backend, reqs, device, turns=False)
    turns, drawn_turns = beside(args, backend, reqs, device, turns=True)
    # alone again: rounds can speed up as a run goes on (caches, clocks), which favours the later
    # settings; the reference is the median of both measurements of alone
    alone += rounds(backend, reqs, device, args.rounds, hold=False)
    a = statistics.median(alone)
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    print(f"generate alone: {a:.0f} tokens/s {[round(x) for x in alone]}")
    for name, got, drawn in (("shared freely", free, drawn_free), ("by turns", turns, drawn_turns)):
        m = statistics.median(got)
        print(
            f"generate beside an evaluation, {name}: {m:.0f} tokens/s "
            f"{[round(x) for x in got]}, ratio to alone {m / a:.2f}; evaluation samples drawn "
            f"meanwhile {drawn}"
        )


if __name__ == "__main__":
    main()
