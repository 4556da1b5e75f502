"""A run's training dynamics as one table: a row per iteration, a column per figure.

:func:`collect` reads every committed manifest of a run (never its Parquet data): the rollouts
and scored outputs of each iteration (all shards, combined with
:func:`~components.core.figures.combine_shards`), the train stats of each checkpoint >= 1
(checkpoint i + 1 is what train of iteration i commits) and each evaluation's ``metrics.json``.
The figures are named by :mod:`components.core.figures`, the names the trackers log, and the step
is the iteration (an evaluation's step is its checkpoint index c: the policy that iteration c
samples with).

:meth:`Dynamics.to_csv` writes ``report/dynamics.csv``: a ``step`` column, then one column per
figure name; a cell is empty where that step has no value. Load it with
``pandas.read_csv(path, index_col="step")``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from components.core.commit import SUCCESS, committed_layout
from components.core.figures import FAMILIES, combine_shards, eval_figures, stage_figures
from components.core.layout import ROLLOUTS, SCORED, RunLayout, committed_indices
from components.core.run_control import Health
from components.core.store import Store, StoreError, join

__all__ = ["Dynamics", "collect", "family_of"]

#: Parallel reads: an S3 store answers each manifest in one request; threads hide the latency.
_READERS = 16


def family_of(name: str) -> str:
    """The family of a figure name (``train/loss`` -> ``train``)."""
    return name.split("/", 1)[0]


def _order(name: str) -> tuple[int, str]:
    family = family_of(name)
    rank = FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)
    return rank, name


@dataclass
class Dynamics:
    """Figures per step. ``rows[step][name]`` is a finite float; absent where not recorded."""

    rows: dict[int, dict[str, float]] = field(default_factory=dict)
    health: Health | None = None
    """The run's health after its newest update (components/core/run_control.py)."""

    @property
    def steps(self) -> list[int]:
        return sorted(self.rows)

    @property
    def columns(self) -> list[str]:
        """Every figure name, by family (``FAMILIES`` order), then by name."""
        return sorted({k for row in self.rows.values() for k in row}, key=_order)

    def families(self) -> list[str]:
        """The families that have at least one figure, in ``FAMILIES`` order."""
        present = {family_of(c) for c in self.columns}
        return [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """The steps that recorded ``name`` and its values there."""
        xs = [s for s in self.steps if name in self.rows[s]]
        return xs, [self.rows[s][name] for s in xs]

    def last(self, family: str | None = None) -> tuple[int | None, dict[str, float]]:
        """The last step that recorded a figure (of ``family``) and that step's figures."""
        for step in reversed(self.steps):
            row = {
                k: v for k, v in self.rows[step].items() if family is None or family_of(k) == family
            }
            if row:
                return step, row
        return None, {}

    def to_csv(self) -> str:
        """``step`` then one column per figure; values as Python writes floats (exact)."""
        columns = self.columns
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["step", *columns])
        for step in self.steps:
            row = self.rows[step]
            writer.writerow([step, *(repr(row[c]) if c in row else "" for c in columns)])
        return buf.getvalue()

    def to_json(self) -> str:
        """``{"columns": [...], "rows": [{"step": s, name: value, ...}, ...]}``."""
        rows = [
            {"step": s, **dict(sorted(self.rows[s].items(), key=lambda kv: _order(kv[0])))}
            for s in self.steps
        ]
        return json.dumps({"columns": self.columns, "rows": rows}, indent=1)

    def add(self, step: int, figures: dict[str, float]) -> None:
        if figures:
            self.rows.setdefault(step, {}).update(
                {k: v for k, v in figures.items() if math.isfinite(v)}
            )


def _iteration_outputs(layout: RunLayout, files: Iterable[str]) -> dict[tuple[int, str], list[str]]:
    """``{(iteration, "rollouts" | "scored"): [manifest uris]}`` from one listing of the run's
    iterations: each committed output's parts, by the rule every stage reads them with
    (:func:`~components.core.commit.committed_layout`); an output that is not committed whole
    (a shard still running, mixed shard counts) is left out."""
    listed: dict[tuple[int, str], list[str]] = {}
    for f in files:
        parts = f.split("/", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1] in (ROLLOUTS, SCORED):
            listed.setdefault((int(parts[0]), parts[1]), []).append(parts[2])
    out: dict[tuple[int, str], list[str]] = {}
    for (i, kind), rel in listed.items():
        uri = layout.iteration_output(i, kind)
        try:
            parts = committed_layout(uri, rel)
        except StoreError:  # NotCommittedError included
            continue
        out[(i, kind)] = [join(uri, d, SUCCESS) for d in parts]
    return out


def _read_json(store: Store, uri: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.read_text(uri))
    except (StoreError, OSError, ValueError):
        return None  # removed or rewritten while we read: the next report has it


def collect(store: Store, root: str) -> Dynamics:
    """Every committed figure of the run at ``root``, one row per iteration.

    Reads manifests (and each evaluation's ``metrics.json``) only: a run of thousands of
    iterations costs a few listings and one small read per committed output.
    """
    layout = RunLayout(root.rstrip("/"))
    outputs = _iteration_outputs(layout, store.list_files(layout.iterations_dir))
    checkpoints = [c for c in committed_indices(store, layout.checkpoints_dir) if c >= 1]
    evals = committed_indices(store, layout.evals_dir)

    jobs: list[tuple[str, Callable[[], Any]]] = []
    for (i, kind), paths in sorted(outputs.items()):
        for p in paths:
            jobs.append((f"{kind}:{i}", lambda p=p: _read_json(store, p)))
    for c in checkpoints:
        uri = join(layout.checkpoint(c), SUCCESS)
        jobs.append((f"train:{c - 1}", lambda uri=uri: _read_json(store, uri)))
    for c in evals:
        m_uri, s_uri = join(layout.evals(c), "metrics.json"), join(layout.evals(c), SUCCESS)
        jobs.append(
            (f"eval:{c}", lambda m=m_uri, s=s_uri: (_read_json(store, m), _read_json(store, s)))
        )
    with ThreadPoolExecutor(max_workers=min(_READERS, max(1, len(jobs)))) as pool:
        results = list(pool.map(lambda job: job[1](), jobs))

    shards: dict[tuple[str, int], list[dict[str, float]] | None] = {}
    health: tuple[int, dict] | None = None
    dyn = Dynamics()
    for (key, _), result in zip(jobs, results, strict=True):
        kind, step_text = key.split(":")
        step = int(step_text)
        if kind == "eval":
            metrics, manifest = result
            if metrics is not None:
                stats = (manifest or {}).get("stats") or {}
                dyn.add(step, eval_figures(metrics, stats))
            continue
        stage = {"rollouts": "generate", "scored": "verify", "train": "train"}[kind]
        if result is None:  # a shard vanished while we read: none of this output, not a part
            shards[(stage, step)] = None
            continue
        stats = result.get("stats") or {}
        if stage == "train" and stats.get("iteration", step) != step:
            continue  # not the train stats of this iteration (e.g. an imported checkpoint)
        if stage == "train" and stats.get("health"):
            newest = step if health is None or step > health[0] else health[0]
            health = (newest, stats["health"] if newest == step else health[1])
        if (parts := shards.setdefault((stage, step), [])) is not None:
            parts.append(stage_figures(stage, stats))
    for (_, step), figures in sorted(shards.items()):
        if figures:
            dyn.add(step, combine_shards(figures))
    if health is not None:
        with contextlib.suppress(ValueError):  # a record of another rlvr version: no verdict
            dyn.health = Health.model_validate(health[1])
    return dyn
