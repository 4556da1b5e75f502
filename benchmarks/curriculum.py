"""Curriculum vs uniform prompt sampling at equal rollouts: held-out pass@1 and the share of
GRPO groups with no signal.

    python benchmarks/curriculum.py [--mixes demo hard] [--seeds 0] [--iterations N]

For each mix of the arithmetic levels, two `rlvr run`s of the demo config from the same base, the
baseline (`data.sampler: uniform`) and `data.sampler: curriculum` (prior pooled by
`extra_info.level`), side by side in one invocation and with the same run seed: the same
prompts per iteration, samples per prompt and updates, so the same rollouts. Mixes:

* ``demo``: the demo's own train and held-out sets (levels 1/2/3 at 30/50/20%);
* ``hard``: both resampled to 10/30/60% (more multiplication, which the base rarely solves).

Printed per mix: held-out pass@1 with its 95% bootstrap CI at every evaluated checkpoint for both
samplers, the zero-signal share (every sample of a prompt scored the same) per iteration and its
mean, and the ratios curriculum / uniform. With several seeds, the means over seeds too. Drawn:
`curriculum.png` in the output folder (`--replot OUT_DIR ...` redraws it from earlier
invocations, pooled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_setup, timed  # noqa: E402

MIXES = {"demo": None, "hard": {1: 0.1, 2: 0.3, 3: 0.6}}


def resample(src: Path, dst: Path, weights: dict[int, float], seed: int) -> int:
    """Rows of `src` drawn without replacement so that levels come in `weights` proportions, as
    many as the scarcest level allows."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    levels = np.asarray(pc.struct_field(table.column("extra_info"), "level"))
    by_level = {lv: np.flatnonzero(levels == lv) for lv in weights}
    total = min(len(by_level[lv]) / w for lv, w in weights.items())
    rng = np.random.default_rng(seed)
    take = np.concatenate(
        [rng.choice(by_level[lv], size=int(total * w), replace=False) for lv, w in weights.items()]
    )
    pq.write_table(table.take(np.sort(take)), dst)
    return len(take)


def run_side(args, cfg, bench: Path, name: str, sets: dict[str, str], sampler: str, seed: int):
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        args.config,
        "--run-id",
        name,
        "--set",
        f"run.store={cfg.run.store}",
        "--set",
        f"run.seed={seed}",
        "--set",
        f"data.sampler={sampler}",
        "--set",
        "data.curriculum.group_by=extra_info.level",
        "--set",
        f"data.train={sets['train']}",
        "--set",
        f"data.eval.0.path={sets['eval']}",
        "--iterations",
        str(cfg.run.iterations),
    ]
    print(f"running {name} ...", flush=True)
    wall = timed(cmd, bench / f"{name}.log")
    print(f"  {name}: {wall:.1f} s", flush=True)
    return {**read_side(Path(cfg.run.store, name)), "wall": wall}


def read_side(root: Path) -> dict:
    """A finished run's held-out metrics per checkpoint and zero-signal share per iteration."""
    evals = {}
    for d in sorted(root.glob("evals/[0-9]*/metrics.json")):
        evals[int(d.parent.name)] = json.loads(d.read_text())["overall"]
    zero = []
    for f in sorted(root.glob("iterations/[0-9]*/scored/_SUCCESS")):
        zero.append(json.loads(f.read_text())["stats"]["zero_signal_share"])
    return {"evals": evals, "zero": zero}


def plot(sides: dict[tuple[str, str], list[dict]], out_png: Path) -> Path:
    """One row per mix: zero-signal share per iteration, held-out pass@1 per checkpoint; each
    sampler's mean over seeds (thick) and every seed (thin)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mixes = sorted({mix for mix, _ in sides}, key=list(MIXES).index)
    fig = Figure(figsize=(11, 3.6 * len(mixes)))
    FigureCanvasAgg(fig)
    colors = {"uniform": "#888888", "curriculum": "#1f77b4"}
    for row, mix in enumerate(mixes):
        ax_z = fig.add_subplot(len(mixes), 2, 2 * row + 1)
        ax_p = fig.add_subplot(len(mixes), 2, 2 * row + 2)
        for sampler, color in colors.items():
            runs = sides.get((mix, sampler), [])
            if not runs:
                continue
            for r in runs:
                ax_z.plot(range(len(r["zero"])), r["zero"], color=color, lw=0.7, alpha=0.35)
                cs = sorted(r["evals"])
                ax_p.plot(
                    cs, [r["evals"][c]["pass@1"] for c in cs], color=color, lw=0.7, alpha=0.35
                )
            n = min(len(r["zero"]) for r in runs)
            mean_z = [sum(r["zero"][i] for r in runs) / len(runs) for i in range(n)]
            ax_z.plot(
                range(n),
                mean_z,
                color=color,
                lw=2.2,
                marker="o",
                ms=3,
                label=f"{sampler} (mean of {len(runs)} seeds)",
            )
            cs = sorted(set.intersection(*(set(r["evals"]) for r in runs)))
            mean_p = [sum(r["evals"][c]["pass@1"] for r in runs) / len(runs) for c in cs]
            ax_p.plot(cs, mean_p, color=color, lw=2.2, marker="o", ms=3, label=sampler)
        ax_z.set_title(f"{mix}: share of GRPO groups with no signal")
        ax_z.set_xlabel("iteration")
        ax_z.set_ylim(0, None)
        ax_z.legend(fontsize=8)
        ax_p.set_title(f"{mix}: held-out pass@1")
        ax_p.set_xlabel("checkpoint")
        ax_p.legend(fontsize=8, loc="lower right")
        for ax in (ax_z, ax_p):
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100, metadata={"Software": None})
    return out_png


def replot(dirs: list[Path], out_png: Path) -> Path:
    """The plot of earlier invocations' runs (`<out>/runs/<mix>-s<seed>-<sampler>/`), pooled."""
    sides: dict[tuple[str, str], list[dict]] = {}
    for d in dirs:
        for root in sorted(Path(d, "runs").iterdir()):
            mix, _, sampler = root.name.split("-")
            sides.setdefault((mix, sampler), []).append(read_side(root))
    return plot(sides, out_png)


