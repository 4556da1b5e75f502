"""The run dashboard: training dynamics per iteration as PNGs and one self-contained HTML page.

From a :class:`~components.report.dynamics.Dynamics` table (every committed manifest of a run,
components/report/dynamics.py) this writes, into one directory (``<run>/report/``):

* ``dynamics_<family>.png`` for each figure family present (eval, verify, rollout, train, time):
  a grid of small line charts over the iterations, the key figures first, one panel per figure
  or group of related figures; figures that never changed are listed in a text panel instead;
* ``dynamics.csv`` / ``dynamics.json``: the table itself (``step`` + one column per figure name);
* ``index.html``: run header, the evaluation table, every family's plot, the last iteration's
  figures and how to open TensorBoard. The PNGs are embedded as base64 data URIs and the CSS is
  inline, so the file is readable alone (mailed, attached, opened from a bucket): no script, no
  external request.

The PNGs are drawn by components/report/dynamics_plots.py (deterministic bytes), about half
of them in a forked child where that is safe (plot_families); this module writes the table and
the page.
"""

from __future__ import annotations

import base64
import contextlib
import html
import os
import signal
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from components.core.layout import RunLayout
from components.report.dashboard_style import CSS as _CSS
from components.report.dynamics import Dynamics, family_of
from components.report.dynamics_plots import (
    Panel,
    family_panels,
    format_number,
    plot_family,
)
from components.report.dynamics_plots import short_name as _short

__all__ = ["Panel", "family_panels", "plot_family", "render_html", "write_dashboard"]

_HEADINGS = {
    "eval": "Evaluation over checkpoints",
    "verify": "Rewards (verify)",
    "rollout": "Rollouts (generate)",
    "train": "Policy update (train)",
    "health": "Run health figures",
    "time": "Time per stage",
}
_NOTES = {
    "eval": "Checkpoint c is the policy after c updates, the one iteration c samples with. "
    "Shaded: 95% bootstrap confidence interval.",
    "verify": "Group shares: prompts whose samples all got the same reward carry no GRPO signal.",
    "rollout": "",
    "train": "",
    "health": "Train's judgement after each iteration (the Run health section above): the "
    "iterations in a row without signal, the warnings so far, whether the verdict says the run "
    "is not learning, and the stop.",
    "time": "Each stage's time of one iteration, without the wait for its inputs "
    "(stages of neighbouring iterations overlap). work: sampling, scoring or updating alone.",
}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _img(png: bytes, alt: str) -> str:
    """An embedded PNG, never wider than it was drawn (its IHDR width)."""
    width = struct.unpack(">I", png[16:20])[0] if png[:8] == b"\x89PNG\r\n\x1a\n" else 0
    style = f' style="max-width: {width}px"' if width else ""
    return f'<img class="plot" alt="{_e(alt)}"{style} src="{_data_uri(png)}">'


def _eval_sets(dyn: Dynamics) -> list[str]:
    """The verl-format eval sets (the standard benchmarks are `eval/lm_eval/...`)."""
    return sorted(
        {c.split("/")[1] for c in dyn.columns if c.startswith("eval/") and c.count("/") >= 2}
        - {"lm_eval"}
    )


def _benchmarks_table(dyn: Dynamics) -> str:
    """The standard benchmarks per evaluated checkpoint: each task's metrics with lm-eval's
    standard error, and the change since the first checkpoint evaluated (the base in a run)."""
    prefix = "eval/lm_eval/"
    names = [
        c
        for c in dyn.columns
        if c.startswith(prefix) and "_ci95_" not in c and not c.endswith("_stderr")
    ]
    if not names:
        return ""
    rows = [c for c in dyn.steps if any(n in dyn.rows[c] for n in names)]
    head = "".join(f"<th>{_e(n[len(prefix) :])}</th>" for n in names)
    body = []
    first = dyn.rows[rows[0]]
    for c in rows:
        row = dyn.rows[c]
        cells = []
        for n in names:
            v = row.get(n)
            if v is None:
                cells.append("<td>–</td>")
                continue
            text = f"{v:.4f}"
            err = row.get(f"{n}_stderr")
            if err is not None:
                text += f' <span class="ci">± {err:.3f}</span>'
            if c != rows[0] and first.get(n) is not None:
                text += f' <span class="ci">({v - first[n]:+.4f})</span>'
            cells.append(f"<td>{text}</td>")
        label = f"{c:05d}" + (" (base)" if c == 0 else "")
        body.append(f"<tr><td>{_e(label)}</td>{''.join(cells)}</tr>")
    return (
        '<section id="benchmarks"><h2>Standard benchmarks</h2><p class="note">lm-evaluation-'
        "harness tasks on every evaluated checkpoint: did anything else regress while the "
        "reward went up? ± lm-eval's standard error; in brackets the change since checkpoint "
        f"{rows[0]:05d}. The eval plot draws each task next to the trained task's pass@1.</p>"
        f'<div class="scroll"><table><thead><tr><th>checkpoint</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div></section>"
    )


