"""The GPU check's figures (docs/gpu.md): one run's, and all of them gathered into one file.

    python benchmarks/gpu/figures.py run RUN_ROOT OUT.json
    python benchmarks/gpu/figures.py gather DIR OUT.json OUT.md

`run`: a finished run's held-out pass@1 at its first and last evaluated checkpoint (with the
last one's 95% interval), its wall time and an iteration's, and the policy handoff's share
(components/report/timeline.py). `gather`: run 1's and run 2's files in DIR (benchmarks/gpu/
run1.sh, run2.sh) into one JSON file and a Markdown table for docs/gpu.md, the card
named in its first row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components.core.layout import committed_indices  # noqa: E402
from components.core.store import get_store, join  # noqa: E402
from components.report.timeline import load_timeline, summary  # noqa: E402


def run_figures(root: str) -> dict:
    store = get_store(root)
    evals = committed_indices(store, join(root, "evals"))
    top = {
        c: json.loads(store.read_text(join(root, "evals", f"{c:05d}", "metrics.json")))
        for c in evals
    }
    out: dict = {}
    if top:
        first, last = top[min(top)]["overall"], top[max(top)]["overall"]
        out.update(
            pass1_first=first["pass@1"],
            pass1_last=last["pass@1"],
            pass1_last_ci95=last.get("pass@1_ci95"),
            evaluated=[min(top), max(top)],
        )
    s = summary(load_timeline(store, root))
    out.update(
        {k: s[k] for k in ("wall_s", "startup_s", "iteration_s", "handoff_s", "handoff_share")}
    )
    return out


def _read(path: Path):
    if not path.exists():
        return None
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else text.strip()


def gather(d: Path) -> dict:
    return {
        p.stem: _read(p)
        for p in sorted(d.iterdir())
        if p.suffix in (".json", ".txt") and p.stem != "gpu-figures"
    }


def table(g: dict) -> str:
    gpu = (g.get("gpu") or "unknown GPU").split(",")[0]
    rows = [f"| what ({gpu}; {g.get('versions', '')}) | figure |", "|---|---|"]
    rows.append(f"| tests/e2e/test_gpu.py | {g.get('tests', 'not run')} |")
    for name, label in (
        ("demo", "arithmetic demo"),
        ("smollm2", "SmolLM2-135M example"),
        ("broadcast", "SmolLM2-135M, 6 iterations, policy over NCCL (`channel: broadcast`)"),
    ):
        r = g.get(name)
        if g.get(f"{name}-run"):
            rows.append(f"| {label}: exit status, seconds | {g[f'{name}-run']} |")
        if isinstance(r, dict) and "pass1_first" not in r and "handoff_share" in r:  # no evals
            rows.append(
                f"| {label} | {r['wall_s']:.0f} s wall ({r['startup_s']:.0f} s start-up), an "
                f"iteration {r['iteration_s']:.2f} s, handoff {r['handoff_s']:.2f} s "
                f"({100 * r['handoff_share']:.1f}%) |"
            )
        if isinstance(r, dict) and "pass1_first" in r:
            ci = r.get("pass1_last_ci95") or [float("nan")] * 2
            rows.append(
                f"| {label}, held-out pass@1 | {r['pass1_first']:.3f} -> {r['pass1_last']:.3f} "
                f"[{ci[0]:.3f}, {ci[1]:.3f}], {r['wall_s']:.0f} s wall ({r['startup_s']:.0f} s "
                f"start-up), an iteration {r['iteration_s']:.2f} s, handoff "
                f"{r['handoff_s']:.2f} s ({100 * r['handoff_share']:.1f}%) |"
            )
    ir = g.get("in_run")
    if isinstance(ir, dict):
        if "in_run/bare_median" in ir:
            per = ", ".join(
                f"{i}: {r['in_run/bare']:.2f}" for i, r in ir["iterations"].items() if "bare" in r
            )
            rows.append(
                f"| generate in the run / bare `model.generate`, same rows (median over iterations; "
                f"each bare the median of 3) | {ir['in_run/bare_median']:.2f} ({per}) |"
            )
            rows.append(
                f"| generate's backend alone / bare, same rows | {ir['alone/bare_median']:.2f} |"
            )
        if "alone/eager_median" in ir:
            graphs = sorted(
                {
                    f"{k} {r['phases'][k]}"
                    for r in ir["iterations"].values()
                    for k in ("graph_captures", "graphs_off")
                    if k in r.get("phases", {})
                }
            )
            rows.append(
                f"| the backend with CUDA graphs / with eager steps, same rows | "
                f"{ir['alone/eager_median']:.2f} (in the run: {'; '.join(graphs) or 'no note'}) |"
            )
        if "train_tokens_per_s_median" in ir:
            mfu = f", MFU {100 * ir['train_mfu']:.1f}%" if "train_mfu" in ir else ""
            rows.append(
                f"| train tokens/s (median over iterations) | "
                f"{ir['train_tokens_per_s_median']:.0f}{mfu} (6 x {ir['params'] / 1e6:.1f}M "
                f"params x tokens/s over the dense bf16 peak) |"
            )
    c = g.get("contention")
    if isinstance(c, str):
        for line in c.splitlines():
            if line.startswith("generate"):
                rows.append(
                    f"| contention: {line.split(':')[0]} | {line.split(':', 1)[1].strip()} |"
                )
    return "\n".join(rows) + "\n"


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "run":
        Path(sys.argv[3]).write_text(json.dumps(run_figures(sys.argv[2]), indent=1) + "\n")
    elif cmd == "gather":
        g = gather(Path(sys.argv[2]))
        Path(sys.argv[3]).write_text(json.dumps(g, indent=1) + "\n")
        Path(sys.argv[4]).write_text(table(g))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
