"""Evaluation outside a run's pipeline, driven from this machine: any checkpoint
(`rlvr eval --checkpoint`, the benchmarks), and each checkpoint of a run as it lands
(`rlvr eval --watch`, the local recurring evaluation)."""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from components.core.commit import RetiredError
from components.core.config import RunConfig
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.warm import Timeline, run_once
from components.evaluate.stage import EvaluateStage
from components.model import run_setup

__all__ = ["evaluate_external", "watch_run"]

log = logging.getLogger("rlvr.evaluate")


def evaluate_external(cfg: RunConfig, checkpoint: str, *, force: bool = False) -> dict[str, Any]:
    """Evaluate any HF checkpoint directory or store URI, outside an RL run.

    It becomes checkpoint 00000 of a run named `eval-<digest of the URI>` in the same store (the
    checkpoint and eval sets are copied in, as for any run), so results are kept and an unchanged
    checkpoint is not evaluated twice.
    """
    cfg = cfg.model_copy(deep=True)
    cfg.evaluate.num_shards = 1  # one local process: no shard fan-out to gather
    cfg.model.base = checkpoint
    cfg.run.run_id = "eval-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:12]
    run_setup.run(cfg, force=True)  # re-import: a changed checkpoint gets a new content digest
    result = run_once(EvaluateStage(cfg, label=checkpoint), 0, force=force)
    return {**result, "root": RunLayout.of(cfg).root, "run_id": cfg.run_id}


def watch_run(
    cfg: RunConfig, *, poll_s: float = 30.0, timeout_s: float | None = None, force: bool = False
) -> dict[str, Any]:
    """Evaluate each committed checkpoint of a run as it lands (the local recurring evaluation).

    Returns once the run's last checkpoint (run.iterations) is evaluated, or after timeout_s.
    """
    from components.core.tracking import StageTracking

    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"num_shards": 1})})
    store, layout = store_for(cfg), RunLayout.of(cfg)
    start = time.monotonic()
    done: set[int] = set()
    stage = EvaluateStage(cfg)  # warm: each new checkpoint's weights go into the loaded policy
    tracking = StageTracking(stage)  # each evaluation to the trackers, as a worker's
    try:
        while True:
            for c in committed_indices(store, layout.checkpoints_dir):
                if c not in done:
                    timeline = Timeline(stage.task, c)
                    try:
                        result = stage.step(c, force=force, timeline=timeline)
                    except RetiredError:  # retired by the run while this one loaded it
                        result = {"skipped": True, "retired": True}
                    if not result.get("retired"):
                        tracking.after_step(c, result, timeline)
                    done.add(c)
            if cfg.run.iterations in done:
                return {"evaluated": sorted(done)}
            if timeout_s is not None and time.monotonic() - start >= timeout_s:
                return {"evaluated": sorted(done), "timed_out": True}
            log.info(
                "watching %s: evaluated %s; next poll in %.0f s", layout.root, sorted(done), poll_s
            )
            time.sleep(poll_s)
    finally:
        tracking.close()
        stage.close()