def _eval_metrics(dyn: Dynamics, s: str) -> list[str]:
    prefix = f"eval/{s}/"
    names = [c[len(prefix) :] for c in dyn.columns if c.startswith(prefix) and "_ci95_" not in c]

    def key(m: str) -> tuple[int, int, str]:
        kind = m.split("@")[0]
        order = {"pass": 0, "greedy_pass": 1, "mean": 2, "maj": 3}.get(kind, 4)
        k = int(m.split("@")[1]) if "@" in m and m.split("@")[1].isdigit() else 0
        return order, k, m

    return sorted(names, key=key)


def _best(dyn: Dynamics, s: str) -> tuple[int | None, int | None]:
    xs, ys = dyn.series(f"eval/{s}/pass@1")
    if not xs:
        return None, None
    best = max(zip(xs, ys, strict=True), key=lambda p: (p[1], -p[0]))[0]
    return best, xs[-1]


def _eval_table(dyn: Dynamics, s: str) -> str:
    metrics = _eval_metrics(dyn, s)
    prefix = f"eval/{s}/"
    rows = [c for c in dyn.steps if any(prefix + m in dyn.rows[c] for m in metrics)]
    best, _ = _best(dyn, s)
    head = "".join(f"<th>{_e(m)}</th>" for m in metrics)
    body = []
    for c in rows:
        row = dyn.rows[c]
        cells = []
        for m in metrics:
            v = row.get(prefix + m)
            text = "–" if v is None else f"{v:.4f}" if abs(v) < 10 else f"{v:,.2f}"
            lo, hi = row.get(f"{prefix}{m}_ci95_lo"), row.get(f"{prefix}{m}_ci95_hi")
            if v is not None and lo is not None and hi is not None:
                text += f' <span class="ci">[{lo:.3f}, {hi:.3f}]</span>'
            cells.append(f"<td>{text}</td>")
        cls = ' class="best"' if c == best else ""
        label = f"{c:05d}" + (" (base)" if c == 0 else "") + (" ★ best" if c == best else "")
        body.append(f"<tr{cls}><td>{_e(label)}</td>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table><thead><tr><th>checkpoint</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _delta(now: float, before: float | None) -> str:
    """The change since the figure's previous value; neutral colours: up is not always good."""
    if before is None:
        return '<td class="flat"></td>'
    d = now - before
    if d == 0:
        return '<td class="flat">=</td>'
    text = f"{d:+.3g}" if max(abs(before), abs(now)) < 1000 else f"{d:+,.0f}"
    if before != 0 and abs(d / before) < 100:
        r = d / abs(before)
        if abs(r) >= 0.0005:
            text += f" ({r:+.1%})" if abs(r) < 0.1 else f" ({r:+.0%})"
    return f'<td class="{"up" if d > 0 else "down"}">{"▲" if d > 0 else "▼"} {_e(text)}</td>'


def _last_tables(dyn: Dynamics) -> str:
    """Per family: each figure's last value (and its step where that is not the family's)."""
    blocks = []
    for family in dyn.families():
        names = [c for c in dyn.columns if family_of(c) == family and "_ci95_" not in c]
        if not names:
            continue
        what = "checkpoint" if family == "eval" else "iteration"
        step, _ = dyn.last(family)
        lines = []
        for name in names:
            xs, ys = dyn.series(name)
            value = _e(format_number(ys[-1]))
            if xs[-1] != step:
                value = f'<span class="ci">({what} {xs[-1]})</span> ' + value
            lines.append(
                f'<tr><td class="name">{_e(_short(name, family))}</td><td>{value}</td>'
                f"{_delta(ys[-1], ys[-2] if len(ys) > 1 else None)}</tr>"
            )
        blocks.append(
            f"<div><h3>{_e(_HEADINGS.get(family, family))} — {what} {step}</h3><table>"
            f"<thead><tr><th>{_e(family)}/…</th><th>value</th><th>change</th></tr></thead>"
            f"<tbody>{''.join(lines)}</tbody></table></div>"
        )
    return f'<div class="grid">{"".join(blocks)}</div>'


def _cards(dyn: Dynamics) -> str:
    cards = []

    def card(key: str, value: str, sub: str = "", css: str = "") -> None:
        cards.append(
            f'<div class="card {css}"><div class="k">{_e(key)}</div>'
            f'<div class="v">{_e(value)}</div><div class="s">{_e(sub)}</div></div>'
        )

    if (h := dyn.health) is not None:
        sub = (
            f"stopped after iteration {h.iteration}" if h.stop else f"after iteration {h.iteration}"
        )
        card("health", h.verdict, sub, _health_class(h.verdict))

    trained = dyn.series("train/reward_mean")[0] or [
        s for s in dyn.steps if any(k.startswith("train/") for k in dyn.rows[s])
    ]
    sampled = [s for s in dyn.steps if any(k.startswith("rollout/") for k in dyn.rows[s])]
    card(
        "iterations",
        str(len(trained)),
        f"updates; {len(sampled)} sampled" if sampled else "updates",
    )
    sets = _eval_sets(dyn)
    if sets:
        s = sets[0]
        best, last = _best(dyn, s)
        row = dyn.rows
        evaluated = dyn.series(f"eval/{s}/pass@1")[0]
        card("checkpoints evaluated", str(len(evaluated)), f"set {s}")
        if best is not None and last is not None:
            card("best pass@1", f"{row[best][f'eval/{s}/pass@1']:.4f}", f"checkpoint {best:05d}")
            first = evaluated[0]
            gain = row[last][f"eval/{s}/pass@1"] - row[first][f"eval/{s}/pass@1"]
            card(
                "last pass@1",
                f"{row[last][f'eval/{s}/pass@1']:.4f}",
                f"checkpoint {last:05d}; {gain:+.4f} vs {first:05d}",
            )
    else:
        card("evaluation", "none yet", "no committed evals/<c>")
    for name, label in (
        ("train/reward_mean", "last train reward"),
        ("verify/reward_mean", "last verify reward"),
    ):
        xs, ys = dyn.series(name)
        if xs:
            card(label, f"{ys[-1]:.4f}", f"iteration {xs[-1]}")
            break
    xs, ys = dyn.series("train/entropy")
    if xs:
        card("last entropy", format_number(ys[-1]), f"iteration {xs[-1]}")
    return f'<div class="cards">{"".join(cards)}</div>'


def _health_class(verdict: str) -> str:
    return {"healthy": "", "warning": "warning"}.get(verdict, "failing")


def _health_section(dyn: Dynamics) -> str:
    """The run's health (components/core/run_control.py): the verdict, its sentence, whether the run
    stopped, and every symptom as it appeared."""
    h = dyn.health
    stopped = (
        f" · the run stopped after iteration {h.iteration} (<code>health.stop_after</code>)"
        if h.stop
        else ""
    )
    rows = "".join(
        f"<tr><td>{e.iteration}</td><td>{_e(e.level)}</td><td>{_e(e.symptom)}</td>"
        f'<td class="msg">{_e(e.message)}</td></tr>'
        for e in h.events
    )
    events = (
        '<table class="events"><tr><th>iteration</th><th>level</th><th>symptom</th>'
        f"<th>what and the usual fixes</th></tr>{rows}</table>"
        if rows
        else ""
    )
    return (
        '<section id="run-health"><h2>Run health</h2>'
        f'<div class="health {_health_class(h.verdict)}"><b>{_e(h.verdict)}</b> after '
        f"iteration {h.iteration}{stopped}<br>{_e(h.summary)}</div>{events}"
        '<p class="note">Judged by train after every update from the figures below '
        "(docs/health.md). Dashed red lines in the plots mark where a verdict's iterations "
        "without signal began, and the stop.</p></section>"
    )


def render_html(
    dyn: Dynamics,
    run_id: str,
    root: str,
    plots: Mapping[str, bytes],
    extra: Mapping[str, tuple[str, bytes]] | None = None,
    gallery: str = "",
) -> str:
    """The dashboard page: header, evaluation table, one plot per family (``plots``:
    ``{family: PNG bytes}``), ``extra`` plots (``{title: (note, PNG bytes)}``), the last
    iteration's figures and how to open TensorBoard. Pure: the same inputs give the same text."""
    page = _Sections()
    if dyn.health is not None:
        page.add(_health_section(dyn), "run-health", "run health")
    _evaluation_sections(page, dyn)
    _plot_sections(page, plots, extra or {})
    if gallery:  # image prompts with their responses (gallery.py)
        page.add(gallery, "images", "image prompts")
    if dyn.rows:
        page.add(
            '<section id="last"><h2>Last figures</h2><p class="note">Each figure at the last '
            "step that recorded it, with the change since its value the step before. Every "
            "value of every step: <code>dynamics.csv</code> beside this page.</p>"
            f"{_last_tables(dyn)}</section>",
            "last",
            "last figures",
        )
    tb = RunLayout(root).tensorboard_dir
    page.add(
        '<section id="tensorboard"><h2>TensorBoard</h2><p class="note">The stages log the same '
        "figures, under the same names, to TensorBoard event files in the run (when "
        "<code>tracking.backends</code> includes tensorboard). Step-level detail (the viewer: "
        '<code>pip install -e ".[tensorboard]"</code>):</p>'
        f"<pre>tensorboard --logdir {_e(tb)}</pre></section>",
        "tensorboard",
        "tensorboard",
    )
    return _page(dyn, run_id, root, page)


class _Sections:
    """The page's sections in order, and the header's links to those that have one."""

    def __init__(self) -> None:
        self.html: list[str] = []
        self.nav: list[tuple[str, str]] = []

    def add(self, html: str, anchor: str | None = None, title: str = "") -> None:
        self.html.append(html)
        if anchor is not None:
            self.nav.append((anchor, title))


def _evaluation_sections(page: _Sections, dyn: Dynamics) -> None:
    """The evaluation tables (one per eval set), or a note that none is committed yet, and
    the standard benchmarks' table."""
    sets = _eval_sets(dyn)
    benchmarks = _benchmarks_table(dyn)
    if sets:
        tables = "".join(
            (f"<h3>{_e(s)}</h3>" if len(sets) > 1 else "") + _eval_table(dyn, s) for s in sets
        )
        page.add(
            '<section id="evaluation"><h2>Evaluation</h2><p class="note">Every evaluated '
            "checkpoint; 95% bootstrap confidence intervals in brackets; the best pass@1 "
            f"highlighted.</p>{tables}</section>",
            "evaluation",
            "eval table",
        )
    elif not benchmarks:
        page.add(
            '<section id="evaluation"><h2>Evaluation</h2><p class="note">No evaluation '
            "committed yet: the table and the eval plot appear once <code>evals/&lt;c&gt;</code>"
            " is.</p></section>"
        )
    if benchmarks:
        page.add(benchmarks, "benchmarks", "standard benchmarks")


def _plot_sections(
    page: _Sections, plots: Mapping[str, bytes], extra: Mapping[str, tuple[str, bytes]]
) -> None:
    """One section per family of figures, then the extra plots."""
    for family, png in plots.items():
        note = _NOTES.get(family, "")
        page.add(
            f'<section id="{_e(family)}"><h2>{_e(_HEADINGS.get(family, family))} '
            f"<code>{_e(family)}/…</code></h2>"
            + (f'<p class="note">{_e(note)}</p>' if note else "")
            + _img(png, f"{family} figures per iteration")
            + "</section>",
            family,
            family,
        )
    for i, (title, (note, png)) in enumerate(extra.items()):
        anchor = f"extra-{i}"
        page.add(
            f'<section id="{anchor}"><h2>{_e(title)}</h2>'
            + (f'<p class="note">{_e(note)}</p>' if note else "")
            + _img(png, title)
            + "</section>",
            anchor,
            title,
        )


def _page(dyn: Dynamics, run_id: str, root: str, page: _Sections) -> str:
    """The HTML document: head, header (run, step span, cards, links), sections, footer."""
    steps = dyn.steps
    span = f"steps {steps[0]}–{steps[-1]}" if steps else "no step committed yet"
    links = "".join(f'<a href="#{_e(a)}">{_e(t)}</a>' for a, t in page.nav)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>rlvr run {_e(run_id)}</title><style>{_CSS}</style></head><body><main>"
        f'<header><h1>Run {_e(run_id)}</h1><div class="path">{_e(root)} · {_e(span)}</div>'
        f"{_cards(dyn)}<nav>{links}</nav></header>{''.join(page.html)}"
        "<footer>Generated by <code>rlvr report</code> from the run's committed manifests. "
        "Beside this page in <code>report/</code>: <code>dynamics.csv</code> and "
        "<code>dynamics.json</code> (step × figure; <code>pandas.read_csv(…, "
        'index_col="step")</code>), <code>dynamics_&lt;family&gt;.png</code>, '
        "<code>report.md</code>.</footer></main></body></html>\n"
    )


