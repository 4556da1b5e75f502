"""Warm stages: set up once, step through many iterations, commit each one.

A stage object keeps the shape of a torchtune recipe: its model, tokenizer, engine and optimizer are
set up once (lazily, on the first step that has work), `step(iteration)` reads that iteration's
inputs, works and commits its output, and `close()` releases everything. `run_once` is what
`rlvr stage NAME -i I` and a one-iteration KFP task run; `serve` is what a long-running worker
task runs for a segment of iterations (docs/design.md): before each step it waits for the step's
inputs to be committed in the store by the workers of the other stages. There is one code path.

The store is the only channel between workers:

- inputs are ready when their `_SUCCESS` exists (all shards, for a sharded output);
- a worker that fails writes `<run>/status/failed/<task>.json` with its error, so that peers
  waiting on its outputs stop at once instead of waiting for `run.wait_timeout_s`;
- each committed output's manifest carries the step's `timeline` (process start, wait, setup,
  read, load, work, commit spans in epoch seconds), from which the run report draws its Gantt
  chart and computes the critical path (components/report/timeline.py).

After each step that committed, the worker logs the step's figures to the configured trackers
(components/core/tracking.py); that never changes what was committed nor fails the worker.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from components.core.commit import NotCommittedError, check_shard, committed_parts, shard_name
from components.core.config import RunConfig
from components.core.errors import UserError, is_user_error
from components.core.layout import RunLayout, store_for
from components.core.run_control import StopWatch
from components.core.store import Store, StoreError, join
from components.core.timing import Timeline, process_start_time

if TYPE_CHECKING:
    from components.core.tracking import StageTracking

log = logging.getLogger("rlvr.warm")


class Stage:
    """One stage's worker: set up once (lazily, on the first step with work), `step` through
    iterations, `close`. Every stage subclasses it and writes `needs` and `step`; the hooks
    below have defaults. `run` (one iteration, cold: `rlvr stage NAME -i I`) and `serve` (a
    segment, warm: a pipeline's worker task) are the same for every stage."""

    name: ClassVar[str]
    """The stage's name (components/core/stages.py)."""
    prewarms: ClassVar[bool] = False
    """Whether `warm(i)` loads the model or engine before step i's inputs are all in (train
    builds its engine from checkpoint i while generate and verify of iteration i run)."""

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        check_shard(shard, num_shards)
        self.cfg, self.shard, self.num_shards = cfg, shard, num_shards
        self.task = self.task_name()

    def task_name(self) -> str:
        """The worker's name, which also names its failure marker: `generate`,
        `verify-shard-00001-of-00002`, `train`, ..."""
        if self.num_shards == 1:
            return self.name
        return f"{self.name}-{shard_name(self.shard, self.num_shards)}"

    def check(self) -> None:
        """Checks of the stage's own config section, before it waits for or reads anything."""

    def needs(self, iteration: int) -> list[str]:
        """URIs that must be committed before `step(iteration)` can run."""
        raise NotImplementedError

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        """Do one iteration (or skip it when its output is up to date) and commit."""
        raise NotImplementedError

    def warm_needs(self, iteration: int) -> list[str]:
        """With `prewarms`: URIs that must be committed before `warm(iteration)`."""
        return []

    def warm(self, iteration: int) -> None:
        """With `prewarms`: load what step `iteration` needs before its inputs are in."""

    def early(self, iteration: int) -> bool:
        """Whether step `iteration` may begin before all of `needs` are committed (generate,
        when the policy it waits for is already coming over the weight channel)."""
        return False

    serving: bool = False
    """Set while `serve` steps the stage (a worker), not for a one-iteration run."""
    status: RunStatus | None = None
    """The serving attempt's markers (peers' failures), for waits inside a step."""
    wait_s: float = 0.0
    """`run.wait_timeout_s` while serving."""
    served: list[int] = []  # noqa: RUF012 - set per instance by `serve`
    """The iterations (evaluate: checkpoints) this worker serves."""
    stopped: Callable[[], bool] | None = None
    """While serving: whether the run stopped before the current step (health.stop_after)."""

    def wait_for(self, store: Store, uris: list[str]) -> float:
        """Inside a step: block until `uris` are committed, stopping when a peer fails (as the
        waits between steps do); a one-iteration run waits `run.wait_timeout_s`."""
        status = self.status or RunStatus.of(self.cfg)
        return wait_committed(
            store,
            uris,
            status=status,
            task=self.task,
            timeout_s=self.wait_s or self.cfg.run.wait_timeout_s,
            stopped=self.stopped,
        )

    def close(self) -> None:
        """Release the model, engine and pools."""

    def iterations(self, index: int) -> list[int]:
        """The steps this worker serves in segment `index`: its iterations."""
        return list(segment(self.cfg, index).iterations)

    def first(self, index: int) -> int:
        """Segment `index`'s first iteration: the waits for this worker's inputs are timed
        from it (`run.wait_timeout_s` per iteration since)."""
        return segment(self.cfg, index).start

    @classmethod
    def run(
        cls,
        cfg: RunConfig,
        iteration: int,
        *,
        force: bool = False,
        shard: int = 0,
        num_shards: int = 1,
    ) -> dict[str, Any]:
        """One iteration (or one shard of it), cold."""
        return run_once(cls(cfg, shard=shard, num_shards=num_shards), iteration, force=force)

    @classmethod
    def serve(
        cls,
        cfg: RunConfig,
        segment: int,
        *,
        shard: int = 0,
        num_shards: int = 1,
        attempt: str | None = None,
        retried: bool = False,
    ) -> dict[str, Any]:
        """The worker of one segment: every step of it, warm."""
        stage = cls(cfg, shard=shard, num_shards=num_shards)
        results = serve_stage(
            stage,
            stage.iterations(segment),
            cfg=cfg,
            attempt=attempt,
            start=stage.first(segment),
            retried=retried,
        )
        return segment_summary(stage, segment, results)


class PeerFailed(RuntimeError):
    """Another worker of this run failed; waiting for its output is pointless."""


class RunStopped(Exception):  # noqa: N818 - not an error: the run ended under its health rule
    """The run stopped under `health.stop_after` before this step (components/core/run_control.py):
    the worker ends cleanly."""


def _describe(error: BaseException) -> str:
    """Bad input reads as its message; anything else also names its type."""
    return str(error) if is_user_error(error) else f"{type(error).__name__}: {error}"


def retry_grace_s(cfg: RunConfig, stage: str) -> float:
    """How long a failure of `stage` may still be undone by KFP retrying the task on a cluster:
    the sum of its retry backoffs plus ten minutes for a pod to start."""
    p = cfg.cluster.stages.get(stage if stage in cfg.cluster.stages else "init")
    if p is None or p.retries == 0:
        return 0.0
    base, cap = _duration_s(p.backoff_duration), _duration_s(p.backoff_max_duration)
    return sum(min(base * p.backoff_factor**k, cap) for k in range(p.retries)) + 600.0


def _duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip()
    return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)


