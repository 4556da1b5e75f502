"""Where a run's time went: every task's spans from the manifests, a Gantt chart, the critical path.

Each committed output's manifest carries the timeline of the step that wrote it
(components/core/warm.py): `start` (process start to the stage object's first step: interpreter,
imports, the KFP executor), `wait` (for another stage's commit), `load` (model / engine / new
weights), `read` (inputs), `work`, `commit` (writing and committing outputs). This module gathers
them for a run and computes:

- the wall time from the first process start to the last commit;
- per stage, the seconds in each kind of span;
- the fixed-cost share: the part of the wall time that is not stage work on the critical path
  (1 - critical work / wall);
- the critical path a cluster would see, with each stage on its own pool: the longest chain
  through the data dependencies (generate i after checkpoint max(0, i - k); verify i after
  generate i; train i after verify i and train i-1; evaluate c after train c-1) and each worker's
  own order, every node weighted by its measured non-wait time (plus its worker's cold start).

A step rerun alone after the run (`rlvr stage ... --force`, marked `one_shot` in its manifest's
timeline) is left out of all of it, and named: it may come hours later, and counting it would
stretch the wall time over the idle hours in between.

Run as `rlvr report RUN_DIR` (through run_report.write_run_report) or `python -m components.report.timeline
RUN_DIR`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.commit import SUCCESS
from components.core.layout import RunLayout
from components.core.stages import ITERATION_STAGES, STAGES
from components.core.store import Store, StoreError, get_store, join

SPAN_KINDS = ("start", "wait", "load", "read", "work", "commit")
#: Spans only some runs have (evaluate's standard benchmarks; the full train state written in
#: the background, on a row of its own, `state`; a local evaluation's waits for its turn on the
#: device, cut out of the spans they fell in, `turn`), shown where they occur.
OPTIONAL_KINDS = ("lm_eval", "send", "state", "turn")
IDLE_KINDS = ("wait", "turn")
"""Spans a step waited in: for its inputs (`wait`) or for its turn on the device (`turn`)."""


def shown_kinds(present: set[str]) -> tuple[str, ...]:
    """The span kinds of a chart or table: the usual ones, and the optional ones present,
    before `commit`."""
    extra = tuple(k for k in OPTIONAL_KINDS if k in present)
    return (*SPAN_KINDS[:-1], *extra, SPAN_KINDS[-1])


COLORS = {
    "start": "#9e9e9e",
    "wait": "#eeeeee",
    "load": "#ff9800",
    "read": "#03a9f4",
    "work": "#4caf50",
    "lm_eval": "#2e7d32",
    "send": "#e91e63",
    "state": "#795548",
    "turn": "#c8e6c9",
    "commit": "#9c27b0",
}
STAGE_ORDER = STAGES
#: Points of the iteration number over each step of the chart (the tick labels are 10).
ITERATION_LABEL_SIZE = 8.5


@dataclass
class Step:
    """One committed step of one task."""

    task: str
    stage: str
    iteration: int
    spans: list[tuple[str, float, float]]
    staleness: int = 0
    pid: int = 0

    def seconds(self, *kinds: str) -> float:
        return sum(e - s for k, s, e in self.spans if not kinds or k in kinds)

    @property
    def busy(self) -> float:
        """Time the step occupied its worker, waiting excluded."""
        return sum(e - s for k, s, e in self.spans if k not in IDLE_KINDS)

    def _split(self) -> int:
        """Index of the last `wait` span: spans before it are setup (cold start, a prewarm) that
        may overlap the step's inputs being produced; spans after it are the step proper."""
        waits = [i for i, (k, _, _) in enumerate(self.spans) if k == "wait"]
        return waits[-1] if waits else 0

    @property
    def setup(self) -> float:
        return sum(e - s for k, s, e in self.spans[: self._split()] if k not in IDLE_KINDS)

    @property
    def proper(self) -> float:
        return sum(e - s for k, s, e in self.spans[self._split() :] if k not in IDLE_KINDS)