def _cores() -> int:
    """The cores this process may run on (its affinity and cgroup cpuset, where known; not a CPU
    quota such as a pod's cpu limit, under which a split is only slower, never wrong)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: How long the parent waits for the child's plots before it kills it and draws them itself.
CHILD_TIMEOUT_S = 120.0


def _reap(pid: int, timeout_s: float) -> bool:
    """Wait for the child; True when it exited with status 0. A child that takes longer than
    `timeout_s` (a lock it inherited, held by a native thread) is killed: False."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) == 0
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return False
            time.sleep(0.02)
    except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): its files decide
        return False


def plot_families(dyn: Dynamics, families: list[str], out_dir: Path) -> dict[str, Path]:
    """``dynamics_<family>.png`` for each family that has a figure, into ``out_dir``.

    Drawing is all Python (layout, text extents) and took 1.8 s for a 12-iteration demo run,
    most of `rlvr run`'s report. Where it is safe, a forked child draws about half of the
    panels while this process draws the rest (the run is over, so a core is idle): fork
    copies every lock as it is, so only a process with no other Python thread forks, on a
    machine where it may use more than one core. The child reports by its exit status;
    whatever it did not write (it failed, or hung past CHILD_TIMEOUT_S and was killed) is drawn
    here after, so a failed child costs time, never a plot."""
    out_dir = Path(out_dir)
    cost = {f: len(family_panels(dyn, f)) for f in families}
    todo = [f for f in families if cost[f]]
    path = {f: out_dir / f"dynamics_{f}.png" for f in todo}
    split = hasattr(os, "fork") and len(todo) > 1 and _cores() > 1 and threading.active_count() == 1
    mine, theirs, pid = list(todo), [], 0
    if split:
        mine, load = [], {"mine": 0, "theirs": 0}
        for f in sorted(todo, key=lambda f: -cost[f]):  # largest first, to the lighter side
            side = "mine" if load["mine"] <= load["theirs"] else "theirs"
            (mine if side == "mine" else theirs).append(f)
            load[side] += cost[f]
        out_dir.mkdir(parents=True, exist_ok=True)
        pid = os.fork()
        if pid == 0:  # the child: draw its share, then leave without any cleanup of the parent's
            status = 1
            try:
                for f in theirs:
                    plot_family(dyn, f, path[f])
                status = 0
            finally:
                os._exit(status)
    ok = False
    try:
        for f in mine:
            plot_family(dyn, f, path[f])
    except BaseException:
        if pid:  # this process failed (or was interrupted): the child's plots are moot
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid, CHILD_TIMEOUT_S)
        raise
    if pid:
        ok = _reap(pid, CHILD_TIMEOUT_S)
    for f in theirs:
        if not ok or not path[f].exists():
            plot_family(dyn, f, path[f])
    return {f: path[f] for f in families if f in path}


def write_dashboard(
    dyn: Dynamics,
    out_dir: Path,
    run_id: str,
    root: str,
    extra: Mapping[str, tuple[str, Path]] | None = None,
    gallery: str = "",
) -> list[Path]:
    """Write ``dynamics_<family>.png`` for each family present, ``dynamics.csv``,
    ``dynamics.json`` and ``index.html`` into ``out_dir``; ``extra`` (``{title: (note, PNG)}``)
    adds other plots to the page. Returns the files written, the page last."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plot_families(dyn, dyn.families(), out_dir)
    written = list(pngs.values())
    plots = {family: png.read_bytes() for family, png in pngs.items()}
    (out_dir / "dynamics.csv").write_text(dyn.to_csv())
    (out_dir / "dynamics.json").write_text(dyn.to_json())
    written += [out_dir / "dynamics.csv", out_dir / "dynamics.json"]
    pages = {t: (note, Path(p).read_bytes()) for t, (note, p) in (extra or {}).items()}
    index = out_dir / "index.html"
    index.write_text(render_html(dyn, run_id, root, plots, pages, gallery))
    return [*written, index]
