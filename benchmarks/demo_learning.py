"""Does RL learn? Run the arithmetic demo end to end and print base vs final held-out pass@1.

    python benchmarks/demo_learning.py [--config examples/arithmetic/config.yaml] [--run-id ID]
    python benchmarks/demo_learning.py --config examples/smollm2/config.yaml --set run.seed=1

Runs `rlvr run` (the KFP pipeline on kfp.local) under a fresh run id, so nothing is resumed, and
times it. The baseline measured side by side in the same run is the base policy itself
(checkpoint 00000, evaluated by the same pipeline with the same sample seeds): the script prints
the gain in points and the final/base ratio, plus the wall time against the 15-minute goal.
Goal: gain >= 30 points within 15 minutes on 2 CPU cores. The SmolLM2 example: gain >= 15
points with the base's and the final checkpoint's 95% CIs apart, in two seeds, in about an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--run-id", default=f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--store", default=str(ROOT / "rlvr-runs"))
    ap.add_argument("--set", action="append", default=[], help="config override a.b=v")
    args = ap.parse_args()
    from benchmarks.common import cpu_model

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")

    # The timed region includes `prepare` when the example is not built yet (a one-off).
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        args.config,
        "--run-id",
        args.run_id,
        "--set",
        f"run.store={args.store}",
        *(a for kv in args.set for a in ("--set", kv)),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"demo failed with exit status {proc.returncode}", file=sys.stderr)
        return proc.returncode

    evals = Path(args.store) / args.run_id / "evals"
    done = sorted(int(p.name) for p in evals.iterdir() if (p / "_SUCCESS").exists())
    curve = []
    for c in done:
        m = json.loads((evals / f"{c:05d}" / "metrics.json").read_text())
        curve.append((c, m["overall"]["pass@1"], m["overall"].get("pass@1_ci95")))
    base, final = curve[0][1], curve[-1][1]
    print("\ncheckpoint  pass@1   95% CI")
    for c, p, ci in curve:
        ci_text = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        print(f"{c:05d}       {p:.3f}   {ci_text}")
    gain = 100 * (final - base)
    print(f"\nbase pass@1      {base:.3f}")
    print(f"final pass@1     {final:.3f}   (checkpoint {curve[-1][0]:05d})")
    print(f"gain             {gain:+.1f} points   (goal >= +30; the SmolLM2 example >= +15)")
    if curve[0][2] and curve[-1][2]:
        apart = curve[-1][2][0] > curve[0][2][1]
        print(
            f"95% CIs apart    {'yes' if apart else 'no'}   (final low {curve[-1][2][0]:.3f} vs "
            f"base high {curve[0][2][1]:.3f})"
        )
    print(f"final / base     {final / base:.2f}x" if base > 0 else "final / base     inf")
    print(f"wall time        {wall:.0f} s   ({wall / 900:.2f} of the 15-minute goal)")
    run = Path(args.store) / args.run_id
    print_handoff(run)
    print(f"report           {run / 'report' / 'report.md'}")
    return 0


def print_handoff(run: Path) -> None:
    """The policy handoff's share of an iteration (train's commit and generate's load) and
    what the run keeps in its store (goals: <= 2% and <= 3 GB for the SmolLM2 example on a
    CPU)."""
    from components.core.store import get_store
    from components.report.timeline import load_timeline, summary

    s = summary(load_timeline(get_store(str(run)), str(run)))
    size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    print(
        f"handoff          {s['handoff_s']:.2f} s of a {s['iteration_s']:.1f} s iteration = "
        f"{100 * s['handoff_share']:.1f}%"
    )
    print(f"run directory    {size / 1e9:.2f} GB")


if __name__ == "__main__":
    sys.exit(main())
