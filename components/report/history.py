"""The run's evaluation history: one row per committed evaluation, for the history plot of an
evaluation's report and of the run's."""

from __future__ import annotations

import json

from components.core.commit import SUCCESS
from components.core.layout import RunLayout, committed_indices
from components.core.store import Store, join

__all__ = ["history"]


def history(store: Store, layout: RunLayout, current: int, current_metrics: dict) -> list[dict]:
    """One row per evaluated checkpoint, in order: pass@1 (with its CI), mean@n and the train
    reward of the iteration that produced it; `current`'s row from `current_metrics` (an
    evaluation not yet committed)."""
    rows = []
    for c in committed_indices(store, layout.evals_dir):
        if c == current:
            continue
        m = json.loads(store.read_text(layout.eval_metrics(c)))
        if "overall" in m:  # a checkpoint evaluated on lm-eval suites alone has no pass@1
            rows.append(_history_row(store, layout, c, m))
    rows.append(_history_row(store, layout, current, current_metrics))
    return sorted(rows, key=lambda r: r["checkpoint"])


def _history_row(store: Store, layout: RunLayout, c: int, m: dict) -> dict:
    ov = m["overall"]
    n = m["n"]
    row = {"checkpoint": c, "pass@1": ov["pass@1"], "mean@n": ov[f"mean@{n}"]}
    if "pass@1_ci95" in ov:
        row["pass@1_ci95"] = ov["pass@1_ci95"]
    if c > 0:  # the train reward of the iteration that produced checkpoint c
        try:
            manifest = json.loads(store.read_text(join(layout.checkpoint(c), SUCCESS)))
            row["reward"] = manifest["stats"]["train/reward_mean"]
        except Exception:  # noqa: BLE001 - reward is optional decoration of the history
            pass
    return row