class RunStatus:
    """Markers of one attempt (one pipeline run) under `<run>/status/<attempt>/`: the failed
    tasks (`failed/<task>.json`) and the plan (`plan/`, committed when the attempt's inputs were
    checked and every stale output was uncommitted). Scoping by attempt means a marker of an
    earlier run never stops a new one, and one of another segment never stops this one."""

    def __init__(self, store: Store, root: str, attempt: str = "local") -> None:
        self.store, self.attempt = store, attempt
        self.root = RunLayout(root).status(attempt)
        self.dir = join(self.root, "failed")

    @classmethod
    def of(cls, cfg: RunConfig, attempt: str = "local") -> RunStatus:
        return cls(store_for(cfg), RunLayout.of(cfg).root, attempt)

    @property
    def plan(self) -> str:
        return join(self.root, "plan")

    def mark_failed(
        self,
        task: str,
        error: BaseException | str,
        *,
        iteration: int | None = None,
        grace_s: float = 0.0,
    ) -> None:
        message = error if isinstance(error, str) else _describe(error)
        record = {
            "task": task,
            "error": message,
            "at": time.time(),
            "host": socket.gethostname(),
            "iteration": iteration,
            "user_error": is_user_error(error),
            "peer": isinstance(error, PeerFailed),
            "retry_grace_s": grace_s,
        }
        try:
            self.store.write_text(join(self.dir, f"{task}.json"), json.dumps(record))
        except StoreError:  # the store itself may be why we failed; the exit status still tells
            log.exception("could not record the failure of %s", task)

    def clear(self, task: str | None = None) -> None:
        """Forget one task's failure (it is being retried), or the whole attempt's markers."""
        if task is None:
            self.store.delete_tree(self.root)
        else:
            self.store.delete(join(self.dir, f"{task}.json"))

    def failures(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name in self.store.list_files(self.dir):
            if name.endswith(".json"):
                with contextlib.suppress(StoreError, ValueError):
                    out[name[: -len(".json")]] = json.loads(
                        self.store.read_text(join(self.dir, name))
                    )
        return out

    def root_cause(self) -> tuple[str, dict[str, Any]] | None:
        """The first failure that was not just a peer stopping because of another."""
        failures = self.failures()
        own = {k: v for k, v in failures.items() if not v.get("peer")} or failures
        if not own:
            return None
        return min(own.items(), key=lambda kv: (kv[1].get("at", 0.0), kv[0]))


def is_committed(store: Store, uri: str) -> bool:
    """Committed, counting a sharded output only once every shard is."""
    try:
        committed_parts(store, uri)
        return True
    except NotCommittedError:
        return False


def wait_committed(
    store: Store,
    uris: list[str],
    *,
    status: RunStatus,
    task: str,
    timeout_s: float,
    poll_max_s: float = 1.0,
    early: Callable[[], bool] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> float:
    """Block until every URI is committed, or `early()` says the caller may go on before;
    returns the seconds waited.

    Polls with a backoff from 20 ms to `poll_max_s` (one listing per poll on S3). Raises
    PeerFailed as soon as another task of the run records a failure, RunStopped when
    `stopped()` says the run ended before the caller's step, TimeoutError after
    `timeout_s`."""
    t0 = time.monotonic()
    delay = 0.02
    pending = list(uris)
    while True:
        pending = [u for u in pending if not is_committed(store, u)]
        if not pending:  # all seen committed: make sure none was uncommitted meanwhile
            pending = [u for u in uris if not is_committed(store, u)]
            if not pending:
                return time.monotonic() - t0
        if early is not None and early():
            return time.monotonic() - t0
        if stopped is not None and stopped():
            raise RunStopped(task)
        # A failure that KFP may still retry (within its grace) is waited out: the retried
        # task clears its marker and carries on, and this worker with it.
        now = time.time()
        failed = {
            k: v
            for k, v in status.failures().items()
            if k != task and now - v.get("at", 0.0) >= v.get("retry_grace_s", 0.0)
        }
        if failed:  # name the root cause: the others may only have stopped because of it
            own = {k: v for k, v in failed.items() if not v.get("peer")} or failed
            peer, rec = min(own.items(), key=lambda kv: (kv[1].get("at", 0.0), kv[0]))
            raise PeerFailed(
                f"{task} stopped: task {peer} of this run failed ({rec.get('error')}); fix that "
                "and rerun (committed iterations are kept)"
            )
        waited = time.monotonic() - t0
        if waited > timeout_s:
            raise TimeoutError(
                f"{task} waited {waited:.0f} s (run.wait_timeout_s) for {pending[0]} to be "
                "committed; is the task that writes it running?"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, poll_max_s)


_cold_start_taken = False


def _cold_start(timeline: Timeline) -> None:
    """The first timeline of a process gets its cold start: process start (interpreter, imports,
    the KFP executor) until the stage object begins its first step."""
    global _cold_start_taken
    if not _cold_start_taken:
        _cold_start_taken = True
        timeline.add("start", process_start_time(), time.time())


def _tracking(stage: Stage) -> StageTracking:
    """The worker's tracking (components/core/tracking.py). Imported here, not at the top: the
    module is loaded only by a worker that serves, and its backends only on the first commit."""
    from components.core.tracking import StageTracking

    return StageTracking(stage)


def run_once(stage: Stage, iteration: int, *, force: bool = False) -> dict[str, Any]:
    """One iteration, cold: what `rlvr stage` and the one-stage pipeline run."""
    timeline = Timeline(stage.task, iteration, one_shot=True)
    _cold_start(timeline)
    tracking = _tracking(stage)
    try:
        stage.check()
        result = stage.step(iteration, force=force, timeline=timeline)
        tracking.after_step(iteration, result, timeline)
        return result
    finally:
        tracking.close()
        stage.close()


def serve(
    stage: Stage,
    iterations: Iterable[int],
    *,
    status: RunStatus,
    store: Store,
    timeout_s: float,
    poll_max_s: float = 1.0,
    start: int | None = None,
    plan: bool = False,
    grace_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Step through `iterations` in order, waiting for each step's inputs; the stage stays warm.

    With `plan`, nothing is read before the attempt's plan is committed (init uncommits every
    stale output first: otherwise a worker could trust an old output its upstream is about to
    redo). The wait for a step's inputs may last `timeout_s` per iteration since the previous
    step (or since `start`): evaluate waits `evaluate.every` iterations for its next checkpoint.
    On any error the task's failure marker is written (peers stop waiting unless KFP may still
    retry the task within `grace_s`) and the error is re-raised; a retried task clears its own
    marker first. A run that stopped under its health rule (components/core/run_control.py) ends
    the loop cleanly before the first step past the stop."""
    status.clear(stage.task)
    iterations = list(iterations)
    stage.serving, stage.status, stage.wait_s = True, status, timeout_s
    stage.served = iterations
    results = []
    i = None
    tracking = _tracking(stage)
    watch = StopWatch(getattr(stage, "cfg", None))  # the run's stop (health.stop_after)
    name = stage.task.split("-")[0]
    try:
        stage.check()
        previous = start
        for i in iterations:
            timeline = Timeline(stage.task, i)
            _cold_start(timeline)
            gap = max(1, i - previous) if previous is not None else 1
            stage.stopped = functools.partial(watch.past, name, i)
            wait = dict(
                status=status,
                task=stage.task,
                timeout_s=timeout_s * gap,
                poll_max_s=poll_max_s,
                stopped=stage.stopped,
            )
            try:
                _wait_for_step(stage, i, store, wait, timeline, plan=plan and not results)
                if watch.past(name, i, force=True):
                    raise RunStopped(stage.task)
                results.append(stage.step(i, timeline=timeline))
            except RunStopped:
                log.info(
                    "%s: the run stopped after iteration %d (%s)",
                    stage.task,
                    watch().after_iteration,
                    watch().summary,
                )
                break
            tracking.after_step(i, results[-1], timeline)
            previous = i
    except BaseException as e:
        status.mark_failed(
            stage.task, e, iteration=i, grace_s=0.0 if isinstance(e, PeerFailed) else grace_s
        )
        raise
    finally:
        tracking.close()
        stage.close()
    return results


def _wait_for_step(
    stage: Stage, i: int, store: Store, wait: dict, timeline: Timeline, *, plan: bool
) -> None:
    """Wait for step i's inputs: the attempt's plan first (`plan`), then what warming the
    stage needs (then it warms), then the rest."""
    if plan:  # before anything else is looked at
        t0 = time.time()
        wait_committed(store, [stage.status.plan], **wait)
        timeline.add("wait", t0, time.time())
    if stage.prewarms:
        t0 = time.time()
        wait_committed(store, stage.warm_needs(i), **wait)
        timeline.add("wait", t0, time.time())
        with timeline.span("load"):
            stage.warm(i)
    t0 = time.time()
    wait_committed(store, stage.needs(i), **wait, early=lambda: stage.early(i))
    timeline.add("wait", t0, time.time())


def segment_summary(stage: Stage, segment: int, results: list[dict]) -> dict:
    """What a stage's segment worker returns: its task, how many steps it served, skipped."""
    return {
        "task": stage.task,
        "segment": segment,
        "steps": len(results),
        "skipped": sum(bool(r.get("skipped")) for r in results),
    }


def serve_stage(
    stage: Stage,
    iterations: Iterable[int],
    *,
    cfg: RunConfig,
    attempt: str | None = None,
    start: int | None = None,
    retried: bool = False,
) -> list[dict]:
    """`serve` with the run's store, the attempt's markers and the configured waits. `attempt`
    None: no attempt (a stage served outside a pipeline run): no plan to wait for. `retried`:
    KFP retries this task on failure (a cluster run), so its peers give it time to come back."""
    store = store_for(cfg)
    poll = cfg.run.poll_max_s or (1.0 if cfg.run.store.startswith("s3://") else 0.01)
    return serve(
        stage,
        iterations,
        status=RunStatus.of(cfg, attempt or "local"),
        store=store,
        timeout_s=cfg.run.wait_timeout_s,
        poll_max_s=poll,
        start=start,
        plan=attempt is not None,
        grace_s=retry_grace_s(cfg, stage.task.split("-")[0]) if retried else 0.0,
    )


@dataclass(frozen=True)
class Segment:
    """Iterations [start, stop) of a run, served by one set of warm workers."""

    index: int
    start: int
    stop: int

    @property
    def iterations(self) -> range:
        return range(self.start, self.stop)


def segments(cfg: RunConfig) -> list[Segment]:
    k, n = cfg.run.segment_iterations, cfg.run.iterations
    return [Segment(s, a, min(a + k, n)) for s, a in enumerate(range(0, n, k))]


def segment(cfg: RunConfig, index: int) -> Segment:
    segs = segments(cfg)
    if not 0 <= index < len(segs):
        raise UserError(
            f"segment {index} does not exist: run.iterations={cfg.run.iterations} with "
            f"run.segment_iterations={cfg.run.segment_iterations} makes {len(segs)} segment(s)"
        )
    return segs[index]


def eval_checkpoints(cfg: RunConfig) -> list[int]:
    """Checkpoints the pipeline evaluates: the base, every `evaluate.every`-th, and the last."""
    if not cfg.data.evaluates:
        return []
    last, every = cfg.run.iterations, cfg.evaluate.every
    return sorted({0, last, *range(every, last + 1, every)})


def segment_eval_checkpoints(cfg: RunConfig, seg: Segment) -> list[int]:
    """The checkpoints a segment's evaluate worker handles: those its train worker writes
    (start+1 .. stop), plus the base in the first segment."""
    lo = -1 if seg.index == 0 else seg.start
    return [c for c in eval_checkpoints(cfg) if lo < c <= seg.stop]
