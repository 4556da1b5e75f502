"""`rlvr run`'s work on one machine: build missing inputs, give each local worker its threads
and priority, and drive the segments of a run on the concurrent local runner
(pipelines/local_runner.py) with live progress, then print the evaluations and write the
report. The CLI (pipelines/cli.py) only parses options and checks the config."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from components.core.config import RunConfig
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.store import get_store, join
from components.model.run_setup import INPUTS_CHECKED_ENV

console = Console(stderr=True)


def prepare_inputs(cfg: RunConfig) -> None:
    """Run the config's prepare module when the base model or a dataset is missing."""
    inputs = {"model.base": cfg.model.base, "data.train": cfg.data.train}
    inputs |= {f"data.eval.{i}.path": e.path for i, e in enumerate(cfg.data.eval)}
    missing = [p for p in inputs.values() if "://" not in p and not Path(p).exists()]
    if not missing or cfg.prepare is None or not cfg.prepare.module:
        return  # nothing to build (`rlvr check` names whatever is missing)
    cmd = [sys.executable, "-m", cfg.prepare.module]
    if cfg.prepare.out:
        cmd += ["--out", cfg.prepare.out]
    console.print(f"[bold]preparing inputs[/]: {' '.join(cmd)}")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(cmd, cwd=root)
    if proc.returncode != 0:
        click.echo(f"error: prepare step {cfg.prepare.module} failed ({proc.returncode})", err=True)
        sys.exit(proc.returncode)
    still = [f"{key} ({p})" for key, p in inputs.items() if "://" not in p and not Path(p).exists()]
    if still:
        click.echo(
            f"error: prepare step {cfg.prepare.module} ran, but {', '.join(still)} still "
            f"{'does' if len(still) == 1 else 'do'} not exist: fix the path in the config "
            f"(the prepare step writes {cfg.prepare.out or 'its own outputs'})",
            err=True,
        )
        sys.exit(2)


EVAL_NICE = 10
"""Niceness of local evaluation workers: CFS then gives a contending evaluation thread about a
tenth of a core's time against a training one."""


