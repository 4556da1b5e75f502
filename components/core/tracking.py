"""Experiment tracking: each stage logs the figures of every step it commits (docs/contracts.md,
"Experiment tracking").

`make_tracker(cfg, task)` gives one `Tracker` that fans out to the backends named in
`tracking.backends`:

* ``tensorboard`` (the default): event files written directly (components/core/tfevents.py: no
  package, so no stage loads torch for them) INTO THE RUN, through its store, so they work on
  S3 too: ``<run>/tensorboard/<task>/events.out.tfevents.<step:08d>.rlvr``, one file per
  (task, step). A task is one TensorBoard run, so the shards of a stage are separate series and
  never double count; a rerun of a step replaces its file instead of adding a second point.
  ``tensorboard --logdir <run>/tensorboard``.
* ``mlflow`` (``pip install mlflow-skinny``): one MLflow run per rlvr run, tagged
  ``rlvr.run_id``, with a nested child run per task (tags ``rlvr.run_id`` and ``rlvr.task``);
  both are found again by their tags, so a later segment or a restarted worker continues the same
  runs. A step already in a metric's history is not logged again: a rerun does not double count,
  the first value logged for a step stays (MLflow cannot replace a point).
* ``wandb`` (``pip install wandb``): one W&B run per task, grouped by the rlvr run id, with an id
  derived from (run id, task) and ``resume="allow"``; every figure is plotted against the
  ``iteration`` metric, so a resumed process may log an earlier iteration again (a rerun of an
  iteration adds a second point there).

TensorBoard and MLflow names take only letters, digits and ``_ - . /``: ``pass@k`` is logged as
``pass_at_k`` there (`safe_name`); W&B gets the names of components/core/figures.py unchanged.

The step is the iteration (evaluate: the checkpoint index). Tracking never changes what a stage
commits and never fails a stage: a backend that cannot be imported or reached is reported once,
as a warning that names the fix, and left out for the rest of the process. `check_tracking` (run
by `rlvr check`) reports a configured backend whose package is missing before the run starts.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from components.core.stages import ITERATION_STAGES
from components.core.store import Store, join

if TYPE_CHECKING:
    from components.core.config import RunConfig
    from components.core.errors import Problems
    from components.core.timing import Timeline

__all__ = [
    "MultiTracker",
    "StageTracking",
    "Tracker",
    "check_tracking",
    "event_file_name",
    "make_tracker",
    "safe_name",
    "step_figures",
]

log = logging.getLogger("rlvr.tracking")

#: backend -> (module it imports, what installs it); tensorboard needs none (core/tfevents.py)
PACKAGES: dict[str, tuple[str | None, str]] = {
    "tensorboard": (None, ""),
    "mlflow": ("mlflow", "pip install mlflow-skinny"),
    "wandb": ("wandb", "pip install wandb"),
}
#: what to look at when a backend is installed but fails
_ADVICE = {
    "tensorboard": "check that the run's store is writable",
    "mlflow": "check tracking.mlflow_tracking_uri (or MLFLOW_TRACKING_URI) and that the "
    "server is reachable",
    "wandb": "check `wandb login` / WANDB_API_KEY, or set tracking.wandb_mode: offline",
}


class Tracker(Protocol):
    """Where a task's figures go: `log` once per committed step, `close` at the end."""

    def log(self, figures: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class MultiTracker:
    """Fans out to named backends. A backend that raises is warned about once (naming the fix)
    and dropped for the rest of the process: a server that is down would otherwise stall every
    step in its retries. An empty list is a no-op tracker."""

    def __init__(self, backends: Mapping[str, Tracker] | None = None) -> None:
        self.backends: dict[str, Tracker] = dict(backends or {})

    def log(self, figures: Mapping[str, float], step: int) -> None:
        for name, backend in list(self.backends.items()):
            try:
                backend.log(figures, step)
            except Exception as e:  # tracking never fails a stage
                self._drop(name, e)

    def tag(self, key: str, value: str) -> None:
        """A run-level label (the health verdict) on the backends that have one."""
        for name, backend in list(self.backends.items()):
            if hasattr(backend, "tag"):
                try:
                    backend.tag(key, value)
                except Exception as e:  # tracking never fails a stage
                    self._drop(name, e)

    def close(self) -> None:
        for name, backend in list(self.backends.items()):
            try:
                backend.close()
            except Exception as e:
                _warn(name, e)  # not closed again: a server that is down costs its retries once
        self.backends.clear()

    def _drop(self, name: str, error: BaseException) -> None:
        backend = self.backends.pop(name, None)
        _warn(name, error)
        if backend is not None and getattr(backend, "close_on_drop", True):
            try:  # best effort: finish a W&B run
                backend.close()
            except Exception:
                pass


def _warn(backend: str, error: BaseException) -> None:
    module, install = PACKAGES[backend]
    missing = (
        module is not None
        and isinstance(error, ImportError)
        and (getattr(error, "name", "") or "").startswith(module.split(".")[0])
    )
    fix = install if missing else _ADVICE[backend]
    log.warning(
        "tracking: %s is off for the rest of this process (%s: %s); %s, or remove it from "
        "tracking.backends. The stage's outputs are not affected.",
        backend,
        type(error).__name__,
        error,
        fix,
    )


def make_tracker(cfg: RunConfig, task: str) -> MultiTracker:
    """The tracker of one task (`train`, `generate-shard-00001-of-00002`, ...) of a run.

    A backend that cannot start (package missing, server down) is warned about and left out."""
    from components.core.layout import RunLayout, store_for

    backends: dict[str, Tracker] = {}
    for name in dict.fromkeys(cfg.tracking.backends):
        try:
            if name == "tensorboard":
                backends[name] = TensorBoardTracker(store_for(cfg), RunLayout.of(cfg).root, task)
            elif name == "mlflow":
                backends[name] = MlflowTracker(cfg, task)
            elif name == "wandb":
                backends[name] = WandbTracker(cfg, task)
        except Exception as e:  # tracking never fails a stage
            _warn(name, e)
    return MultiTracker(backends)


def check_tracking(cfg: RunConfig, problems: Problems, *, for_cluster: bool = False) -> None:
    """`rlvr check`: every configured backend's package imports here. For a cluster, where the
    stages run in the stage images (which write TensorBoard files only), a warning for the others."""
    import importlib.util

    for name in dict.fromkeys(cfg.tracking.backends):
        module, install = PACKAGES[name]
        if module is None:
            continue
        if for_cluster:
            problems.warn(
                "config tracking.backends",
                f"the stage images do not install {module}",
                f"build images with it ({install}) for the stages to log to {name}",
            )
        elif importlib.util.find_spec(module) is None:
            problems.error(
                "config tracking.backends",
                f"{name} is configured but {module} is not installed",
                f"{install}, or remove {name} from tracking.backends",
            )


def step_figures(task: str, result: Mapping[str, Any]) -> dict[str, float]:
    """The figures of one step's result (what a stage's `step` returns), or {} when it has none
    (a skipped step, an evaluation shard that only samples)."""
    from components.core.figures import eval_figures, stage_figures

    if result.get("skipped"):
        return {}
    stage = task.split("-")[0]
    if stage == "evaluate":
        metrics = result.get("metrics")
        return eval_figures(metrics, result.get("stats")) if metrics else {}
    stats = result.get("stats")
    if stats is None or stage not in ITERATION_STAGES:
        return {}
    return stage_figures(stage, stats)


class StageTracking:
    """What a warm worker logs through: the figures of each step its stage commits, to a tracker
    made on the first such step (so a worker that skips everything imports no backend) and
    closed with the worker. Only rank 0 of a multi-process stage logs. Never raises."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.tracker: Tracker | None = None
        self.verdict: str | None = None
        """The health verdict last tagged (a tag is set when it changes)."""

    def after_step(
        self, iteration: int, result: Mapping[str, Any], timeline: Timeline | None = None
    ) -> None:
        """Log one step's result. `timeline` (the step's) stands in for stats
        that carry none (train returns its metrics, while its manifest holds the timeline)."""
        cfg = getattr(self.stage, "cfg", None)
        if cfg is None or not cfg.tracking.backends or getattr(self.stage, "rank", 0) != 0:
            return
        try:
            stats = result.get("stats")
            if timeline is not None and isinstance(stats, Mapping) and "timeline" not in stats:
                result = {**result, "stats": {**stats, "timeline": timeline.record()}}
            figures = step_figures(self.stage.task, result)
            if not figures:
                return
            if self.tracker is None:
                self.tracker = make_tracker(cfg, self.stage.task)
            self.tracker.log(figures, iteration)
            health = (stats or {}).get("health") if isinstance(stats, Mapping) else None
            if health and health.get("verdict") != self.verdict:  # train: the run's health
                self.verdict = health["verdict"]
                self.tracker.tag("rlvr.health", self.verdict)
        except Exception:  # the step is committed; tracking must not undo that
            log.warning(
                "tracking: could not log %s step %d", self.stage.task, iteration, exc_info=True
            )

    def close(self) -> None:
        if self.tracker is not None:
            try:
                self.tracker.close()
            except Exception:
                log.warning(
                    "tracking: could not close %s's tracker", self.stage.task, exc_info=True
                )
            self.tracker = None


# --- TensorBoard ------------------------------------------------------------------------------

_BAD_CHARACTERS = re.compile(r"[^-/\w.]")


def safe_name(name: str) -> str:
    """A figure's name as TensorBoard and MLflow take it (letters, digits and `_ - . /`):
    `eval/heldout/pass@1` -> `eval/heldout/pass_at_1`. W&B takes every name as it is."""
    return _BAD_CHARACTERS.sub("_", name.replace("@", "_at_"))


def event_file_name(step: int) -> str:
    """One file per step: TensorBoard reads a directory's event files in name order, so the
    zero-padded step keeps the series in step order, and a rerun overwrites its own file."""
    return f"events.out.tfevents.{step:08d}.rlvr"


class TensorBoardTracker:
    """Scalars of each step into `<run>/tensorboard/<task>/<event_file_name(step)>`, one event
    file per step (components/core/tfevents.py), put into the store in one write."""

    def __init__(self, store: Store, run_root: str, task: str) -> None:
        from components.core.layout import RunLayout

        self.store, self.task = store, task
        self.dir = RunLayout(run_root).tensorboard(task)

    def log(self, figures: Mapping[str, float], step: int) -> None:
        if not figures:
            return
        from components.core.tfevents import scalar_event_file

        scalars = {safe_name(name): float(value) for name, value in sorted(figures.items())}
        data = scalar_event_file(scalars, step, time.time())
        self.store.write_bytes(join(self.dir, event_file_name(step)), data)

    def close(self) -> None:
        pass


# --- MLflow -----------------------------------------------------------------------------------

_MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log_batch


def _tag_filter(key: str, value: str) -> str:
    quote = '"' if "'" in value else "'"
    return f"tags.`{key}` = {quote}{value}{quote}"


class MlflowTracker:
    """One MLflow run per rlvr run (tag `rlvr.run_id`, named by the run id) in experiment
    `tracking.mlflow_experiment`, and one nested child run per task (tags `rlvr.run_id`,
    `rlvr.task`, `mlflow.parentRunId`), each found by its tags or created.

    Through `MlflowClient` alone (no global active run), one `log_batch` per step. Reruns do not
    double count: a metric key's steps already logged are read from its history once per process
    (only for keys the child run already has: a new run costs no extra request) and kept in a
    cache; a figure whose step is in it is skipped, so the first value logged for a step stays.

    Parent creation races (workers of one run starting at once) settle on the earliest parent
    by (start time, id); a worker that created a later one deletes it. Each child is RUNNING
    while a worker logs to it and FINISHED when the worker closes; the parent is set RUNNING by
    each worker and never finished by one (its siblings may still be logging).

    A server that does not answer costs MLflow's retries before the backend is dropped: unless the
    environment sets them, this tracker uses 2 retries and a 10 s timeout
    (`MLFLOW_HTTP_REQUEST_MAX_RETRIES`, `MLFLOW_HTTP_REQUEST_TIMEOUT`) instead of MLflow's 7 and
    120 s, so a dead server delays a worker's first commit by seconds, not minutes.
    """

    #: A dropped MLflow backend is not closed: its server just failed, and closing would cost
    #: the retries again. Its child run stays RUNNING until a later worker of the task resumes it.
    close_on_drop = False

    def __init__(self, cfg: RunConfig, task: str) -> None:
        import os

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.tracking.mlflow_tracking_uri or None)
        self.run_id, self.task = cfg.run_id, task
        self.experiment_id = self._experiment(cfg.tracking.mlflow_experiment)
        runs = self._runs()
        self.parent = self._parent(runs)
        child = next((r for r in runs if r.data.tags.get("rlvr.task") == task), None)
        if child is None:
            self.child = self.client.create_run(
                self.experiment_id,
                run_name=task,
                tags={
                    "rlvr.run_id": self.run_id,
                    "rlvr.task": task,
                    "mlflow.parentRunId": self.parent,
                },
            ).info.run_id
            self._existing: set[str] = set()
        else:
            self.child = child.info.run_id
            self._existing = set(child.data.metrics)
            if child.info.status != "RUNNING":
                self.client.update_run(self.child, status="RUNNING")
        self.client.update_run(self.parent, status="RUNNING")
        self._steps: dict[str, set[int]] = {}

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another worker created it meanwhile
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _runs(self) -> list[Any]:
        """Every run of this rlvr run (the parent and the tasks' children), oldest first."""
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=_tag_filter("rlvr.run_id", self.run_id),
                order_by=["attributes.start_time ASC"],
                max_results=1000,
            )
        )

    def _parent(self, runs: list[Any]) -> str:
        parents = [r for r in runs if "rlvr.task" not in r.data.tags]
        if parents:
            return min(parents, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        mine = self.client.create_run(
            self.experiment_id, run_name=self.run_id, tags={"rlvr.run_id": self.run_id}
        ).info.run_id
        parents = [r for r in self._runs() if "rlvr.task" not in r.data.tags]
        first = min(parents, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        if first != mine:  # another worker's came first: use it, drop ours
            self.client.delete_run(mine)
        return first

    def _logged_steps(self, key: str) -> set[int]:
        if key not in self._steps:
            history = (
                self.client.get_metric_history(self.child, key) if key in self._existing else []
            )
            self._steps[key] = {m.step for m in history}
        return self._steps[key]

    def log(self, figures: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for name, value in sorted(figures.items()):
            key = safe_name(name)
            seen = self._logged_steps(key)
            if step not in seen:
                metrics.append(Metric(key, float(value), now, step))
        for i in range(0, len(metrics), _MLFLOW_BATCH):
            self.client.log_batch(self.child, metrics=metrics[i : i + _MLFLOW_BATCH])
        for m in metrics:
            self._steps[m.key].add(step)

    def tag(self, key: str, value: str) -> None:
        """On the rlvr run's parent run, where runs are compared, and on the task's."""
        for run in (self.parent, self.child):
            self.client.set_tag(run, key, value)

    def close(self) -> None:
        # The parent's status is left alone: other tasks of the run may still be logging.
        self.client.set_terminated(self.child, "FINISHED")


# --- Weights & Biases -------------------------------------------------------------------------


def wandb_run_id(run_id: str, task: str) -> str:
    """The W&B run id of a task: the same in every segment and restart of the rlvr run."""
    return "rlvr-" + hashlib.sha256(f"{run_id}\0{task}".encode()).hexdigest()[:24]


class WandbTracker:
    """One W&B run per task: `group` = the rlvr run id, `job_type` = the stage, `name` = the
    task, a deterministic `id` with `resume="allow"`. Figures are logged with an `iteration`
    field that every metric uses as its x-axis (`define_metric("*", step_metric=...)`), so W&B's
    own monotonic step never drops the points of a resumed or rerun iteration (a rerun adds a
    second point at the same iteration: W&B cannot replace one). `tracking.wandb_mode` offline
    writes under WANDB_DIR (default: the working directory) for a later `wandb sync`."""

    def __init__(self, cfg: RunConfig, task: str) -> None:
        import wandb

        t = cfg.tracking
        self.run = wandb.init(
            project=t.wandb_project,
            entity=t.wandb_entity,
            mode=t.wandb_mode,
            id=wandb_run_id(cfg.run_id, task),
            resume="allow",
            group=cfg.run_id,
            job_type=task.split("-")[0],
            name=task,
            reinit="create_new",
            settings=wandb.Settings(silent=True),
        )
        self.run.define_metric("iteration", hidden=True)
        self.run.define_metric("*", step_metric="iteration")

    def log(self, figures: Mapping[str, float], step: int) -> None:
        self.run.log({"iteration": step, **figures})

    def tag(self, key: str, value: str) -> None:
        """In the run's summary (a column of the runs table) and as a `key:value` tag."""
        self.run.summary[key] = value
        kept = tuple(t for t in (self.run.tags or ()) if not t.startswith(f"{key}:"))
        self.run.tags = (*kept, f"{key}:{value}")

    def close(self) -> None:
        self.run.finish()
