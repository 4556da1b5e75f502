"""Throughput benchmark for the math verifier (a script, not a test).

Builds a deterministic, realistic mix of verifications (mostly simple numeric answers at
the end of a few hundred words of reasoning, some fractions / LaTeX / tuples, some exact
repeats) and prints:

* verifications/s of ``components.verify.math.compute_score`` in one process, and of
  ``math_verify`` (``parse`` + ``verify``) in one process when it is installed, with
  their ratio (goal: >= 20x);
* verifications/s of ``components.verify.executor.score_batch`` with 1 and with 2 worker
  processes (best of 5 interleaved runs), with their ratio (goal: >= 1.8x), next to the
  machine's own ceiling: the same ratio for two plain busy-loop processes measured at the
  same time. On a 2-core or busy machine that ceiling is well below 2 and the executor
  cannot beat it; the parent process also needs some CPU.

Usage: ``python benchmarks/verify_throughput.py [--n 20000] [--mv-n 1000]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.verify import math as mverify  # noqa: E402
from components.verify.executor import ScoreItem, score_batch  # noqa: E402

_FILLER = (
    "First we write down what is given in the problem. Then we set up the equation "
    "carefully, simplify both sides, and check the arithmetic step by step. "
)

# (ground truth, equivalent response forms, a wrong form)
_LATEX_CASES = [
    ("\\frac{3}{4}", ["\\frac{3}{4}", "\\dfrac{3}{4}", "0.75", "3/4"], "\\frac{4}{3}"),
    ("\\frac{1}{2}", ["\\frac12", "0.5", "\\frac{2}{4}"], "\\frac{1}{3}"),
    ("2\\sqrt{2}", ["2\\sqrt{2}", "\\sqrt{8}"], "\\sqrt{2}"),
    ("\\frac{\\pi}{3}", ["\\frac{\\pi}{3}", "\\pi/3"], "\\frac{\\pi}{6}"),
    ("(1, 2)", ["(1,2)", "\\left(1, 2\\right)"], "(2,1)"),
    ("[0, 1)", ["[0,1)"], "[0,1]"),
    ("12\\%", ["12\\%", "12"], "1.2"),
    ("x^2+2x+1", ["(x+1)^2", "x^2+2x+1"], "(x-1)^2"),
    ("5 \\text{ cm}", ["5", "5\\text{ cm}"], "6"),
]


def build_mix(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Return ``n`` (response, ground_truth) pairs."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.15 and out:
            out.append(out[rng.randrange(len(out))])  # exact repeat
            continue
        body = _FILLER * rng.randint(2, 6)
        if r < 0.80:
            value = rng.randint(0, 5000) if rng.random() < 0.8 else round(rng.uniform(0, 100), 2)
            gt = str(value)
            ans = gt if rng.random() < 0.75 else str(value + rng.choice([1, -1, 10]))
            if rng.random() < 0.3:
                response = f"{body}\n#### {ans}"
            else:
                response = f"{body}\nTherefore the answer is $\\boxed{{{ans}}}$."
        else:
            gt, forms, wrong = _LATEX_CASES[rng.randrange(len(_LATEX_CASES))]
            ans = rng.choice(forms) if rng.random() < 0.75 else wrong
            response = f"{body}\nSo we get $\\boxed{{{ans}}}$."
        out.append((response, gt))
    return out


def bench_ours(mix: list[tuple[str, str]]) -> float:
    mverify.warm_up()
    mverify.clear_caches()
    t0 = time.perf_counter()
    for response, gt in mix:
        mverify.compute_score(response, gt)
    return len(mix) / (time.perf_counter() - t0)


def bench_math_verify(mix: list[tuple[str, str]]) -> float | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    verify(parse("$1$"), parse("\\boxed{1}"))  # warm up imports
    t0 = time.perf_counter()
    for response, gt in mix:
        verify(parse(f"${gt}$"), parse(response))
    return len(mix) / (time.perf_counter() - t0)


def bench_executor(mix: list[tuple[str, str]], rounds: int = 5) -> tuple[float, float]:
    """Best-of-``rounds`` throughput with 1 and with 2 workers, runs interleaved so that
    both see the same background load."""
    items = [ScoreItem("math", "bench", response, gt) for response, gt in mix]
    best = {1: 0.0, 2: 0.0}
    for _ in range(rounds):
        for workers in (1, 2):
            mverify.clear_caches()
            t0 = time.perf_counter()
            score_batch(items, num_workers=workers, timeout_s=10.0)
            best[workers] = max(best[workers], len(items) / (time.perf_counter() - t0))
    return best[1], best[2]


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def machine_scaling(n: int = 3_000_000, rounds: int = 3) -> float:
    """Throughput ratio of 2 vs 1 concurrent CPU-bound processes on this machine right
    now: the ceiling for the executor's 2-vs-1 ratio (below 2 on a loaded or small box)."""
    best = {1: 0.0, 2: 0.0}
    ctx = multiprocessing.get_context()
    for _ in range(rounds):
        for procs in (1, 2):
            workers = [ctx.Process(target=_spin, args=(n,)) for _ in range(procs)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best[procs] = max(best[procs], procs / (time.perf_counter() - t0))
    return best[2] / best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="verifications per run")
    parser.add_argument("--mv-n", type=int, default=1000, help="verifications for math_verify")
    args = parser.parse_args()

    mix = build_mix(args.n)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"mix: {len(mix)} verifications, cpu cores: {os.cpu_count()}, load average: {load}")
    ours = bench_ours(mix)
    print(f"this verifier, 1 process:   {ours:12.0f} verifications/s")
    mv = bench_math_verify(mix[: args.mv_n])
    if mv is None:
        print("math_verify:                not installed (pip install -e '.[bench]'), skipped")
    else:
        print(f"math_verify, 1 process:     {mv:12.0f} verifications/s")
        print(f"ratio this / math_verify:   {ours / mv:12.1f}x   (goal >= 20x)")
    one, two = bench_executor(mix)
    print(f"executor, 1 worker:         {one:12.0f} verifications/s")
    print(f"executor, 2 workers:        {two:12.0f} verifications/s")
    print(f"ratio 2 / 1 workers:        {two / one:12.2f}x   (goal >= 1.8x)")
    print(f"machine ceiling (2 vs 1 busy processes, same moment): {machine_scaling():.2f}x")


if __name__ == "__main__":
    main()