@dataclass
class RunTimeline:
    steps: list[Step] = field(default_factory=list)
    reruns: list[Step] = field(default_factory=list)
    """Steps rerun one at a time (`rlvr stage ... --force`) in a run its warm workers ran: left
    out of the wall time, the critical path and the chart (they may come hours later)."""

    @property
    def start(self) -> float:
        return min(s for st in self.steps for _, s, _ in st.spans)

    @property
    def end(self) -> float:
        return max(e for st in self.steps for _, _, e in st.spans)

    @property
    def wall(self) -> float:
        return self.end - self.start if self.steps else 0.0

    def tasks(self) -> list[str]:
        def key(task: str) -> tuple:
            stage = task.split("-")[0]
            return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else 9, task)

        return sorted({s.task for s in self.steps}, key=key)

    def by_stage(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for st in self.steps:
            row = out.setdefault(st.stage, dict.fromkeys(SPAN_KINDS, 0.0))  # and any optional
            for kind, s, e in st.spans:
                row[kind] = row.get(kind, 0.0) + (e - s)
        return out


def _stage_of(task: str) -> str:
    return task.split("-")[0]


def _manifest_uris(store: Store, root: str) -> Iterable[str]:
    """Every `_SUCCESS` under the run's stage outputs."""
    for base in RunLayout(root).stage_outputs:
        for f in store.list_files(base):
            if f.endswith(SUCCESS):
                yield join(base, f)


def load_timeline(store: Store, root: str) -> RunTimeline:
    steps, one_shot = [], set()
    for uri in _manifest_uris(store, root):
        try:
            stats = json.loads(store.read_text(uri)).get("stats", {})
        except (StoreError, ValueError):
            continue
        tl = stats.get("timeline")
        if not tl or not tl.get("spans"):
            continue
        stage = _stage_of(tl["task"])
        staleness = 0
        if stage == "generate" and "policy_version" in stats:
            staleness = int(tl["iteration"]) - int(stats["policy_version"])
        steps.append(
            Step(
                tl["task"],
                stage,
                int(tl["iteration"]),
                [(k, float(s), float(e)) for k, s, e in tl["spans"]],
                staleness,
                int(tl.get("pid", 0)),
            )
        )
        if tl.get("one_shot"):
            one_shot.add(id(steps[-1]))
    steps.sort(key=lambda s: (s.stage, s.task, s.iteration))
    if len(one_shot) == len(steps):  # a run made step by step: its steps are its timeline
        return RunTimeline(steps)
    return RunTimeline(
        [s for s in steps if id(s) not in one_shot], [s for s in steps if id(s) in one_shot]
    )


def critical_path(tl: RunTimeline) -> tuple[float, list[Step]]:
    """Length (s) and steps of the longest dependency chain, each step weighted by its busy
    time. Dependencies: each worker's own order, and the data each step reads (module doc)."""
    by_key: dict[tuple[str, int], list[Step]] = {}
    for st in tl.steps:
        by_key.setdefault((st.stage, st.iteration), []).append(st)
    # Each step's proper part begins after its inputs were committed, so ordering by that
    # moment visits every step after the steps it depends on.
    # A full train state, written in the background, is no stage's input: never on the path.
    nodes = [s for s in tl.steps if s.stage != "state"]
    order = sorted(nodes, key=lambda s: (s.spans[s._split()][2] if s.spans else 0.0, s.task))
    finish: dict[int, float] = {}
    prev: dict[int, Step | None] = {}
    last_of_task: dict[str, Step] = {}

    def preds(st: Step) -> list[Step]:
        out = []
        if st.task in last_of_task:
            out.append(last_of_task[st.task])
        i = st.iteration
        if st.stage == "generate":
            out += by_key.get(("train", i - st.staleness - 1), [])
        elif st.stage == "verify":
            out += by_key.get(("generate", i), [])
        elif st.stage == "train":
            out += by_key.get(("verify", i), []) + by_key.get(("train", i - 1), [])
        elif st.stage == "evaluate":
            out += by_key.get(("train", i - 1), [])
            if "gather" in st.task or st.task == "evaluate":
                out += [s for s in by_key.get(("evaluate", i), []) if "shard" in s.task]
        return [p for p in out if id(p) in finish]

    for st in order:
        ps = preds(st)
        best = max(ps, key=lambda p: finish[id(p)], default=None)
        # A step's setup (a worker's cold start, an engine built ahead) runs on its worker while
        # the step's inputs are still being produced; the step proper starts when both are done.
        own = finish[id(last_of_task[st.task])] if st.task in last_of_task else 0.0
        pred_finish = finish[id(best)] if best is not None else 0.0
        if own + st.setup > pred_finish:
            best = last_of_task.get(st.task)  # its own worker's setup is what the step waited for
        finish[id(st)] = max(pred_finish, own + st.setup) + st.proper
        prev[id(st)] = best
        last_of_task[st.task] = st
    if not finish:
        return 0.0, []
    end = max(order, key=lambda s: finish[id(s)])
    path = []
    node: Step | None = end
    while node is not None:
        path.append(node)
        node = prev[id(node)]
    return finish[id(end)], path[::-1]


def _intervals(tl: RunTimeline) -> list[tuple[int, float, float]]:
    """(iteration, start, end) of each iteration after the first: from the end of train i-1 to
    the end of train i, for back-to-back steps of one train worker (not across a resume)."""
    trains = {s.iteration: s for s in tl.steps if s.stage == "train"}
    return [
        (i, max(e for _, _, e in trains[i - 1].spans), max(e for _, _, e in trains[i].spans))
        for i in sorted(trains)
        if i - 1 in trains and trains[i - 1].pid == trains[i].pid
    ]


def _inside(step: Step, kinds: tuple[str, ...], a: float, b: float) -> float:
    """Seconds of `step`'s spans of these kinds that lie inside [a, b]."""
    return sum(max(0.0, min(e, b) - max(s, a)) for k, s, e in step.spans if k in kinds)


def iteration_times(tl: RunTimeline) -> list[tuple[int, float, float]]:
    """(iteration, seconds, stage work on the critical path) of each iteration after the first
    (`_intervals`), against the work of generate, verify and train i (only as much of it as lies
    inside the interval: with bounded staleness generate runs ahead, beside the previous
    train)."""
    return [
        (
            i,
            b - a,
            sum(
                _inside(st, ("work",), a, b)
                for st in tl.steps
                if st.iteration == i and st.stage in ITERATION_STAGES
            ),
        )
        for i, a, b in _intervals(tl)
    ]


def handoff_times(tl: RunTimeline) -> list[tuple[int, float, float]]:
    """(iteration, seconds, iteration seconds) of the policy handoff in each iteration after the
    first (`_intervals`): train committing its checkpoint plus generate loading one (checkpoint
    i, or i - k with bounded staleness), only as much of each span as lies inside the interval;
    with sharded generation, the slowest shard's load (verify waits for every shard)."""
    out = []
    for i, a, b in _intervals(tl):
        steps = [st for st in tl.steps if st.iteration == i]
        # over the weight channel generate starts after train's broadcast ("send"), and
        # train's writing of the checkpoint overlaps its sampling
        commit = sum(
            _inside(st, ("send",) if st.seconds("send") else ("commit",), a, b)
            for st in steps
            if st.stage == "train"
        )
        loads = [_inside(st, ("load",), a, b) for st in steps if st.stage == "generate"]
        out.append((i, commit + max(loads, default=0.0), b - a))
    return out


def summary(tl: RunTimeline) -> dict[str, Any]:
    length, path = critical_path(tl)
    work_on_path = sum(s.seconds("work") + s.seconds("lm_eval") for s in path)  # both are work
    iters = iteration_times(tl)
    total = sum(t for _, t, _ in iters)
    handoff = sum(h for _, h, _ in handoff_times(tl))
    first_work = min((s for st in path for k, s, _ in st.spans if k == "work"), default=tl.start)
    return {
        "wall_s": tl.wall,
        "startup_s": first_work - tl.start if tl.steps else 0.0,
        "critical_path_s": length,
        "critical_path_work_s": work_on_path,
        "fixed_share": 1.0 - work_on_path / tl.wall if tl.wall > 0 else 0.0,
        "iteration_s": total / len(iters) if iters else 0.0,
        "iteration_fixed_share": 1.0 - sum(w for *_, w in iters) / total if total > 0 else 0.0,
        "handoff_s": handoff / len(iters) if iters else 0.0,
        "handoff_share": handoff / total if total > 0 else 0.0,
        "stages": tl.by_stage(),
        "steps": len(tl.steps),
        "reruns": sorted(f"{s.stage} {s.iteration:05d}" for s in tl.reruns),
    }


def format_summary(s: dict[str, Any]) -> str:
    present = {k for row in s["stages"].values() for k, v in row.items() if v}
    kinds = shown_kinds(present)
    lines = [
        f"time: {s['wall_s']:.1f} s wall, of it {s['startup_s']:.1f} s start-up; an iteration "
        f"{s['iteration_s']:.2f} s, fixed cost {100 * s['iteration_fixed_share']:.0f}% of it "
        f"(the policy handoff, checkpoint commit and load, {s.get('handoff_s', 0.0):.2f} s: "
        f"{100 * s.get('handoff_share', 0.0):.0f}%); critical path {s['critical_path_s']:.1f} s ({s['critical_path_work_s']:.1f} s stage "
        f"work; fixed cost {100 * s['fixed_share']:.0f}% of the wall time)",
        f"{'stage':>10} " + " ".join(f"{k:>8}" for k in kinds),
    ]
    for stage in sorted(s["stages"], key=lambda x: STAGE_ORDER.index(x) if x in STAGE_ORDER else 9):
        row = s["stages"][stage]
        lines.append(f"{stage:>10} " + " ".join(f"{row.get(k, 0.0):8.1f}" for k in kinds))
    if s.get("reruns"):
        lines.append(
            f"not counted: {len(s['reruns'])} step(s) rerun alone since the run "
            f"({', '.join(s['reruns'])}; rlvr stage)"
        )
    return "\n".join(lines)


def plot_timeline(tl: RunTimeline, out_png: Path, title: str = "") -> Path:
    """A Gantt chart: one row per task, spans colored by kind, the critical path outlined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tasks = tl.tasks()
    t0 = tl.start
    _, path = critical_path(tl)
    on_path = {id(s) for s in path}
    fig = Figure(figsize=(11.0, 1.2 + 0.55 * max(len(tasks), 1)))
    ax = fig.add_subplot(1, 1, 1)
    for row, task in enumerate(tasks):
        for st in (s for s in tl.steps if s.task == task):
            for kind, s, e in st.spans:
                ax.broken_barh(
                    [(s - t0, max(e - s, 1e-3))],
                    (row - 0.35, 0.7),
                    facecolors=COLORS.get(kind, "#000000"),
                    linewidth=0,
                )
            if id(st) in on_path:
                first = st is path[0]  # the path starts with this step's setup, if it has one
                spans = st.spans if first else st.spans[st._split() :]
                busy = [(s - t0, e - s) for k, s, e in spans if k not in IDLE_KINDS]
                ax.broken_barh(
                    busy, (row - 0.42, 0.84), facecolors="none", edgecolors="#d32f2f", linewidth=1.2
                )
            label_at = min(s for k, s, _ in st.spans if k not in IDLE_KINDS) - t0
            ax.text(
                label_at,
                row + 0.45,
                str(st.iteration),
                fontsize=ITERATION_LABEL_SIZE,
                va="bottom",
                color="#333",
            )
    ax.set_yticks(range(len(tasks)))
    ax.set_yticklabels(tasks)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first process started")
    ax.set_xlim(0, tl.wall * 1.01 if tl.wall else 1)
    present = {kind for st in tl.steps for kind, _, _ in st.spans}
    handles = [Patch(facecolor=COLORS[k], label=k) for k in shown_kinds(present)]
    handles.append(Patch(facecolor="none", edgecolor="#d32f2f", label="critical path"))
    ax.legend(
        handles=handles,
        ncol=len(handles),
        loc="upper center",
        fontsize=8,
        bbox_to_anchor=(0.5, -0.22 if len(tasks) > 3 else -0.35),
        frameon=False,
    )
    s = summary(tl)
    ax.set_title(
        title
        or f"wall {s['wall_s']:.1f} s: start-up {s['startup_s']:.1f} s, then "
        f"{s['iteration_s']:.2f} s an iteration ({100 * s['iteration_fixed_share']:.0f}% of it "
        f"not stage work); critical path {s['critical_path_s']:.1f} s",
        fontsize=10,
    )

    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out_png, format="png", dpi=100, metadata={"Software": None})
    return out_png


def summarize_run(store: Store, root: str) -> str | None:
    tl = load_timeline(store, root)
    return format_summary(summary(tl)) if tl.steps else None


if __name__ == "__main__":
    run_dir = sys.argv[1]
    st = get_store(run_dir)
    timeline = load_timeline(st, run_dir.rstrip("/"))
    print(format_summary(summary(timeline)))
    if len(sys.argv) > 2:
        print(plot_timeline(timeline, Path(sys.argv[2])))
