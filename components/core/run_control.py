"""Run control: the health record a run carries, and the stop that ends it (docs/health.md).

Train judges every iteration (components/train/health.py) and writes the result, a
:class:`Health`, into the checkpoint's manifest (stats["health"]). The dashboard, the run
report and the CLI read it back from there (:func:`latest`).

A run that is told to stop writes ``status/stopped.json`` (:class:`StopRecord`) before it
commits the checkpoint of the iteration that decided it; every worker checks it between
steps and while it waits (:class:`StopWatch`), and ends cleanly past that iteration (evaluate
past its checkpoint). The record holds for as long as that checkpoint is current under the
config and the health rule is unchanged: change either and the run goes on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, Field

from components.core.config import HealthSection, RunConfig

__all__ = ["Event", "Health", "StopRecord", "StopWatch", "figures", "latest", "read_stop"]

Verdict = Literal["healthy", "warning", "collapsed", "saturated", "no_signal"]


#: The verdicts that say the run is not learning.
FAILING = ("collapsed", "saturated", "no_signal")


class Event(BaseModel):
    """A symptom as it appeared."""

    iteration: int
    symptom: str
    """no_signal, collapsed, saturated, truncation, update_kl, logprob_gap, reward, entropy,
    recovered."""
    level: Literal["note", "warning", "verdict"]
    message: str
    since: int | None = None
    """A verdict's first iteration without signal (the iteration its sentence names)."""


class Health(BaseModel):
    """The health of a run after `iteration` (train's checkpoint manifest, stats["health"])."""

    iteration: int = -1
    verdict: Verdict = "healthy"
    summary: str = "healthy"
    """One sentence: the verdict and, where clear, its cause and the usual fixes."""
    stop: bool = False
    """`health.stop_after` no-signal iterations in a row: the run stops after this iteration."""
    streak: int = 0
    """No-signal iterations in a row, up to this one."""
    streak_start: int | None = None
    streak_kind: str = ""
    """What the streak's groups agree on: wrong, right or equal."""
    had_signal: bool = False
    first: dict[str, float] = Field(default_factory=dict)
    """Iteration 0's figures: the baselines of the surges."""
    best_reward2: float | None = None
    """The best mean reward of two iterations in a row so far."""
    last_reward: float | None = None
    low_reward: int = 0
    active: list[str] = Field(default_factory=list)
    """The symptoms present at this iteration (an event is raised when one appears)."""
    events: list[Event] = Field(default_factory=list)

    def warnings(self) -> list[Event]:
        return [e for e in self.events if e.level != "note"]

    def markers(self) -> list[tuple[int, str]]:
        """(iteration, label) of each verdict, at the first iteration it names, and of the
        stop: what the dashboard's plots mark."""
        out = [
            (e.since, e.symptom)
            for e in self.events
            if e.level == "verdict" and e.since is not None
        ]
        if self.stop:
            out.append((self.iteration, "stopped"))
        return out


def figures(h: Health) -> dict[str, float]:
    """The health as figures for trackers and the dashboard (``health/…``)."""
    return {
        "health/no_signal_streak": float(h.streak),
        "health/warnings": float(len(h.warnings())),
        "health/failing": float(h.verdict in FAILING),
        "health/stop": float(h.stop),
    }


