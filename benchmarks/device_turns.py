"""Evaluation by turns (components/model/device_turn.py) against evaluation beside the loop,
side by side: the same run twice, with RLVR_DEVICE_TURN=off and with the default.

    python benchmarks/device_turns.py [--config examples/arithmetic/config.yaml] [--set k=v]

Prints each run's wall time and their ratio; generate's tokens/s in the iterations an evaluation
overlapped in the run without turns, against the same iterations with turns (medians); and
whether both runs ended on the same checkpoint, byte for byte (turns must change when things
run, never what is computed). Goal: the ratio of wall times <= 1.0, generate's tokens/s in
those iterations >= 2x, the same final checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_model, stage_overlaps  # noqa: E402
from components.core.commit import read_manifest  # noqa: E402
from components.core.store import get_store, join  # noqa: E402
from components.model.device_turn import TURN_ENV  # noqa: E402
from components.report.timeline import load_timeline  # noqa: E402


def run(config: str, store: str, run_id: str, sets: list[str], turns: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != TURN_ENV}
    if not turns:
        env[TURN_ENV] = "off"
    cmd = [sys.executable, "-m", "pipelines.cli", "run", config, "--run-id", run_id]
    cmd += ["--set", f"run.store={store}", *(a for kv in sets for a in ("--set", kv))]
    log = Path(store) / f"{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with log.open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    return time.perf_counter() - t


def generate_rates(root: str) -> dict[int, float]:
    store = get_store(root)
    out = {}
    for i in stage_overlaps(load_timeline(store, root)):
        out[i] = read_manifest(store, join(root, "iterations", f"{i:05d}", "rollouts"))["stats"][
            "tokens_per_s"
        ]
    return out


def last_checkpoint_digest(root: str) -> str:
    ckpts = sorted(Path(root, "checkpoints").iterdir())
    h = hashlib.sha256()
    for f in sorted(ckpts[-1].glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--store", default=str(ROOT / "rlvr-runs"))
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")
    runs = {}
    for name, turns in (("beside", False), ("turns", True)):
        run_id = f"turns-{name}-{stamp}"
        wall = run(args.config, args.store, run_id, args.set, turns)
        root = str(Path(args.store) / run_id)
        runs[name] = (wall, root)
        print(f"{name}: {wall:.1f} s wall ({root})")
    (wall_b, root_b), (wall_t, root_t) = runs["beside"], runs["turns"]
    overlapped = [
        i
        for i, r in stage_overlaps(load_timeline(get_store(root_b), root_b)).items()
        if r["evaluate_overlap_s"] > 0
    ]
    rb, rt = generate_rates(root_b), generate_rates(root_t)
    print(f"wall time, turns / beside: {wall_t / wall_b:.2f}")
    if overlapped:
        b = statistics.median(rb[i] for i in overlapped)
        t = statistics.median(rt[i] for i in overlapped)
        print(
            f"generate tokens/s in the {len(overlapped)} iterations an evaluation overlapped "
            f"({overlapped}): beside {b:.0f}, by turns {t:.0f}, ratio {t / b:.2f}"
        )
        others = [i for i in rb if i not in overlapped]
        if others:
            print(
                "the other iterations: beside "
                f"{statistics.median(rb[i] for i in others):.0f}, by turns "
                f"{statistics.median(rt[i] for i in others):.0f}"
            )
    same = last_checkpoint_digest(root_b) == last_checkpoint_digest(root_t)
    print(f"the same final checkpoint, byte for byte: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
