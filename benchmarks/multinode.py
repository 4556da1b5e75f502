"""Multi-node training off a cluster: does a run whose train step spans two nodes (train.nodes=2,
one rank each, two torchrun agents over a loopback rendezvous, what the pods of a TrainJob run)
train what one node of two ranks trains, and what does the second node cost?

    python benchmarks/multinode.py [--config examples/arithmetic/config.yaml] [--iterations 6]
                                   [--zero 3] [--reverse]

Three whole `rlvr run` processes of the demo, without evaluation, side by side in one
invocation: `1x1` (one node, one rank: the default), `1x2` (one node, two ranks: the baseline,
the same world size as the multi-node side) and `2x1` (two nodes of one rank). Afterwards the
first and last checkpoints of each run are scored by rlvr's evaluator with the same sample seeds
(untimed). Printed per side: wall time and its ratio to 1x2, the train stage's work per
iteration (from the run's timeline); the final checkpoints of 2x1 and 1x2 compared (relative L2
distance of the weights and of the whole run's update, and the largest element-wise difference);
whether every iteration's rollouts are identical; and held-out pass@1 with its 95% CI.

On this 2-core machine both two-rank sides run their ranks on one core each, so the ratio
measures the launcher's overhead (a second agent, the TCP rendezvous, gloo over loopback instead
of within one process group on one host), not an interconnect.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_setup, ci, evaluate_run, timed  # noqa: E402

SIDES = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}  # name: (nodes, ranks per node)
BASELINE, MULTI = "1x2", "2x1"


def rel(a, b) -> float:
    """|a - b| / |b| over the flattened tensors of two state dicts (b the reference)."""
    import torch

    va = torch.cat([a[k].double().flatten() for k in sorted(b)])
    vb = torch.cat([b[k].double().flatten() for k in sorted(b)])
    return float((va - vb).norm() / vb.norm())


def same_rollouts(cfg, names: tuple[str, str]) -> list[bool]:
    """Per iteration: whether both runs sampled exactly the same responses."""
    import pyarrow.parquet as pq

    from components.core.layout import RunLayout

    out = []
    for i in range(cfg.run.iterations):
        tables = []
        for name in names:
            rcfg = cfg.model_copy(deep=True)
            rcfg.run.run_id = name
            tables.append(pq.read_table(RunLayout.of(rcfg).rollouts(i), columns=["response"]))
        out.append(tables[0].equals(tables[1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--zero", type=int, default=3, help="train.zero_stage of every side")
    ap.add_argument("--reverse", action="store_true", help="run the sides in reverse order")
    args = ap.parse_args()

    from safetensors.torch import load_file

    from components.core.layout import RunLayout, store_for
    from components.report.timeline import load_timeline, summary

    bench, cfg = bench_setup("multinode", args.config, args.iterations)
    cfg.evaluate.every = cfg.run.iterations  # score the base and the last checkpoint
    order = list(SIDES)[::-1] if args.reverse else list(SIDES)
    walls, train_s, weights = {}, {}, {}
    for name in order:
        nodes, ranks = SIDES[name]
        cmd = [
            sys.executable,
            "-m",
            "pipelines.cli",
            "run",
            args.config,
            "--run-id",
            name,
            "--set",
            "data.eval=[]",
            "--set",
            "retention.enabled=false",  # every checkpoint is evaluated afterwards
            "--set",
            f"run.store={cfg.run.store}",
            "--set",
            f"train.nodes={nodes}",
            "--set",
            f"train.processes={ranks}",
            "--set",
            f"train.zero_stage={args.zero}",
            "--iterations",
            str(cfg.run.iterations),
        ]
        print(f"running {name} ({nodes} node(s) x {ranks} rank(s)) ...", flush=True)
        walls[name] = timed(cmd, bench / f"{name}.log")
        rcfg = cfg.model_copy(deep=True)
        rcfg.run.run_id = name
        layout = RunLayout.of(rcfg)
        tl = load_timeline(store_for(rcfg), layout.root)
        train_s[name] = summary(tl)["stages"]["train"].get("work", 0.0) / cfg.run.iterations
        weights[name] = load_file(f"{layout.checkpoint(cfg.run.iterations)}/model.safetensors")
        print(f"  {name}: {walls[name]:.1f} s", flush=True)
    base = load_file(f"{RunLayout.of(rcfg).checkpoint(0)}/model.safetensors")

    print("evaluating the first and last checkpoints of every run (untimed) ...", flush=True)
    scores = {name: evaluate_run(cfg, name) for name in SIDES}

    a, b = weights[MULTI], weights[BASELINE]
    delta_a = {k: a[k] - base[k] for k in base}
    delta_b = {k: b[k] - base[k] for k in base}
    largest = max(float((a[k] - b[k]).abs().max()) for k in b)
    rollouts = same_rollouts(cfg, (MULTI, BASELINE))
    last = cfg.run.iterations

    print(
        f"\n{'side':>5} {'wall s':>8} {'/ 1x2':>6} {'train s/it':>11}   "
        f"pass@1 ckpt 0 [95% CI]   pass@1 ckpt {last} [95% CI]"
    )
    for name in SIDES:
        print(
            f"{name:>5} {walls[name]:8.1f} {walls[name] / walls[BASELINE]:6.2f} "
            f"{train_s[name]:11.2f}   {ci(scores[name][0]):>22}   {ci(scores[name][last])}"
        )
    print(f"\n{MULTI} vs {BASELINE} after {last} iterations (ZeRO-{args.zero}):")
    print(f"  weights: relative L2 distance {rel(a, b):.2e}, largest difference {largest:.2e}")
    print(
        f"  the run's update (checkpoint {last} - base): relative L2 distance "
        f"{rel(delta_a, delta_b):.2e}"
    )
    print(
        f"  identical rollouts in {sum(rollouts)} of {len(rollouts)} iterations "
        f"(first different: {rollouts.index(False) if False in rollouts else 'none'})"
    )
    print(
        f"  wall ratio {MULTI} / {BASELINE}: {walls[MULTI] / walls[BASELINE]:.2f}; train work "
        f"per iteration ratio {train_s[MULTI] / train_s[BASELINE]:.2f}"
    )
    print(f"outputs: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
