"""Run a compiled KFP pipeline on one machine with its tasks side by side.

kfp.local's SubprocessRunner executes a pipeline's tasks one at a time. The training pipeline's
workers wait on each other through the store (pipelines/train.py), so they have to run together.
This runner keeps everything of kfp.local that runs a task (argument resolution, the executor
input, the KFP executor in a subprocess of this Python, outputs, the IO store, retries) and
replaces only the scheduling: every task whose upstream tasks have finished starts at once, in a
thread of its own. The compiled pipeline is the same one a cluster runs.

For the duration of `run_pipeline`, five names of kfp.local (pinned to kfp==2.17.0; a test fails
loudly if an upgrade moves them) are replaced:

- `dag_orchestrator.run_dag`: the concurrent scheduler below;
- `logging_utils.local_logger_context`, `indented_print` and `print_horizontal_line`: the
  originals swap the root logger's handlers and `builtins.print` around each task (not
  thread-safe) and decorate sequential output;
- `subprocess_task_handler.run_local_subprocess`: each task's output goes whole to its own log
  file, and only its `rlvr` log lines (and errors) to the console, prefixed with the task name.

A task that fails stops the run: its failure is recorded for the other workers (which stop
waiting), running tasks finish, no new task starts, and `LocalRunError` names the task, its error
and its log file.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.core.stages import STAGES

if TYPE_CHECKING:
    from pipelines.local_docker import DockerPlan

log = logging.getLogger("rlvr.local")

#: Lines of a task's output that also go to the console (all of it goes to the task's log file
#: under the run's logs/): each held-out result as it lands, this project's warnings and errors,
#: and failures. Per-iteration progress is what the bars show.
CONSOLE_LINE = re.compile(
    r" rlvr\.evaluate INFO | rlvr\.[\w.]+ (WARNING|ERROR) |^error: |Error: |^Traceback"
)


class LocalRunError(RuntimeError):
    """A task of a locally run pipeline failed."""

    def __init__(self, task: str, message: str, log_file: Path | None) -> None:
        super().__init__(f"task {task} failed: {message}")
        self.task, self.message, self.log_file = task, message, log_file


_current = threading.local()
_live: set[subprocess.Popen] = set()
"""Task processes still running, each the leader of its own process group."""


def _kill_live_tasks() -> None:
    """Stop every running task and whatever it started (a torchrun's ranks, verifier pools),
    containers included."""
    import os
    import signal

    from pipelines.local_docker import stop_live_containers

    stop_live_containers()

    for proc in list(_live):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in list(_live):
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _task_log_path(log_dir: Path, task: str) -> Path:
    return log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', task)}.log"


TaskEnv = Callable[[str], dict[str, str]]
"""Extra environment variables of a task, by its display name."""


def _current_task() -> str:
    return getattr(_current, "task", "task")


def _log_opener(log_dir: Path) -> Callable[[str], Any]:
    """`open_log(task)`: a context whose value writes one line of the task's output to its log
    file, and the rlvr lines (CONSOLE_LINE) also to the console."""

    @contextlib.contextmanager
    def open_log(task: str) -> Iterator[Callable[[str], None]]:
        with open(_task_log_path(log_dir, task), "w") as out:

            def write(line: str) -> None:
                out.write(line)
                out.flush()
                if CONSOLE_LINE.search(line):
                    print(f"[{task}] {line.rstrip()}", flush=True)

            yield write

    return open_log


def _make_subprocess_runner(log_dir: Path, task_env: TaskEnv) -> Callable[..., int]:
    open_log = _log_opener(log_dir)

    def run_local_subprocess(
        full_command: list[str], env_vars: dict[str, str] | None = None
    ) -> int:
        import os

        task = _current_task()
        env = {**os.environ, **task_env(task), **(env_vars or {})}
        nice = int(env.get("RLVR_NICE") or 0)
        # Niced from its first instruction by `nice -n` (relative to this process, clamped at
        # 19): set after Popen, it raced the worker's start, and on Linux setpriority on a pid
        # reaches only its main thread, not threads it already started.
        launcher = shutil.which("nice", path=env.get("PATH")) if nice else None
        command = [launcher, "-n", str(nice), *full_command] if launcher else full_command
        with (
            open_log(task) as write,
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                env=env,
                start_new_session=True,
            ) as proc,
        ):
            _live.add(proc)
            if nice and not launcher:  # no `nice` program: as soon as it is started
                with contextlib.suppress(OSError):
                    own = os.getpriority(os.PRIO_PROCESS, 0)  # relative, as `nice -n` is
                    os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, own + nice))
            try:
                assert proc.stdout is not None
                for line in iter(proc.stdout.readline, ""):
                    write(line)
                return proc.wait()
            finally:
                _live.discard(proc)

    return run_local_subprocess


@contextlib.contextmanager
def _quiet_context(*_: Any, **__: Any) -> Iterator[None]:
    yield


def _make_run_dag(on_failure: Callable[[str], None], failed: list[str]) -> Callable[..., Any]:
    from kfp.local import io, status
    from kfp.local.orchestrator import task_executor
    from kfp.local.orchestrator.orchestrator_utils import OrchestratorUtils

    def run_dag(
        pipeline_resource_name: str,
        dag_component_spec: Any,
        executors: dict,
        components: dict,
        dag_arguments: dict[str, Any],
        pipeline_root: str,
        runner: Any,
        unique_pipeline_id: str,
        fail_stack: list[str],
        parent_io_store: Any = None,
    ) -> tuple[dict[str, Any], Any]:
        """kfp.local's run_dag with every ready task started at once."""
        args = OrchestratorUtils.join_user_inputs_and_defaults(
            dag_arguments=dag_arguments, dag_inputs_spec=dag_component_spec.input_definitions
        )
        io_store = io.IOStore(parent=parent_io_store)
        for k, v in args.items():
            io_store.put_parent_input(k, v)
        tasks = dict(dag_component_spec.dag.tasks.items())
        deps = {name: set(spec.dependent_tasks) for name, spec in tasks.items()}
        done: set[str] = set()
        running: dict[str, threading.Thread] = {}
        results: dict[str, tuple[dict, Any]] = {}
        lock = threading.Condition()

        def execute(name: str) -> None:
            _current.task = tasks[name].task_info.name or name
            try:
                spec = tasks[name]
                component = components[spec.component_ref.name]
                if component.WhichOneof("implementation") == "dag":
                    out = run_dag(
                        pipeline_resource_name,
                        component,
                        executors,
                        components,
                        OrchestratorUtils.make_task_arguments(spec.inputs, io_store),
                        pipeline_root,
                        runner,
                        unique_pipeline_id,
                        fail_stack,
                        io_store,
                    )
                else:
                    out = task_executor.execute_single_task(
                        task_name=name,
                        task_spec=spec,
                        pipeline_resource_name=pipeline_resource_name,
                        components=components,
                        executors=executors,
                        io_store=io_store,
                        pipeline_root=pipeline_root,
                        runner=runner,
                        unique_pipeline_id=unique_pipeline_id,
                        fail_stack=fail_stack,
                    )
            except Exception as e:  # noqa: BLE001 - a crash of the runner is this task's failure
                log.exception("task %s could not run", name)
                out = ({}, status.Status.FAILURE)
                del e
            with lock:
                results[name] = out
                lock.notify_all()

        with lock:
            while True:
                for name, (outputs, st) in list(results.items()):
                    del results[name]
                    running.pop(name).join()
                    if st == status.Status.SUCCESS:
                        for key, value in outputs.items():
                            io_store.put_task_output(name, key, value)
                        done.add(name)
                    else:
                        display = tasks[name].task_info.name or name
                        if not failed:
                            fail_stack.append(name)
                        failed.append(display)
                        on_failure(display)
                if not failed:
                    for name in tasks:
                        if name not in done and name not in running and deps[name] <= done:
                            thread = threading.Thread(target=execute, args=(name,), daemon=True)
                            running[name] = thread
                            thread.start()
                if not running:
                    break
                lock.wait()
        if failed:
            return {}, status.Status.FAILURE
        return (
            OrchestratorUtils.get_dag_outputs(
                dag_outputs_spec=dag_component_spec.dag.outputs, io_store=io_store
            ),
            status.Status.SUCCESS,
        )

    return run_dag


@contextlib.contextmanager
def concurrent_local_runner(
    log_dir: Path,
    on_failure: Callable[[str], None],
    failed: list[str],
    task_env: TaskEnv | None = None,
    docker: DockerPlan | None = None,
) -> Iterator[None]:
    """Patch kfp.local to run ready tasks side by side (see the module docstring); with
    `docker`, each task in its stage's container (pipelines/local_docker.py)."""
    from kfp.local import logging_utils, subprocess_task_handler
    from kfp.local.orchestrator import dag_orchestrator

    from pipelines.local_docker import docker_tasks

    patches = [
        (dag_orchestrator, "run_dag", _make_run_dag(on_failure, failed)),
        (logging_utils, "local_logger_context", _quiet_context),
        (logging_utils, "indented_print", _quiet_context),
        (logging_utils, "print_horizontal_line", lambda: None),
        (
            subprocess_task_handler,
            "run_local_subprocess",
            _make_subprocess_runner(log_dir, task_env or (lambda task: {})),
        ),
    ]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, value in patches:
        setattr(mod, name, value)
    env = task_env or (lambda task: {})
    try:
        if docker is None:
            yield
        else:
            with docker_tasks(docker, _log_opener(log_dir), _current_task, env):
                yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def run_pipeline(
    pipeline_func: Callable[..., Any],
    arguments: dict[str, Any],
    *,
    pipeline_root: str,
    log_dir: Path,
    on_failure: Callable[[str], None] = lambda task: None,
    failure_message: Callable[[str], str | None] = lambda task: None,
    task_env: TaskEnv | None = None,
    docker: DockerPlan | None = None,
) -> None:
    """Run `pipeline_func(**arguments)` on kfp.local with concurrent tasks, as subprocesses of
    this Python or, with `docker`, each in its stage's image.

    `on_failure(task)` is called as soon as a task fails (before the others finish);
    `failure_message(task)` supplies the task's own error for the raised LocalRunError."""
    from kfp import local

    log_dir.mkdir(parents=True, exist_ok=True)
    runner = local.SubprocessRunner(use_venv=False) if docker is None else local.DockerRunner()
    local.init(runner=runner, pipeline_root=pipeline_root, raise_on_error=False)
    failed: list[str] = []
    root = logging.getLogger()
    quiet = _DropKfpLocalRecords()
    root.addFilter(quiet)  # kfp.local logs each task's status; the error below says it better
    with (
        concurrent_local_runner(log_dir, on_failure, failed, task_env, docker),
        warnings.catch_warnings(),
    ):
        # kfp.local warns per task that placement settings and the stage images do not apply
        # locally; that is by design here (the same pipeline serves the cluster).
        warnings.filterwarnings("ignore", message=".*no effect in the current local runner.*")
        warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
        import signal

        def on_term(signum, frame):  # `rlvr run` stopped from outside: take the tasks along
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            pipeline_func(**arguments)
        except BaseException:
            _kill_live_tasks()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            root.removeFilter(quiet)
    if failed:
        task = failed[0]
        path = _task_log_path(log_dir, task)
        message = failure_message(task) or _last_error(path) or "see its log"
        raise LocalRunError(task, message, path if path.exists() else None)


class _DropKfpLocalRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "kfp/local" not in record.pathname.replace("\\", "/")


def _last_error(path: Path) -> str | None:
    """The last `error:` line or exception line of a task's log."""
    if not path.exists():
        return None
    lines = path.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        s = line.strip()
        if s.startswith("error: ") or re.match(r"^[\w.]+(Error|Exception|Failed): ", s):
            return s
    return None


def print_error(err: LocalRunError, hints: list[str]) -> None:
    """The run's last words: the failed task, its own message (not a traceback), its log, and
    the commands that rerun the failed step or resume the run."""
    print(f"error: {err}", file=sys.stderr)
    if err.log_file is not None:
        print(f"  log: {err.log_file}", file=sys.stderr)
    for hint in hints:
        print(f"  {hint}", file=sys.stderr)


def failure_hints(
    task: str, record: dict, config: str, cfg, overrides, run_options: str = ""
) -> list[str]:
    """`rlvr stage ...` for the step that failed (when the task recorded its iteration), and
    the `rlvr run` that resumes; both repeat the run's --set overrides, and the resume its
    `run_options` (the runner)."""
    import shlex

    sets = "".join(f" --set {shlex.quote(o)}" for o in overrides)
    base = f"{shlex.quote(config)} --run-id {shlex.quote(cfg.run_id)}{sets}"
    hints = []
    stage = task.split("-")[0]
    iteration = record.get("iteration")
    if stage in STAGES and iteration is not None:
        shard = re.search(r"shard-(\d+)-of-(\d+)", task)
        extra = f" --shard {int(shard[1])} --num-shards {int(shard[2])}" if shard else ""
        what = "checkpoint" if stage == "evaluate" else "iteration"
        hints.append(
            f"rerun that step: rlvr stage {stage} {base} --iteration {iteration}{extra}"
            f"   ({what} {iteration})"
        )
    hints.append(
        f"then resume the run: rlvr run {base}{run_options}   (committed iterations are kept)"
    )
    return hints
