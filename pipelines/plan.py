"""Before the workers of a segment read anything: uncommit every output that is stale.

Workers start together and meet in the store (pipelines/train.py). A committed output that its
stage is about to redo (the config changed, an upstream output was redone) would otherwise be
trusted by a downstream worker before the redo lands: verify would skip over rollouts generate is
regenerating. So the init task of every attempt walks the segment in data order, finds the first
output that is committed but not up to date (or missing), removes the `_SUCCESS` of everything
downstream of it that a worker could read before it is redone (its own too when it is stale),
and commits the attempt's plan (`status/<attempt>/plan/`); workers wait for the plan before
their first read. Outputs upstream of
that point are current by construction, and each stage still checks its own lineage before it
skips a step.
"""

from __future__ import annotations

import logging
from typing import Any

from components.core import lineages
from components.core.commit import SUCCESS, OutputDir, committed_parts
from components.core.config import RunConfig
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.run_control import read_stop, stop_uri
from components.core.stages import ITERATION_STAGES
from components.core.store import Store, StoreError, join
from components.core.warm import RunStatus, Segment, segment_eval_checkpoints
from components.core.warm import segment as segment_of

log = logging.getLogger("rlvr.plan")

ORDER = ITERATION_STAGES


def _state(cfg: RunConfig, store: Store, layout: RunLayout, stage: str, i: int) -> str:
    """'current', 'stale' (committed, computed from other inputs) or 'missing', read from the
    stages' descriptions (components/core/lineages.py): no stage is built to plan."""
    uri = {"generate": layout.rollouts, "verify": layout.scored}.get(stage)
    try:
        committed_parts(store, uri(i) if uri else layout.checkpoint(i + 1))
    except StoreError:
        return "missing"
    shards = {"generate": cfg.generate.num_shards, "verify": cfg.verify.num_shards}.get(stage, 1)
    try:
        fresh = all(
            lineages.current(cfg, store, layout, stage, i, s, shards) for s in range(shards)
        )
    except StoreError:  # an input of a committed output is gone: it cannot be trusted
        return "stale"
    return "current" if fresh else "stale"


def first_out_of_date(cfg: RunConfig, seg: Segment) -> tuple[int, str, str] | None:
    """(iteration, stage, 'stale' | 'missing') of the first output of the segment, in data order,
    that is not current; None when the whole segment is current (evaluations aside), up to
    the iteration after which the run stopped (components/core/run_control.py), if it did."""
    store, layout = store_for(cfg), RunLayout.of(cfg)
    stop = read_stop(cfg)
    for i in seg.iterations:
        if stop is not None and stop.beyond("train", i):
            break  # the run stopped under its health rule before this iteration
        for name in ORDER:
            state = _state(cfg, store, layout, name, i)
            if state != "current":
                return i, name, state
    return None


def _uncommit(store: Store, uri: str) -> bool:
    """Remove the `_SUCCESS` of a committed output (every shard's); True if there was one."""
    removed = False
    for f in store.list_files(uri):
        if f == SUCCESS or f.endswith("/" + SUCCESS):
            store.delete(join(uri, f))
            removed = True
    return removed


def uncommit_downstream(cfg: RunConfig, iteration: int, stage: str, *, own: bool) -> list[str]:
    """Uncommit what depends on stage `stage` of `iteration` (and that output itself with `own`)
    and could be read before it is redone: the rest of that iteration, every later checkpoint,
    train state and iteration, and the evaluation shards of later checkpoints. Returns the URIs
    that were committed."""
    store, layout = store_for(cfg), RunLayout.of(cfg)
    i = iteration
    targets = []
    if own:
        targets.append(
            {
                "generate": layout.rollouts(i),
                "verify": layout.scored(i),
                "train": layout.checkpoint(i + 1),
            }[stage]
        )
    if stage == "generate" or (stage == "verify" and own):
        targets.append(layout.prompt_stats(i))  # the curriculum of later iterations reads it
    if stage == "generate":
        targets.append(layout.scored(i))
    for c in committed_indices(store, layout.checkpoints_dir):
        if c > i + (0 if stage != "train" or own else 1):
            targets.append(layout.checkpoint(c))
    for c in sorted(_indices(store, layout.train_state_dir)):
        if c > i:
            targets.append(layout.train_state(c))
    for c in sorted(_indices(store, layout.iterations_dir)):
        if c > i:
            targets += [layout.rollouts(c), layout.scored(c), layout.prompt_stats(c)]
    # Evaluation shards are read by the gather, which must not combine old shards with a new
    # checkpoint. The evaluations themselves are read by no stage: their worker waits for the
    # (uncommitted) checkpoint and then checks their lineage against it, so they stay.
    for c in sorted(_indices(store, layout.eval_shards_dir)):
        if c > i:
            targets.append(layout.eval_shards(c))
    return [t for t in dict.fromkeys(targets) if _uncommit(store, t)]


def _indices(store: Store, uri: str) -> set[int]:
    return {int(f.split("/", 1)[0]) for f in store.list_files(uri) if f.split("/", 1)[0].isdigit()}


def plan_segment(cfg: RunConfig, index: int, attempt: str) -> dict[str, Any]:
    """The init task's second half: uncommit what is stale, then commit the attempt's plan."""
    seg = segment_of(cfg, index)
    found = first_out_of_date(cfg, seg)
    removed: list[str] = []
    if found is not None:
        i, stage, state = found
        removed = uncommit_downstream(cfg, i, stage, own=state == "stale")
        if removed:
            log.info(
                "iteration %d %s is %s: uncommitted %d outputs downstream of it",
                i,
                stage,
                state,
                len(removed),
            )
    drop_stale_stop(cfg)  # after the uncommits: a stop decided by a redone iteration goes
    status = RunStatus.of(cfg, attempt)
    out = OutputDir(store_for(cfg), status.plan, "init")
    out.begin(force=True)
    stats = {
        "segment": index,
        "first_out_of_date": list(found) if found else None,
        "uncommitted": removed,
    }
    out.put_bytes(b"{}", "plan.json")
    out.commit(stats)
    return stats


def drop_stale_stop(cfg: RunConfig) -> None:
    """Remove a stop record that no longer holds (the iteration that decided it is redone, the
    health rule changed, stopping is off), so that no worker keeps checking it."""
    store = store_for(cfg)
    uri = stop_uri(RunLayout.of(cfg).root)
    if store.exists(uri) and read_stop(cfg) is None:
        store.delete(uri)
        log.info("the run's stop record no longer holds: the run goes on")


def segment_up_to_date(cfg: RunConfig, seg: Segment) -> bool:
    """Every output of the segment is committed and was computed from the current inputs and
    config (the same test each stage makes before it skips an iteration)."""
    if first_out_of_date(cfg, seg) is not None:
        return False
    store, layout = store_for(cfg), RunLayout.of(cfg)
    stop = read_stop(cfg)
    checkpoints = segment_eval_checkpoints(cfg, seg) if cfg.data.evaluates else []
    try:
        return all(
            lineages.evaluate_current(cfg, store, layout, c)
            for c in checkpoints
            if stop is None or not stop.beyond("evaluate", c)
        )
    except StoreError:
        return False
