"""Tools on vs off on the tool-use demo (examples/tool_arithmetic): held-out pass@1 with 95%
CIs per checkpoint and the tool-call rate per iteration, side by side from the same base, run
seed, prompts and updates (equal rollouts).

    python benchmarks/tool_use.py [--seeds 0 1] [--iterations N]

"off" is the same config with `generate.tools=[]`: the policy may still write a call, but
nothing runs it, so it gets no result (the rate drawn for "off" is the share of samples that
wrote one). Printed: pass@1 [95% CI] per checkpoint and seed, on and off; the mean over seeds
at the last checkpoint with its difference and ratio; the tool-call rate at the first and last
iteration; wall time per run. Drawn: `tool_use.png` in the output folder (pass@1 per checkpoint,
and tool calls per sample per iteration).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_setup, ci, timed  # noqa: E402

SIDES = {"tools on": [], "tools off": ["--set", "generate.tools=[]"]}


def figures(root: Path) -> dict:
    """pass@1 per checkpoint; per iteration, the share of samples with a tool call (run by the
    tool, or only written when tools are off)."""
    import pyarrow.parquet as pq

    from components.core.turns import TOOL_CALL

    evals = {
        int(p.parent.name): json.loads(p.read_text())["overall"]
        for p in root.glob("evals/[0-9]*/metrics.json")
    }
    rate = {}
    for done in sorted(root.glob("iterations/*/rollouts/_SUCCESS")):
        stats = json.loads(done.read_text())["stats"]
        if "tool_call_rate" in stats:
            rate[int(done.parent.parent.name)] = stats["tool_call_rate"]
        else:
            texts = [
                t
                for f in sorted(done.parent.rglob("*.parquet"))
                for t in pq.read_table(f, columns=["response"]).column(0).to_pylist()
            ]
            rate[int(done.parent.parent.name)] = sum(
                bool(TOOL_CALL.search(t)) for t in texts
            ) / len(texts)
    return {"evals": evals, "tool_call_rate": rate}


def plot(out: Path, runs: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (name, per_seed), color in zip(runs.items(), ("tab:blue", "tab:gray"), strict=True):
        for k, r in enumerate(per_seed):
            cs = sorted(r["evals"])
            a.errorbar(
                cs,
                [r["evals"][c]["pass@1"] for c in cs],
                yerr=[
                    [r["evals"][c]["pass@1"] - r["evals"][c]["pass@1_ci95"][0] for c in cs],
                    [r["evals"][c]["pass@1_ci95"][1] - r["evals"][c]["pass@1"] for c in cs],
                ],
                color=color,
                marker="o",
                capsize=3,
                alpha=0.8,
                label=name if k == 0 else None,
            )
            its = sorted(r["tool_call_rate"])
            b.plot(
                its,
                [r["tool_call_rate"][i] for i in its],
                color=color,
                marker=".",
                label=(name if name == "tools on" else f"{name}: calls written, never run")
                if k == 0
                else None,
            )
    n = len(next(iter(runs.values())))
    a.set(
        xlabel="checkpoint (iteration)",
        ylabel="held-out pass@1 (95% CI)",
        title=f"3-digit products: pass@1 ({n} seed(s) each)",
        ylim=(0, 1),
    )
    b.set(
        xlabel="iteration",
        ylabel="samples with a tool call",
        title="tool calls per sample",
        ylim=(0, 1.02),
    )
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/tool_arithmetic/config.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--iterations", type=int, default=None)
    args = ap.parse_args()
    bench, cfg = bench_setup("tool_use", args.config, args.iterations)
    runs: dict[str, list[dict]] = {name: [] for name in SIDES}
    for seed in args.seeds:
        for name, extra in SIDES.items():
            run_id = f"s{seed}-" + name.replace(" ", "-")
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
                *extra,
            ]
            print(f"running {run_id} ...", flush=True)
            wall = timed(cmd, bench / f"{run_id}.log")
            runs[name].append({**figures(Path(cfg.run.store, run_id)), "wall": wall})
            print(f"  {wall:.1f} s", flush=True)

    on, off = runs["tools on"], runs["tools off"]
    cs = sorted(on[0]["evals"])
    print(f"\nheld-out pass@1 [95% CI], tools on vs off; seeds {args.seeds}")
    for seed, r_on, r_off in zip(args.seeds, on, off, strict=True):
        print(f"  seed {seed}")
        for c in cs:
            print(f"    checkpoint {c:>3}: on {ci(r_on['evals'][c])}   off {ci(r_off['evals'][c])}")
    last = cs[-1]
    m_on = statistics.mean(r["evals"][last]["pass@1"] for r in on)
    m_off = statistics.mean(r["evals"][last]["pass@1"] for r in off)
    m_base = statistics.mean(r["evals"][0]["pass@1"] for r in on)
    print(
        f"\nlast checkpoint ({last}), mean over seeds: on {m_on:.3f}, off {m_off:.3f}; "
        f"difference {m_on - m_off:+.3f}, ratio on/off "
        f"{m_on / m_off if m_off else float('inf'):.1f}x (base {m_base:.3f})"
    )
    for name, rs in runs.items():
        its = sorted(rs[0]["tool_call_rate"])
        first = statistics.mean(r["tool_call_rate"][its[0]] for r in rs)
        end = statistics.mean(r["tool_call_rate"][its[-1]] for r in rs)
        print(
            f"{name}: samples with a tool call, iteration {its[0]} {first:.3f} -> iteration "
            f"{its[-1]} {end:.3f}; wall (median) {statistics.median(r['wall'] for r in rs):.0f} s"
        )
    (bench / "results.json").write_text(json.dumps({"seeds": args.seeds, "runs": runs}))
    plot(bench / "tool_use.png", runs)
    print(f"\nplot: {bench / 'tool_use.png'}\noutputs: {bench}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