def rule_digest(rule: HealthSection) -> str:
    """What a stop record was decided under: the health rule's settings."""
    text = json.dumps(rule.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StopRecord(BaseModel):
    """``<run>/status/stopped.json``: the run stops after `after_iteration`."""

    after_iteration: int
    verdict: Verdict
    summary: str
    rule: str
    """:func:`rule_digest` of the health section that decided it."""
    at: float

    def beyond(self, stage: str, step: int) -> bool:
        """Whether `stage`'s step `step` is past the stop: iterations after it; for evaluate
        (whose steps are checkpoints), checkpoints after the one the last iteration
        committed."""
        return step > self.after_iteration + (1 if stage == "evaluate" else 0)


def stop_uri(root: str) -> str:
    from components.core.layout import RunLayout

    return RunLayout(root).stop_record


def write_stop(cfg: RunConfig, health: Health) -> StopRecord:
    """Record that the run stops after `health.iteration` (before its checkpoint commits)."""
    import time

    from components.core.layout import RunLayout, store_for

    record = StopRecord(
        after_iteration=health.iteration,
        verdict=health.verdict,
        summary=health.summary,
        rule=rule_digest(cfg.health),
        at=time.time(),
    )
    store_for(cfg).write_text(stop_uri(RunLayout.of(cfg).root), record.model_dump_json(indent=1))
    return record


def read_stop(cfg: RunConfig) -> StopRecord | None:
    """The run's stop record if it holds: health.stop_after is on, the rule is the one that
    decided it, and the checkpoint of the iteration that decided it is committed, current under
    this config, and itself records the stop (a config change that redoes that iteration, or
    any before it, or a changed rule, lets the run go on)."""
    from components.core import lineages
    from components.core.layout import RunLayout, store_for
    from components.core.store import StoreError

    if cfg.health.stop_after == 0:
        return None
    store, layout = store_for(cfg), RunLayout.of(cfg)
    try:
        record = StopRecord.model_validate_json(store.read_text(stop_uri(layout.root)))
    except (StoreError, OSError, ValueError):
        return None
    if record.rule != rule_digest(cfg.health):
        return None
    s = record.after_iteration
    try:
        current = lineages.current(cfg, store, layout, "train", s)
        decided = recorded_health(store, layout, s + 1)  # the checkpoint's own health: stop?
    except StoreError:
        return None
    return record if current and decided is not None and decided.stop else None


class StopWatch:
    """A worker's view of the stop record: read while the record is absent (one existence
    check per look), validated once it appears, final once it holds."""

    every_s = 0.2

    def __init__(self, cfg: RunConfig | None) -> None:
        """`cfg` None: a worker outside any run (a test's stage): never stopped."""
        from components.core.layout import RunLayout, store_for

        self.cfg = cfg
        self.store = store_for(cfg) if cfg is not None else None
        self.uri = stop_uri(RunLayout.of(cfg).root) if cfg is not None else ""
        self.record: StopRecord | None = None
        self._checked = 0.0

    def __call__(self, *, force: bool = False) -> StopRecord | None:
        """The record once it holds; a record that does not hold (yet: train writes it before
        the checkpoint it names commits) is checked again at most every `every_s`, or now
        with `force`."""
        import time

        if self.cfg is None or self.cfg.health.stop_after == 0:
            return None
        due = force or time.monotonic() - self._checked >= self.every_s
        if self.record is None and due:
            self._checked = time.monotonic()
            if self.store.exists(self.uri):
                self.record = read_stop(self.cfg)
        return self.record

    def past(self, stage: str, step: int, *, force: bool = False) -> bool:
        """Whether the run stopped before `stage`'s step `step`."""
        record = self(force=force)
        return record is not None and record.beyond(stage, step)


def recorded_health(store, layout, iteration: int) -> Health | None:
    """The health after `iteration - 1`, as checkpoint `iteration`'s manifest holds it (None:
    not committed, or no record)."""
    from components.core.commit import read_manifest
    from components.core.store import StoreError

    if iteration == 0:
        return None
    try:
        stats = read_manifest(store, layout.checkpoint(iteration)).get("stats") or {}
        h = Health.model_validate(stats["health"])
    except (StoreError, KeyError, ValueError):
        return None
    return h if h.iteration == iteration - 1 else None


def latest(store, root: str) -> Health | None:
    """The health after the newest committed update of the run at `root` that has a record
    (its checkpoint's manifest); None before the first, or for a run recorded before health
    existed."""
    from components.core.commit import read_manifest
    from components.core.layout import RunLayout, committed_indices
    from components.core.store import StoreError

    layout = RunLayout(root.rstrip("/"))
    for c in reversed(committed_indices(store, layout.checkpoints_dir)):
        if c == 0:
            return None
        try:
            record = (read_manifest(store, layout.checkpoint(c)).get("stats") or {}).get("health")
            if record:  # the newest that has one, as the dashboard shows
                return Health.model_validate(record)
        except (StoreError, ValueError):
            continue
    return None