def local_thread_env(
    cfg: RunConfig, *, inputs_checked: bool = False, share_device: bool = True
) -> Callable[[str], dict[str, str]]:
    """CPU threads per local worker (OMP_NUM_THREADS), by task; with `inputs_checked` (rlvr
    check passed just before), init is told not to load the base checkpoint again to check it
    (run_setup.INPUTS_CHECKED_ENV).

    Workers share one machine, and OpenMP threads that outnumber the cores slow everything down
    (measured: 7x on 2 cores when three workers spin at once). On-policy (max_staleness 0),
    generate and train never compute at the same time, so each gets every core; with bounded
    staleness they overlap and split the cores. Evaluation runs beside them on a quarter of the
    cores (at least one). `run.local_threads` sets one count for every worker instead.

    Evaluation also runs at a lower CPU priority (RLVR_NICE, applied by the local runner): its
    threads on top of generate's or train's outnumber the cores, and at equal priority they
    slowed generate 3-8x on 2 cores (SmolLM2 example: 15-31 tokens/s in the iterations an
    evaluation overlapped, 90-150 alone). Niced, it takes the cycles the training loop leaves
    (verify, commits, waits) and the cores once the loop is done; no checkpoint goes unevaluated.

    Evaluation also waits for its turn (components/model/device_turn.py, with `share_device`:
    the workers are processes of this machine): it samples only while neither generate nor
    train computes, on a GPU as on a CPU, where niceness alone still left generate 8-19x slower
    in the iterations an evaluation overlapped (the SmolLM2 example on 2 cores).
    `RLVR_DEVICE_TURN=off` in the environment turns that off.

    On a machine with no NVIDIA driver, DS_ACCELERATOR=cpu too: DeepSpeed warns "Setting
    accelerator to CPU. If you have GPU ..." in every worker that imports it otherwise."""
    import os

    from components.model import device_turn

    accelerator = {}
    gpu = Path("/proc/driver/nvidia").exists()
    if "DS_ACCELERATOR" not in os.environ and not gpu:
        accelerator = {"DS_ACCELERATOR": "cpu"}
    turns = share_device and os.environ.get(device_turn.TURN_ENV) != "off"
    turn_file = device_turn.lock_path()
    cores = os.cpu_count() or 1
    evals = cfg.evaluate.num_shards if cfg.data.evaluates else 0
    eval_threads = max(1, cores // 4)
    compute = cores if cfg.train.max_staleness == 0 else max(1, cores // 2)
    compute = max(1, compute // cfg.generate.num_shards) if cfg.generate.num_shards > 1 else compute

    def env(task: str) -> dict[str, str]:
        extra = {}
        if cfg.run.local_threads:
            n = cfg.run.local_threads
        elif task.startswith("evaluate"):
            n = max(1, eval_threads // max(evals, 1))
        elif task.startswith(("generate", "train")):
            n = compute
        else:
            n = 1  # init, verify (Python, and its own process pool), report, next-segment
        if task.startswith("evaluate"):
            extra = {"RLVR_NICE": str(EVAL_NICE)}
        if task == "init":  # set either way: a value in the user's shell is not a check
            extra = {INPUTS_CHECKED_ENV: "1" if inputs_checked else "0"}
        if turns:
            extra.update(device_turn.env_for(task, turn_file))
        return {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), **accelerator, **extra}

    return env


def eval_tables(cfg_or_root: RunConfig | str, label: str | None = None) -> list[Table]:
    """Rich tables of every committed evaluation of a run (``label``: what to call the
    checkpoint column's entries, for a one-checkpoint evaluation of an outside model): the
    held-out sets, and the standard benchmarks where the run has lm-eval suites."""
    if isinstance(cfg_or_root, RunConfig):
        store, root = store_for(cfg_or_root), RunLayout.of(cfg_or_root).root
    else:
        store, root = get_store(cfg_or_root), cfg_or_root.rstrip("/")
    layout = RunLayout(root)
    tops = {
        c: json.loads(store.read_text(layout.eval_metrics(c)))
        for c in committed_indices(store, layout.evals_dir)
    }
    tables = [_heldout_table(root, tops, label)] if any(t["sets"] for t in tops.values()) else []
    if any(t.get("lm_eval") for t in tops.values()):
        tables.append(_benchmark_table(root, tops, label))
    return tables or [_heldout_table(root, tops, label)]


def _benchmark_table(root: str, tops: dict[int, dict], label: str | None) -> Table:
    """lm-eval's metrics per checkpoint and task, with the standard error and the change
    since the first checkpoint evaluated."""
    table = Table(title=f"standard benchmarks (lm-evaluation-harness): {root}")
    for column in ("checkpoint", "task", "metric", "value", "stderr", "change"):
        table.add_column(
            column, justify="left" if column in ("checkpoint", "task", "metric") else "right"
        )
    first: dict[tuple[str, str], float] = {}
    for c, top in tops.items():
        for task, res in (top.get("lm_eval") or {}).items():
            for name, value in res["metrics"].items():
                if name.endswith("_stderr"):
                    continue
                err = res["metrics"].get(f"{name}_stderr")
                key = (task, name)
                change = f"{value - first[key]:+.4f}" if key in first else "-"
                first.setdefault(key, value)
                table.add_row(
                    label or f"{c:05d}",
                    task,
                    name,
                    f"{value:.4f}",
                    f"{err:.4f}" if err is not None else "-",
                    change,
                )
    return table


def _heldout_table(root: str, tops: dict[int, dict], label: str | None) -> Table:
    table = Table(title=f"held-out evaluation: {root}")
    table.add_column("checkpoint")
    table.add_column("eval set")
    table.add_column("pass@1", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("mean@n", justify="right")
    table.add_column("best pass@k", justify="right")
    for c, top in tops.items():
        for name, m in top["sets"].items():
            ov, n = m["overall"], m["n"]
            ci = ov.get("pass@1_ci95")
            ks = [int(k.split("@")[1]) for k in ov if k.startswith("pass@") and "_" not in k]
            kmax = max(ks)
            table.add_row(
                label or f"{c:05d}",
                name,
                f"{ov['pass@1']:.3f}",
                f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-",
                f"{ov[f'mean@{n}']:.3f}",
                f"pass@{kmax} {ov[f'pass@{kmax}']:.3f}",
            )
    return table


def tensorboard_hint(logdir: str) -> str:
    """How to view a run's event files: the `tensorboard` program comes with the `tensorboard`
    extra (or `dev`); writing them needs no package (components/core/tfevents.py)."""
    import shutil

    command = f"tensorboard --logdir {logdir}"
    if shutil.which("tensorboard"):
        return f"training figures: {command}"
    return f'training figures: pip install -e ".[tensorboard]", then {command}'


def print_tensorboard_hint(logdir: str) -> None:
    """The hint, printed as written: not rich markup, which would eat `[tensorboard]`."""
    console.print(tensorboard_hint(logdir), highlight=False, markup=False)


def run_local(
    cfg: RunConfig,
    *,
    config_path: str,
    overrides: tuple[str, ...],
    runner: str,
    docker_user: str,
    inputs_checked: bool = False,
) -> None:
    """`rlvr run` after its checks (`inputs_checked`: `rlvr check` passed, inputs included):
    every segment of the run on the concurrent local runner (subprocesses here, or each task in
    its stage's image), with live progress; then the evaluations' table, the timeline's summary
    and the run report. Exits 2 on a user error of a task (its hints printed), 1 on any other
    failure. `config_path` and `overrides` go into the hints, which give the command that
    resumes the run."""
    from components.core.warm import segments
    from components.model import device_turn
    from pipelines.train import build_train_pipeline

    layout, store = RunLayout.of(cfg), store_for(cfg)
    local = _LocalRun(cfg, config_path, overrides, runner, docker_user)
    store.write_text(layout.run_yaml, cfg.to_yaml())
    segs = segments(cfg)
    console.print(
        f"[bold]rlvr run[/] {cfg.run_id}: {cfg.run.iterations} iterations in {len(segs)} "
        f"segment(s) -> {layout.root}"
    )
    t0 = time.perf_counter()
    pipeline = build_train_pipeline(cfg, for_cluster=False)
    # In its image, init loads the base with the image's transformers, not this machine's
    # (which `rlvr check` used): there it checks again.
    task_env = local_thread_env(
        cfg, inputs_checked=inputs_checked and runner != "docker", share_device=runner != "docker"
    )
    try:
        _segments(cfg, local, pipeline, segs, task_env)
    finally:
        Path(device_turn.lock_path()).unlink(missing_ok=True)
    _finish(cfg, time.perf_counter() - t0)


def _segments(cfg: RunConfig, local, pipeline, segs, task_env) -> None:
    """Each segment of the run that is neither done nor past a stop, on the local runner."""
    from components.core.run_control import read_stop
    from pipelines.plan import segment_up_to_date

    for seg in segs:
        stop = read_stop(cfg)
        if stop is not None and stop.beyond("train", seg.start):
            console.print(
                f"segment {seg.index} (iterations {seg.start}..{seg.stop - 1}): not run, the run "
                f"stopped after iteration {stop.after_iteration}"
            )
            continue
        if segment_up_to_date(cfg, seg):
            stopped = f", the run stopped after iteration {stop.after_iteration}" if stop else ""
            console.print(
                f"segment {seg.index} (iterations {seg.start}..{seg.stop - 1}): done{stopped}"
            )
            continue
        local.segment(pipeline, seg, task_env)


class _LocalRun:
    """The machine's side of one `rlvr run`: where its outputs live, and for `--runner docker`
    the containers' plan and the uid that owns the run (checked before anything of the run is
    written)."""

    def __init__(
        self,
        cfg: RunConfig,
        config_path: str,
        overrides: tuple[str, ...],
        runner: str,
        docker_user: str,
    ) -> None:
        self.cfg, self.config_path, self.overrides = cfg, config_path, overrides
        self.docker_user = docker_user
        self.layout = RunLayout.of(cfg)
        root = self.layout.root
        self.local_root = Path(root) if "://" not in root else Path("./local_outputs")
        self.docker, self.owner = None, None
        if runner == "docker":
            from pipelines.local_docker import DockerSetupError, check_machine, plan_for

            self.docker = plan_for(cfg, self.local_root, user=docker_user)
            try:
                self.owner = check_machine(self.docker)
            except DockerSetupError as e:
                click.echo(f"error: {e}", err=True)
                sys.exit(2)

    def segment(self, pipeline: Any, seg: Any, task_env: Callable[[str], dict[str, str]]) -> None:
        """Run one segment under a fresh attempt; on a task's failure, print its root cause
        with the hints and exit."""
        from components.core.warm import RunStatus
        from pipelines.local_runner import LocalRunError, run_pipeline
        from pipelines.progress import RunMonitor

        attempt = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        status = RunStatus.of(self.cfg, attempt)
        log_dir = Path(RunLayout(str(self.local_root)).segment_logs(seg.index))

        def record_crash(task: str) -> None:
            if task not in status.failures():  # a worker that died without recording why
                status.mark_failed(task, "its process exited with an error")

        self._hand_over(status, log_dir)
        arguments = {
            "config_json": self.cfg.to_json(),
            "run_id": self.cfg.run_id,
            "segment": seg.index,
            "attempt": attempt,
        }
        try:
            with RunMonitor(self.cfg, seg, console):
                run_pipeline(
                    pipeline,
                    arguments,
                    pipeline_root=RunLayout(str(self.local_root)).local_kfp,
                    log_dir=log_dir,
                    on_failure=record_crash,
                    failure_message=lambda task: (status.failures().get(task) or {}).get("error"),
                    task_env=task_env,
                    docker=self.docker,
                )
        except LocalRunError as e:
            self._fail(e, status, log_dir)

    def _hand_over(self, status: Any, log_dir: Path) -> None:
        """With Docker: hand what exists of the run over to the images' uid (last, so that it
        covers the directories made here)."""
        if self.owner is None:
            return
        from pipelines.local_docker import hand_over

        Path(RunLayout(str(self.local_root)).local_kfp).mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        if "://" not in self.layout.root:  # failure markers: written by tasks and this process
            Path(status.dir).mkdir(parents=True, exist_ok=True)
        hand_over(self.local_root, self.owner)

    def _fail(self, e: Any, status: Any, log_dir: Path) -> None:
        """Print the root cause of a failed segment (the first task to fail, not the first to
        exit) with its hints; exit 2 for the user's error, 1 for any other."""
        from pipelines.local_runner import LocalRunError, failure_hints, print_error

        cause = status.root_cause()
        task, record = cause if cause else (e.task, {})
        if task != e.task:  # the first task to exit only stopped because of another
            log_file = log_dir / f"{task}.log"
            e = LocalRunError(
                task, record.get("error", ""), log_file if log_file.exists() else None
            )
        docker = f" --runner docker --docker-user {self.docker_user}" if self.docker else ""
        hints = failure_hints(task, record, self.config_path, self.cfg, self.overrides, docker)
        print_error(e, hints)
        sys.exit(2 if record.get("user_error") else 1)


def _finish(cfg: RunConfig, elapsed: float) -> None:
    """After the last segment: the final retention sweep, the evaluations' table, the
    timeline's summary, the report and dashboard, and where to find them."""
    from components.core.retention import sweep
    from components.core.store import StoreError
    from components.report.run_report import write_run_report
    from components.report.timeline import summarize_run

    layout, store = RunLayout.of(cfg), store_for(cfg)
    try:
        sweep(cfg, "rlvr run")  # what the last workers' sweeps could not retire yet
    except (StoreError, OSError) as e:
        console.print(f"[yellow]retention sweep failed ({e}); nothing a stage needs was deleted")
    if cfg.data.evaluates:
        Console().print(*eval_tables(cfg))
    print_health(store, layout.root)
    summary = summarize_run(store, layout.root)
    if summary:
        console.print(summary)
    paths = write_run_report(store, layout.root)  # the whole run's timeline, every evaluation
    console.print(f"done in {elapsed:.0f} s; outputs under {layout.root}")
    console.print(f"report with plots: {paths['report.md']}")
    if "index.html" in paths:
        console.print(f"dashboard (training dynamics): {paths['index.html']}")
    if "tensorboard" in cfg.tracking.backends:
        print_tensorboard_hint(layout.tensorboard_dir)


def print_health(store: Any, root: str) -> None:
    """The run's health verdict (components/core/run_control.py), as the newest checkpoint records
    it; nothing for a run with no update yet."""
    from components.core.run_control import latest

    h = latest(store, root)
    if h is None:
        return
    color = {"healthy": "green", "warning": "yellow"}.get(h.verdict, "red")
    console.print(f"[bold {color}]health: {h.verdict}[/] (after iteration {h.iteration})")
    if h.verdict != "healthy":
        console.print(h.summary, markup=False, highlight=False)
    if h.stop:
        console.print(
            f"[bold red]the run stopped after iteration {h.iteration}[/]: no learning signal for "
            f"{h.streak} iterations in a row (health.stop_after). To go on anyway: "
            "--set health.stop_after=0"
        )


def store_runs_table(store_uri: str) -> Table:
    """`rlvr runs --store`: every run in a store (a directory with run.yaml), with its
    committed updates, its newest evaluation's pass@1 and its health verdict."""
    import contextlib

    from components.core.run_control import latest
    from components.core.store import StoreError

    store, root = get_store(store_uri), store_uri.rstrip("/")
    table = Table(title=f"runs in {root}")
    for column in ("run id", "updates", "last pass@1", "health"):
        table.add_column(
            column, justify="right" if column in ("updates", "last pass@1") else "left"
        )
    for name in sorted(store.list_dirs(root)):
        run = RunLayout(join(root, name))
        if not store.exists(run.run_yaml):
            continue
        updates = [c for c in committed_indices(store, run.checkpoints_dir) if c > 0]
        evals = committed_indices(store, run.evals_dir)
        pass1 = "-"
        with contextlib.suppress(StoreError, ValueError, KeyError, TypeError, IndexError):
            top = json.loads(store.read_text(run.eval_metrics(evals[-1])))
            pass1 = f"{top['overall']['pass@1']:.3f} ({evals[-1]:05d})"  # held-out sets only
        h = latest(store, run.root)
        verdict = "-"
        if h is not None:
            verdict = h.summary.split(":")[0] if h.verdict != "warning" else "warnings"
            verdict += f"; stopped after {h.iteration}" if h.stop else ""
        table.add_row(name, str(len(updates)), pass1, verdict)
    return table
