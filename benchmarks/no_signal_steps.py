"""Skipping the optimizer step on a mini-batch with no signal (train.skip_no_signal_steps):
does learning stay, and does a collapsed run drift less?

    python benchmarks/no_signal_steps.py [--config examples/arithmetic/config.yaml]
        [--lr 3e-2] [--iterations 12]

Four `rlvr run`s of the config, side by side, each under a fresh run id with every checkpoint
kept and the health stop off (health.stop_after 0), so every iteration runs:

1. learning: the config as it is, skipping off (the baseline) and on. Held-out pass@1 of
   every evaluated checkpoint with its 95% CI; "within CI" means each side's value lies inside
   the other's interval.
2. drift: the config at `--lr` (a rate at which it collapses), skipping off and on. Over the
   iterations without signal (at least 95% of groups with equal rewards), the sum of
   train/ppo_kl (how far the updates moved the policy on its own samples) and the L2 distance
   between the weights at the first and at the last such iteration's checkpoints. The ratio
   on / off is the figure (goal: below 1; 0 means the policy did not move without evidence).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEEP_ALL = ("retention.enabled=false", "health.stop_after=0")


def rlvr_run(config: str, run_id: str, store: str, sets: list[str], log: Path) -> float:
    cmd = [sys.executable, "-m", "pipelines.cli", "run", config, "--run-id", run_id]
    for kv in (f"run.store={store}", *KEEP_ALL, *sets):
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - t0


def pass_at_1(run: Path) -> dict[int, tuple[float, float, float]]:
    out = {}
    for metrics in sorted(run.glob("evals/*/metrics.json")):
        m = json.loads(metrics.read_text())
        if "overall" in m:
            lo, hi = m["overall"]["pass@1_ci95"]
            out[int(metrics.parent.name)] = (m["overall"]["pass@1"], lo, hi)
    return out


def dead_iterations(run: Path) -> list[int]:
    import csv

    with open(run / "report" / "dynamics.csv") as f:
        rows = list(csv.DictReader(f))
    return [
        int(r["step"])
        for r in rows
        if r.get("verify/zero_signal_share") and float(r["verify/zero_signal_share"]) >= 0.95
    ]


def drift(run: Path, dead: list[int]) -> tuple[float, float]:
    """(sum of train/ppo_kl over the dead iterations, L2 distance of the weights from the
    checkpoint the first dead iteration sampled with to the one after the last)."""
    from safetensors.torch import load_file

    if not dead:
        return 0.0, 0.0
    kl = 0.0
    for i in dead:
        stats = json.loads((run / "checkpoints" / f"{i + 1:05d}" / "_SUCCESS").read_text())["stats"]
        kl += abs(stats.get("train/ppo_kl", 0.0))
    a = load_file(str(run / "checkpoints" / f"{dead[0]:05d}" / "model.safetensors"))
    b = load_file(str(run / "checkpoints" / f"{dead[-1] + 1:05d}" / "model.safetensors"))
    sq = sum(float((b[k].float() - a[k].float()).pow(2).sum()) for k in a)
    return kl, math.sqrt(sq)


def within(a: tuple, b: tuple) -> bool:
    return b[1] <= a[0] <= b[2] and a[1] <= b[0] <= a[2]


def main() -> int:
    from benchmarks.common import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--lr", default="3e-2", help="a learning rate at which the config collapses")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--store", default=str(ROOT / "rlvr-runs"))
    args = ap.parse_args()
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, Path] = {}
    for name, sets in {
        "learn-off": [],
        "learn-on": ["train.skip_no_signal_steps=true"],
        "collapse-off": [f"train.lr={args.lr}"],
        "collapse-on": [f"train.lr={args.lr}", "train.skip_no_signal_steps=true"],
    }.items():
        run_id = f"bench-nosignal-{name}-{stamp}"
        log = Path(args.store) / f"{run_id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        seconds = rlvr_run(
            args.config, run_id, args.store, [*sets, f"run.iterations={args.iterations}"], log
        )
        runs[name] = Path(args.store) / run_id
        print(f"{name}: {seconds:.0f} s ({runs[name]})")

    off, on = pass_at_1(runs["learn-off"]), pass_at_1(runs["learn-on"])
    print("\nlearning: held-out pass@1 [95% CI], skipping off vs on")
    ok = True
    for c in sorted(off):
        same = within(off[c], on[c])
        ok &= same
        print(
            f"  {c:05d}  off {off[c][0]:.3f} [{off[c][1]:.3f}, {off[c][2]:.3f}]"
            f"  on {on[c][0]:.3f} [{on[c][1]:.3f}, {on[c][2]:.3f}]  {'within CI' if same else 'APART'}"
        )
    print(f"  every checkpoint within CI: {ok}")

    print(f"\ndrift after collapse at lr {args.lr}: over the iterations without signal")
    figures = {}
    for side in ("off", "on"):
        run = runs[f"collapse-{side}"]
        dead = dead_iterations(run)
        figures[side] = drift(run, dead)
        final = pass_at_1(run)
        last = final[max(final)][0] if final else float("nan")
        print(
            f"  {side:3s}: {len(dead)} iterations without signal (from {dead[0] if dead else '-'}),"
            f" sum ppo_kl {figures[side][0]:.4f}, weight distance {figures[side][1]:.4f},"
            f" final pass@1 {last:.3f}"
        )
    for i, what in enumerate(("sum ppo_kl", "weight distance")):
        base = figures["off"][i]
        ratio = figures["on"][i] / base if base else float("nan")
        print(f"  ratio on/off, {what}: {ratio:.3f} (goal < 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
