"""Run a compiled KFP pipeline on one machine with its tasks side by side.

The training pipeline's workers wait on each other through the store (pipelines/train.py), so
they have to run together; kfp.local's runners execute a pipeline's tasks one at a time. This
runner is its own small scheduler for the same compiled pipeline a cluster runs: it compiles the
pipeline with KFP's compiler, reads the IR (pipelines/local_ir.py resolves each task's inputs,
executor input and command, as KFP's driver does for a pod), and starts every task whose
upstream tasks have succeeded at once, each in a thread of its own:

- as a subprocess of this Python running KFP's executor (`python -m kfp.dsl.executor_main`,
  what every KFP pod runs), in its own process group; or, with a DockerPlan, in its stage's
  image (pipelines/local_docker.py) with the pipeline root mounted at its own path;
- each task's output whole to its own log file, and only its `rlvr` log lines (and errors) to
  the console, prefixed with the task name;
- a task's retry policy (`set_retry`) honoured while the run goes on.

It touches no private name of kfp: only the compiler, the IR it writes and the executor's
command line, so it works across the kfp releases pyproject.toml allows (CI runs the local
runner's tests on the lowest and the highest).

A task that fails stops the run: its failure is recorded for the other workers (which stop
waiting), running tasks finish, no new task starts, and `LocalRunError` names the task, its error
and its log file.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.core.stages import STAGES
from pipelines.local_ir import (
    CompiledPipeline,
    IrTask,
    PipelineNotRunnableLocally,
    RunContext,
    compile_pipeline,
    executor_input,
    read_outputs,
    read_pipeline,
    task_command,
    task_inputs,
)

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
_stopping = threading.Event()
"""Set while a run is being stopped (Ctrl-C, SIGTERM): no task process starts, none retries."""


def _kill_live_tasks() -> None:
    """Stop every running task and whatever it started (a torchrun's ranks, verifier pools),
    containers included; no task starts after this (`_stopping`)."""
    import os
    import signal

    from pipelines.local_docker import stop_live_containers

    _stopping.set()
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

    opened: set[str] = set()  # a retried task's attempts follow each other in its log

    @contextlib.contextmanager
    def open_log(task: str) -> Iterator[Callable[[str], None]]:
        mode = "a" if task in opened else "w"
        opened.add(task)
        with open(_task_log_path(log_dir, task), mode) as out:

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
        if _stopping.is_set():  # the run is being stopped: start nothing new
            return 1
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


def _make_dir(path: Path, like: Path) -> None:
    """`path` (and its missing parents) owned like `like`: with the docker runner a root caller
    hands the run to the images' uid (pipelines/local_docker.py, hand_over), whose tasks write
    their outputs here."""
    import os

    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    owner = like.stat()
    if os.geteuid() == 0 and (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
        for p in missing:
            os.chown(p, owner.st_uid, owner.st_gid)


def _python_task(command: list[str]) -> list[str]:
    """A Python component's command run with this Python: the `python3` of KFP's executor
    line (the shell script before the component's source) becomes `sys.executable`."""
    if not any(_EXECUTOR in part for part in command):
        raise PipelineNotRunnableLocally(
            "the subprocess runner runs Python components (`@dsl.component`) only; run a "
            "container component with --runner docker"
        )
    out, script_done = [], False
    for part in command:
        if not script_done and _EXECUTOR in part:
            part = part.replace(
                f"python3 -m {_EXECUTOR}", f"{shlex.quote(sys.executable)} -m {_EXECUTOR}"
            )
            script_done = True
        out.append(part)
    return out


_EXECUTOR = "kfp.dsl.executor_main"
RunTask = Callable[[IrTask, list[str], dict[str, str]], int]
"""Runs one task's command (with the container's own environment) and returns its status."""


def _subprocess_runner(log_dir: Path, task_env: TaskEnv) -> RunTask:
    run = _make_subprocess_runner(log_dir, task_env)
    return lambda task, command, env: run(_python_task(command), env)


def _docker_runner(
    plan: DockerPlan, log_dir: Path, task_env: TaskEnv, pipeline_root: str
) -> RunTask:
    """Each task in its stage's image, with the pipeline root mounted at its own path (as
    kfp.local's DockerRunner does)."""
    import docker as docker_sdk

    from pipelines.local_docker import make_container_runner

    client = docker_sdk.from_env()
    run = make_container_runner(plan, _log_opener(log_dir), _current_task, task_env)
    volumes = {pipeline_root: {"bind": pipeline_root, "mode": "rw"}}
    return lambda task, command, env: run(
        client, task.container["image"], command, volumes, environment=env
    )


def _run_task(
    task: IrTask,
    arguments: dict[str, Any],
    outputs: dict[str, dict[str, Any]],
    ctx: RunContext,
    run: RunTask,
    stopped: Callable[[], bool],
) -> dict[str, Any] | None:
    """One task, retried as its policy says while the run goes on: its outputs, or None when
    it failed."""
    values = task_inputs(task, arguments, outputs, ctx)
    root = ctx.task_root(task)
    command = task_command(task, executor_input(task, values, root), values, ctx)
    env = {e["name"]: e["value"] for e in task.container.get("env", [])}
    for attempt in range(task.retry.count + 1):
        _make_dir(root, like=Path(ctx.pipeline_root))
        if run(task, command, env) == 0:
            return read_outputs(task, root)
        if attempt >= task.retry.count or stopped():
            break
        delay = task.retry.delay(attempt)
        log.warning(
            "task %s failed (attempt %d of %d); retrying in %.0f s",
            task.name,
            attempt + 1,
            task.retry.count + 1,
            delay,
        )
        if _stopping.wait(delay) or stopped():  # stopped, or a peer failed, while waiting
            break
    return None


def _schedule(
    pipeline: CompiledPipeline,
    arguments: dict[str, Any],
    ctx: RunContext,
    run: RunTask,
    on_failure: Callable[[str], None],
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Run the pipeline's tasks, each in a thread of its own as soon as the tasks it depends
    on have succeeded; after a failure start nothing new and let the running ones finish.
    Returns the failed tasks' display names (the first first) and the succeeded ones'
    outputs by task key."""
    tasks = pipeline.tasks
    outputs: dict[str, dict[str, Any]] = {}
    running: dict[str, threading.Thread] = {}
    results: dict[str, dict[str, Any] | None] = {}
    failed: list[str] = []
    lock = threading.Condition()

    def execute(task: IrTask) -> None:
        _current.task = task.name
        try:
            out = _run_task(
                task, arguments, outputs, ctx, run, lambda: bool(failed) or _stopping.is_set()
            )
        except Exception:  # noqa: BLE001 - a crash of the runner is this task's failure
            log.exception("task %s could not run", task.name)
            out = None
        with lock:
            results[task.key] = out
            lock.notify_all()

    with lock:
        while True:
            for key, out in list(results.items()):
                del results[key]
                running.pop(key).join()
                if out is not None:
                    outputs[key] = out
                else:
                    failed.append(tasks[key].name)
                    on_failure(tasks[key].name)
            if not failed:
                for key, task in tasks.items():
                    if key not in outputs and key not in running and task.depends <= set(outputs):
                        thread = threading.Thread(target=execute, args=(task,), daemon=True)
                        running[key] = thread
                        thread.start()
            if not running:
                break
            lock.wait()
    return failed, outputs


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
) -> dict[str, dict[str, Any]]:
    """Compile `pipeline_func`, then run it with `arguments`: its tasks as subprocesses of this
    Python or, with `docker`, each in its stage's image. The compiled IR is kept with the
    tasks' outputs, under pipeline_root/JOB/ (pipeline.yaml).

    `on_failure(task)` is called as soon as a task fails (before the others finish);
    `failure_message(task)` supplies the task's own error for the raised LocalRunError.
    Returns each task's output parameters, by display name."""
    import signal
    import tempfile

    log_dir.mkdir(parents=True, exist_ok=True)
    root = str(Path(pipeline_root).resolve())
    Path(root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        pipeline = compile_pipeline(pipeline_func, Path(tmp) / "pipeline.yaml")
        ctx = RunContext(pipeline.name, root)
        job_dir = Path(root, ctx.job_name)
        _make_dir(job_dir, like=Path(root))
        pipeline = read_pipeline(Path(shutil.copy(pipeline.path, job_dir / "pipeline.yaml")))
    args = pipeline.arguments(arguments)
    env = task_env or (lambda task: {})
    _stopping.clear()
    if docker is None:
        run = _subprocess_runner(log_dir, env)
    else:
        from pipelines.local_docker import start_containers

        start_containers()
        run = _docker_runner(docker, log_dir, env, root)

    def on_term(signum, frame):  # `rlvr run` stopped from outside: take the tasks along
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        failed, outputs = _schedule(pipeline, args, ctx, run, on_failure)
    except BaseException:
        _kill_live_tasks()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        task = failed[0]
        path = _task_log_path(log_dir, task)
        message = failure_message(task) or _last_error(path) or "see its log"
        raise LocalRunError(task, message, path if path.exists() else None)
    return {pipeline.tasks[key].name: out for key, out in outputs.items()}


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
