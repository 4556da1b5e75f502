"""Bounded staleness: does one-step-off-policy training (train.max_staleness = 1) learn like
on-policy training (k = 0), and how much faster is it?

    python benchmarks/staleness.py [--config examples/arithmetic/config.yaml] [--k 1] [--k-first]

Both runs are the demo config from the same base, timed as whole `rlvr run` processes without
evaluation; afterwards every `evaluate.every`-th checkpoint of both is scored by rlvr's evaluator
with the same sample seeds (untimed). Printed: pass@1 with its 95% CI per checkpoint for both
(the baseline is k = 0, measured side by side), whether they agree within CI, both wall times and
their ratio, and each run's steady-state iteration time and generate/train overlap from its
timeline. With k >= 1 generate of iteration i+1 runs beside train of iteration i, each worker on
half the cores (pipelines/cli.py), so on 2 cores the gain is bounded by how much each stage
slows on one core.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_setup, compare_table, evaluate_run, timed  # noqa: E402


def overlap_s(tl) -> float:
    """Seconds during which a generate step and a train step both did work."""
    gen = [
        (s, e) for st in tl.steps if st.stage == "generate" for k, s, e in st.spans if k == "work"
    ]
    trn = [(s, e) for st in tl.steps if st.stage == "train" for k, s, e in st.spans if k == "work"]
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in gen for c, d in trn)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--k", type=int, default=1, help="the max_staleness to compare with 0")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--k-first", action="store_true", help="run the k > 0 side first")
    args = ap.parse_args()

    from components.core.layout import RunLayout, store_for
    from components.report.timeline import load_timeline, summary

    bench, cfg = bench_setup("staleness", args.config, args.iterations)
    sides = {f"k={k}": k for k in ((args.k, 0) if args.k_first else (0, args.k))}
    walls, stats = {}, {}
    for name, k in sides.items():
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
            f"train.max_staleness={k}",
            "--iterations",
            str(cfg.run.iterations),
        ]
        print(f"running {name} ...", flush=True)
        walls[name] = timed(cmd, bench / f"{name}.log")
        rcfg = cfg.model_copy(deep=True)
        rcfg.run.run_id = name
        tl = load_timeline(store_for(rcfg), RunLayout.of(rcfg).root)
        stats[name] = (summary(tl), overlap_s(tl))
        print(f"  {name}: {walls[name]:.1f} s", flush=True)
    print("evaluating every checkpoint of both runs (untimed) ...", flush=True)
    scores = {name: evaluate_run(cfg, name) for name in sides}
    base, other = "k=0", f"k={args.k}"
    within = compare_table(scores[base], scores[other], (base, other))
    print()
    for name in (base, other):
        s, ov = stats[name]
        print(
            f"{name}: wall {walls[name]:.1f} s, an iteration {s['iteration_s']:.2f} s, "
            f"generate and train overlapping {ov:.1f} s"
        )
    print(f"wall ratio {other} / {base}: {walls[other] / walls[base]:.2f}")
    print(f"learning within CI at every checkpoint: {'yes' if within else 'NO'}")
    print(f"outputs: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