def report(mix: str, seed: int, uni: dict, cur: dict) -> dict[str, float]:
    print(f"\n== mix {mix}, seed {seed}: held-out pass@1 [95% CI] ==")
    print(f"{'checkpoint':>10}  {'uniform':>24}  {'curriculum':>24}")
    for c in sorted(uni["evals"]):
        u, k = uni["evals"][c], cur["evals"][c]
        print(
            f"{c:>10}  {u['pass@1']:.3f} [{u['pass@1_ci95'][0]:.3f}, {u['pass@1_ci95'][1]:.3f}]"
            f"  {k['pass@1']:.3f} [{k['pass@1_ci95'][0]:.3f}, {k['pass@1_ci95'][1]:.3f}]"
        )
    print("zero-signal share per iteration:")
    print("  uniform    " + " ".join(f"{z:.2f}" for z in uni["zero"]))
    print("  curriculum " + " ".join(f"{z:.2f}" for z in cur["zero"]))
    zu, zc = (sum(x["zero"]) / len(x["zero"]) for x in (uni, cur))
    last = max(uni["evals"])
    pu, pc_ = uni["evals"][last]["pass@1"], cur["evals"][last]["pass@1"]
    lo, hi = uni["evals"][last]["pass@1_ci95"]
    print(f"mean zero-signal share: uniform {zu:.3f}, curriculum {zc:.3f} (ratio {zc / zu:.2f})")
    print(
        f"last checkpoint ({last}) pass@1: uniform {pu:.3f} [{lo:.3f}, {hi:.3f}], "
        f"curriculum {pc_:.3f} (difference {pc_ - pu:+.3f})"
    )
    print(f"wall: uniform {uni['wall']:.1f} s, curriculum {cur['wall']:.1f} s")
    return {"zero_u": zu, "zero_c": zc, "pass_u": pu, "pass_c": pc_}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument(
        "--replot",
        nargs="+",
        type=Path,
        metavar="OUT_DIR",
        help="only redraw curriculum.png from earlier invocations' output folders",
    )
    args = ap.parse_args()
    if args.replot:
        print(f"plot: {replot(args.replot, args.replot[-1] / 'curriculum.png')}")
        return 0

    bench, cfg = bench_setup("curriculum", args.config, args.iterations)
    results: dict[str, list[dict[str, float]]] = {}
    sides: dict[tuple[str, str], list[dict]] = {}
    for mix in args.mixes:
        sets = {"train": cfg.data.train, "eval": cfg.data.eval[0].path}
        if MIXES[mix] is not None:
            for split in ("train", "eval"):
                dst = bench / f"{mix}-{split}.parquet"
                n = resample(Path(sets[split]), dst, MIXES[mix], seed=0)
                print(f"{mix} {split}: {n} rows at levels {MIXES[mix]}")
                sets[split] = str(dst)
        for seed in args.seeds:
            uni = run_side(args, cfg, bench, f"{mix}-s{seed}-uniform", sets, "uniform", seed)
            cur = run_side(args, cfg, bench, f"{mix}-s{seed}-curriculum", sets, "curriculum", seed)
            results.setdefault(mix, []).append(report(mix, seed, uni, cur))
            sides.setdefault((mix, "uniform"), []).append(uni)
            sides.setdefault((mix, "curriculum"), []).append(cur)
    print("\n== summary (means over seeds) ==")
    for mix, rows in results.items():
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        print(
            f"{mix}: zero-signal share {mean['zero_u']:.3f} -> {mean['zero_c']:.3f} "
            f"(ratio {mean['zero_c'] / mean['zero_u']:.2f}); last pass@1 "
            f"{mean['pass_u']:.3f} -> {mean['pass_c']:.3f} "
            f"({mean['pass_c'] - mean['pass_u']:+.3f})"
        )
    print(f"plot: {plot(sides, bench / 'curriculum.png')}")
    print(f"outputs: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
