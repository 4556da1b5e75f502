"""LoRA vs full fine-tuning on the demo: what crosses from train to generate each iteration,
how long a warm engine takes to load it, its share of an iteration, the train step, and learning
at equal rollouts.

    python benchmarks/lora.py [--lora 16:16:5e-3 4:4:5e-3:head ...] [--seeds 0 1]
    python benchmarks/lora.py --config examples/smollm2/config.yaml --iterations 4 \
        --lora 16:32:2e-4 --set evaluate.every=4       # the handoff at 135M parameters

For every seed, the baseline (full fine-tuning at the config's lr) and one run per `--lora
RANK:ALPHA:LR[:head]` setting (`:head` sets `model.lora.output_head`), all from the same base
with the same run seed (the same prompts, samples per prompt and updates: equal rollouts), side
by side in one invocation. Printed: bytes per handoff (the train stage's committed weights) and
their ratio; the handoff's seconds (train's checkpoint commit plus generate's load) and their
share of an iteration; generate's warm policy load
(median over iterations); train work per iteration (median); held-out pass@1 with its 95% CI at
the middle and the last checkpoint, per seed and as the mean over seeds; and, from parameter
counts on the meta device, the handoff of a Qwen2.5-7B-shaped model at each rank against its
bf16 weights. Drawn: `lora.png` in the output folder (pass@1 per checkpoint, mean over seeds);
`--replot OUT_DIR ... [--plot-to PNG]` redraws it from earlier invocations, their seeds pooled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_setup, ci, timed  # noqa: E402


def figures(root: Path) -> dict:
    """Per-iteration handoff bytes, warm load and train seconds; pass@1 per checkpoint."""
    ckpts = sorted(p for p in (root / "checkpoints").iterdir() if p.name != "00000")
    manifests = [json.loads((p / "_SUCCESS").read_text()) for p in ckpts]
    gens = [
        json.loads(p.read_text())["stats"]
        for p in sorted(root.glob("iterations/*/rollouts/_SUCCESS"))
    ]
    warm = [g["policy_load_s"] for g in gens if g.get("policy_load") in ("weights", "adapter")]
    evals = {
        int(p.parent.name): json.loads(p.read_text())["overall"]
        for p in root.glob("evals/[0-9]*/metrics.json")
    }
    from components.core.store import get_store
    from components.report.timeline import load_timeline, summary

    tl = summary(load_timeline(get_store(str(root)), str(root)))
    return {
        "handoff_s": tl["handoff_s"],
        "handoff_share": tl["handoff_share"],
        "iteration_s": tl["iteration_s"],
        "bytes": statistics.median(
            sum(f["bytes"] for f in m["files"] if f["path"].endswith(".safetensors"))
            for m in manifests
        ),
        "load_s": statistics.median(warm) if warm else float("nan"),
        "train_s": statistics.median(m["stats"]["train/seconds"] for m in manifests),
        "evals": evals,
    }


def cold_load_s(cfg, run_root: Path, checkpoint: int, repeats: int = 5) -> float:
    """Seconds for a fresh generate engine to take the run's checkpoint `checkpoint` (the stage's
    cold start for its policy: the full weights, or the base and then the adapter), median of
    `repeats` fresh engines in this process (imports already paid)."""
    from components.core.store import get_store
    from components.model.engine import PolicyEngine

    uri = str(run_root / "checkpoints" / f"{checkpoint:05d}")
    store = get_store(uri, None)
    times = []
    for _ in range(repeats):
        engine = PolicyEngine(cfg.generate, cfg.run.seed)
        t0 = time.perf_counter()
        engine.ensure(store, uri)
        times.append(time.perf_counter() - t0)
        engine.close()
    return statistics.median(times)


def parse_setting(text: str) -> tuple[int, float, float, bool]:
    """RANK:ALPHA:LR, with `:head` to adapt the output head too (model.lora.output_head)."""
    parts = text.split(":")
    try:
        if len(parts) not in (3, 4) or parts[3:] not in ([], ["head"]):
            raise ValueError
        return int(parts[0]), float(parts[1]), float(parts[2]), parts[3:] == ["head"]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lora {text!r}: expected RANK:ALPHA:LR or RANK:ALPHA:LR:head"
        ) from None


def plot(out: Path, runs: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, per_seed in runs.items():
        cs = sorted(set.intersection(*(set(r["evals"]) for r in per_seed)))
        mean = [statistics.mean(r["evals"][c]["pass@1"] for r in per_seed) for c in cs]
        style = {"color": "black", "lw": 2.2} if name == "full" else {"lw": 1.6}
        ax.plot(cs, mean, marker="o", label=name, **style)
        if name == "full" and len(per_seed) == 1:
            lo = [per_seed[0]["evals"][c]["pass@1_ci95"][0] for c in cs]
            hi = [per_seed[0]["evals"][c]["pass@1_ci95"][1] for c in cs]
            ax.fill_between(cs, lo, hi, color="black", alpha=0.1, label="full: 95% CI")
    n = len(next(iter(runs.values())))
    ax.set(
        xlabel="checkpoint (iteration)",
        ylabel="held-out pass@1",
        title=f"LoRA vs full fine-tuning at equal rollouts (mean of {n} seed(s))",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument(
        "--lora",
        type=parse_setting,
        nargs="+",
        default=[(16, 16.0, 5e-3, False), (4, 4.0, 5e-3, True)],
        help="RANK:ALPHA:LR[:head], one run per setting",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], help="config override a.b=v, all sides")
    ap.add_argument(
        "--replot",
        nargs="+",
        metavar="OUT_DIR",
        help="redraw lora.png from earlier invocations' results.json, pooled",
    )
    ap.add_argument("--plot-to", default=None, help="with --replot: where to write the PNG")
    args = ap.parse_args()
    if args.replot:
        replot(args.replot, Path(args.plot_to or Path(args.replot[-1]) / "lora.png"))
        return 0

    from transformers import Qwen2Config

    from components.core.config import LoraSection
    from components.model.adapter import adapter_parameter_count

    bench, cfg = bench_setup("lora", args.config, args.iterations, args.set)
    sides = {"full": []}
    settings: dict[str, LoraSection] = {}
    for rank, alpha, lr, head in args.lora:
        lora = f"{{rank: {rank}, alpha: {alpha}, output_head: {str(head).lower()}}}"
        name = f"lora r{rank} a{alpha:g} lr{lr:g}" + (" +head" if head else "")
        sides[name] = ["--set", f"model.lora={lora}", "--set", f"train.lr={lr}"]
        settings[name] = LoraSection(rank=rank, alpha=alpha, output_head=head)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for seed in args.seeds:
        for name, extra in sides.items():
            run_id = f"s{seed}-" + name.replace(" ", "-").replace("+", "")
            cmd = [
                sys.executable,
                "-m",
                "pipelines.cli",
                "run",
                args.config,
                "--run-id",
                run_id,
                "--set",
                f"run.store={cfg.run.store}",
                "--set",
                f"run.seed={seed}",
                "--iterations",
                str(cfg.run.iterations),
                *[f"--set={o}" for o in args.set],
                *extra,
            ]
            print(f"running {run_id} ...", flush=True)
            wall = timed(cmd, bench / f"{run_id}.log")
            root = Path(cfg.run.store, run_id)
            runs[name].append(
                {
                    **figures(root),
                    "wall": wall,
                    "cold_s": cold_load_s(cfg, root, cfg.run.iterations),
                }
            )
            print(f"  {wall:.1f} s", flush=True)

    full = runs["full"]
    cs = sorted(set.intersection(*(set(r["evals"]) for rs in runs.values() for r in rs)))
    mid, last = cs[len(cs) // 2], cs[-1]
    print(
        f"\nFull fine-tuning: lr {cfg.train.lr}; seeds {args.seeds}; "
        f"checkpoints {mid} (middle) and {last} (last)"
    )
    q7 = Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
    )
    for name, rs in runs.items():
        b = statistics.median(r["bytes"] for r in rs)
        load = statistics.median(r["load_s"] for r in rs)
        tr = statistics.median(r["train_s"] for r in rs)
        fb = statistics.median(r["bytes"] for r in full)
        fl = statistics.median(r["load_s"] for r in full)
        ft = statistics.median(r["train_s"] for r in full)
        print(f"\n== {name} ==")
        print(f"  handoff per iteration: {b:,.0f} B ({fb / b:.1f}x smaller than full)")
        hs = statistics.median(r["handoff_s"] for r in rs)
        share = statistics.median(r["handoff_share"] for r in rs)
        it = statistics.median(r["iteration_s"] for r in rs)
        print(
            f"  handoff time (train's commit + generate's load, median): {hs:.2f} s, "
            f"{100 * share:.1f}% of an iteration ({it:.1f} s)"
        )
        cold = statistics.median(r["cold_s"] for r in rs)
        fc = statistics.median(r["cold_s"] for r in full)
        print(
            f"  warm policy load in generate (median): {load * 1e3:.1f} ms "
            f"(ratio to full {load / fl:.2f})"
        )
        print(
            f"  cold policy load, a fresh engine (median): {cold * 1e3:.1f} ms "
            f"(ratio to full {cold / fc:.2f})"
        )
        print(f"  train work per iteration (median): {tr:.2f} s (ratio to full {tr / ft:.2f})")
        for seed, r, f in zip(args.seeds, rs, full, strict=True):
            print(
                f"  seed {seed}: pass@1 ckpt {mid}: {ci(r['evals'][mid])} (full "
                f"{ci(f['evals'][mid])}); ckpt {last}: {ci(r['evals'][last])} (full "
                f"{ci(f['evals'][last])})"
            )
        if len(rs) > 1:
            m = {c: statistics.mean(r["evals"][c]["pass@1"] for r in rs) for c in (mid, last)}
            fm = {c: statistics.mean(r["evals"][c]["pass@1"] for r in full) for c in (mid, last)}
            print(
                f"  mean over seeds: pass@1 ckpt {mid} {m[mid]:.3f} (full {fm[mid]:.3f}), "
                f"ckpt {last} {m[last]:.3f} (full {fm[last]:.3f}; ratio "
                f"{m[last] / fm[last]:.3f})"
            )
        if name != "full":
            rank = settings[name].rank
            adapter, base = adapter_parameter_count(q7, settings[name])
            print(
                f"  Qwen2.5-7B shape, same setting: adapter {adapter / 1e6:.1f}M parameters "
                f"vs {base / 1e9:.2f}B: {base / adapter:.0f}x smaller per handoff in bf16, "
                f"{base / adapter / 2:.0f}x with the adapter in fp32"
            )
        print(f"  wall (median): {statistics.median(r['wall'] for r in rs):.1f} s")
    (bench / "results.json").write_text(json.dumps({"seeds": args.seeds, "runs": runs}))
    plot(bench / "lora.png", runs)
    print(f"\nplot: {bench / 'lora.png'}\noutputs: {bench}")
    return 0


def replot(dirs: list[str], out: Path) -> None:
    """One plot of earlier invocations' results (their seeds pooled per setting)."""
    runs: dict[str, list[dict]] = {}
    for d in dirs:
        data = json.loads((Path(d) / "results.json").read_text())
        for name, rs in data["runs"].items():
            for r in rs:
                r["evals"] = {int(c): m for c, m in r["evals"].items()}
            runs.setdefault(name, []).extend(rs)
    plot(out, runs)
    print(f"plot of {len(next(iter(runs.values())))} seeds: {out}")


if __name__ == "__main__":
    sys.exit(main())
