"""The run report under `<run>/report/` (`rlvr report RUN_DIR`, and the end of `rlvr run`):
every committed evaluation's history and pass@k curves, where the time went (timeline.py), and
the training dynamics dashboard (dynamics.py, dashboard.py): PNGs, dynamics.csv/json and one
self-contained index.html. Regenerated from the store alone; the committed outputs it reads are
left as they are."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from components.core.commit import OutputDir
from components.core.errors import StageError
from components.core.layout import RunLayout, committed_indices
from components.core.store import Store, join
from components.report.history import history
from components.report.markdown import render_markdown
from components.report.plots import plot_history, plot_pass_at_k

__all__ = ["write_run_report"]


def write_run_report(store: Store, root: str) -> dict[str, str]:
    """Regenerate the run-level plots and report under `<run>/report/` from every committed eval:
    pass@1 / mean@n / reward over checkpoints, and pass@k curves of the base, the best and the
    last checkpoint; plus where the time went: a Gantt chart of every task with the critical
    path (components/report/timeline.py); plus the training dynamics of every iteration from
    every committed manifest (components/report/dashboard.py): ``dynamics_<family>.png``,
    ``dynamics.csv`` / ``dynamics.json`` and the self-contained ``index.html``. The committed
    eval directories are left as they are."""
    from components.report.dynamics import collect
    from components.report.timeline import format_summary, load_timeline, plot_timeline, summary

    layout = RunLayout(root.rstrip("/"))
    done = committed_indices(store, layout.evals_dir)
    timeline = load_timeline(store, layout.root)
    dynamics = collect(store, layout.root)
    if not done and not timeline.steps and not dynamics.rows:
        raise StageError(f"{root} has no committed evaluation or stage output yet")
    out = OutputDir(store, layout.report, "report")
    out.begin(force=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-report-"))
    names = []
    try:
        md = "# Run report\n\n_No evaluation yet._\n"
        best = None
        tops = {c: json.loads(store.read_text(layout.eval_metrics(c))) for c in done}
        done = [c for c in done if "overall" in tops[c]]  # held-out sets (not lm-eval alone)
        if done:
            last = done[-1]
            rows = history(store, layout, last, tops[last])
            best = max(done, key=lambda c: tops[c]["overall"]["pass@1"])
            curves = pass_curves(tops, base=done[0], best=best, last=last)
            out.put_file(plot_history(rows, tmp / "history.png"), "history.png")
            out.put_file(
                plot_pass_at_k(curves, tmp / "pass_at_k.png", "pass@k: base, best, last"),
                "pass_at_k.png",
            )
            names += ["history.png", "pass_at_k.png"]
            primary = tops[last]
            md = render_markdown(
                {
                    "model": primary["checkpoint"],
                    "checkpoint": f"{last:05d}",
                    "overall": primary["overall"],
                    "by_data_source": primary["by_data_source"],
                },
                rows,
                {"history": "history.png", "pass@k": "pass_at_k.png"},
            )
        if timeline.steps:
            out.put_file(plot_timeline(timeline, tmp / "timeline.png"), "timeline.png")
            names.append("timeline.png")
            md += (
                "\n## Where the time went\n\n![timeline](timeline.png)\n\n```\n"
                + format_summary(summary(timeline))
                + "\n```\n"
            )
        from components.report.gallery import image_gallery

        gallery = image_gallery(store, layout.root, done)
        dashboard = _write_dashboard(dynamics, layout.root, names, tmp, out, gallery)
        md += _dynamics_markdown(dashboard)
        out.put_bytes(_with_health(md, dynamics.health).encode(), "report.md")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.commit({"checkpoints": done, "best": best, "steps": len(dynamics.rows)})
    return {name: join(out.uri, name) for name in ("report.md", *names, *dashboard)}


def _write_dashboard(
    dynamics: Any, root: str, names: list[str], tmp: Path, out: OutputDir, gallery: str = ""
) -> list[str]:
    """The dashboard files into `out` (the run-level plots already written to `tmp` go into
    index.html too); their names, index.html last."""
    from components.report.dashboard import write_dashboard

    pages = (
        ("pass_at_k.png", "pass@k: base, best, last", "pass@k against k (samples)."),
        ("timeline.png", "Where the time went", "Every task of the run, with the critical path."),
    )
    extra = {title: (note, tmp / name) for name, title, note in pages if name in names}
    files = write_dashboard(
        dynamics, tmp / "dashboard", root.rstrip("/").rsplit("/", 1)[-1], root, extra, gallery
    )
    for f in files:
        out.put_file(f, f.name)
    return [f.name for f in files]


def _with_health(md: str, health: Any) -> str:
    """The report with its "Run health" section after the title: the verdict, whether the run
    stopped and why, and each symptom as it appeared (components/core/run_control.py)."""
    if health is None:
        return md
    title, _, rest = md.partition("\n")
    marker = {"healthy": "OK", "warning": "WARNING"}.get(health.verdict, "FAILED")
    lines = [
        "",
        "## Run health",
        "",
        f"**{marker}: {health.verdict}** after iteration {health.iteration}. {health.summary}",
        "",
    ]
    if health.stop:
        lines += [
            f"**The run stopped after iteration {health.iteration}** under `health.stop_after`: "
            f"no learning signal for {health.streak} iterations in a row. To go on anyway, "
            "rerun with `--set health.stop_after=0`.",
            "",
        ]
    if health.events:
        lines += ["| iteration | level | symptom | what and the usual fixes |", "|---|---|---|---|"]
        lines += [
            f"| {e.iteration} | {e.level} | {e.symptom} | {e.message.replace('|', '/')} |"
            for e in health.events
        ]
        lines.append("")
    return "\n".join([title, *lines, rest])


def _dynamics_markdown(files: list[str]) -> str:
    pngs = [f for f in files if f.endswith(".png")]
    lines = ["", "## Training dynamics", ""]
    if not pngs:
        return "\n".join([*lines, "_No stage output committed yet._", ""])
    lines += [
        "Every figure of every iteration, from the stages' manifests (names as in TensorBoard). "
        "All of it on one page: [index.html](index.html); the table: "
        '[dynamics.csv](dynamics.csv) (`pandas.read_csv(path, index_col="step")`).',
        "",
    ]
    for png in pngs:
        family = png[len("dynamics_") : -len(".png")]
        lines += [f"### {family}", "", f"![{family}]({png})", ""]
    return "\n".join(lines)


def pass_curves(tops: dict[int, dict], *, base: int, best: int, last: int) -> dict[str, dict]:
    """The run report's pass@k curves: base, best and last, one curve per checkpoint, labelled
    with every role it has (``best = last (00012)``)."""
    roles: dict[int, list[str]] = {}
    for role, c in (("base", base), ("best", best), ("last", last)):
        roles.setdefault(c, []).append(role)
    return {f"{' = '.join(r)} ({c:05d})": _pass_curve(tops[c]) for c, r in roles.items()}


def _pass_curve(m: dict) -> dict[int, float]:
    return {
        int(k.split("@")[1]): v
        for k, v in m["overall"].items()
        if k.startswith("pass@") and "_" not in k
    }
