"""The concurrent local runner (pipelines/local_runner.py): real KFP pipelines on kfp.local with
tasks side by side, and a failure that stops the run with the task's own message."""

# (No `from __future__ import annotations`: KFP reads the components' real annotations.)

import importlib.metadata
import time

import pytest
from kfp import dsl

from pipelines.local_runner import LocalRunError, run_pipeline


def test_kfp_is_the_version_whose_internals_are_replaced():
    """The runner replaces five names inside kfp.local; they are checked against kfp 2.17.0."""
    from kfp.local import logging_utils, subprocess_task_handler
    from kfp.local.orchestrator import dag_orchestrator

    assert importlib.metadata.version("kfp") == "2.17.0"
    for mod, name in (
        (dag_orchestrator, "run_dag"),
        (logging_utils, "local_logger_context"),
        (logging_utils, "indented_print"),
        (logging_utils, "print_horizontal_line"),
        (subprocess_task_handler, "run_local_subprocess"),
    ):
        assert callable(getattr(mod, name)), name


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def meet(root: str, me: str, other: str) -> str:
    """Write my file, then wait for the other task's: deadlocks when tasks run one at a time."""
    import pathlib
    import time

    pathlib.Path(root, me).write_text("here")
    deadline = time.time() + 60
    while not pathlib.Path(root, other).exists():
        if pathlib.Path(root, "stop").exists():
            raise RuntimeError(f"{me} stopped: a peer failed")
        if time.time() > deadline:
            raise TimeoutError(f"{me} never met {other}")
        time.sleep(0.05)
    return me


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def fail(message: str) -> str:
    raise ValueError(message)


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def after(inputs: list) -> str:
    return ",".join(sorted(inputs))


def test_tasks_that_wait_on_each_other_run_side_by_side(tmp_path):
    @dsl.pipeline(name="meet")
    def pipeline(root: str):
        a = meet(root=root, me="a", other="b").set_display_name("a")
        b = meet(root=root, me="b", other="a").set_display_name("b")
        after(inputs=[a.output, b.output]).set_display_name("after")

    t0 = time.monotonic()
    run_pipeline(
        pipeline,
        {"root": str(tmp_path)},
        pipeline_root=str(tmp_path / "kfp"),
        log_dir=tmp_path / "logs",
    )
    assert time.monotonic() - t0 < 60
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"a.log", "b.log", "after.log"}


def test_a_failed_task_stops_the_run_with_its_message(tmp_path):
    @dsl.pipeline(name="failing")
    def pipeline(root: str):
        meet(root=root, me="a", other="never").set_display_name("waiter")
        fail(message="verifier plugin missing").set_display_name("broken")

    stopped = []

    def on_failure(task: str) -> None:  # what rlvr run does: tell the peers
        stopped.append(task)
        (tmp_path / "stop").write_text(task)

    with pytest.raises(LocalRunError) as e:
        run_pipeline(
            pipeline,
            {"root": str(tmp_path)},
            pipeline_root=str(tmp_path / "kfp"),
            log_dir=tmp_path / "logs",
            on_failure=on_failure,
        )
    assert e.value.task == "broken"
    assert "ValueError: verifier plugin missing" in str(e.value)
    assert e.value.log_file == tmp_path / "logs" / "broken.log"
    assert stopped[0] == "broken"  # and the waiter then stopped too, instead of waiting 60 s


def test_the_console_gets_results_and_problems_only():
    from pipelines.local_runner import CONSOLE_LINE

    shown = [
        "2026-11-23 11:14:26,408 rlvr.evaluate INFO evaluate 00003: pass@1 0.1825",
        "2026-11-23 11:14:26,408 rlvr.verify WARNING 3 samples timed out",
        "2026-11-23 11:14:26,408 rlvr.train ERROR rank 1 died",
        "error: train: inputs: 1 problem",
        "Traceback (most recent call last):",
    ]
    hidden = [
        "2026-11-23 11:14:26,408 rlvr.generate INFO generate 00005: 256 samples from checkpoint 5",
        "2026-11-23 11:14:26,408 rlvr.train INFO train 00004: loss -0.0175 reward 0.270",
        "[2026-11-23 11:25:10,556] [WARNING] [real_accelerator.py:213:get_accelerator] Setting "
        "accelerator to CPU.",
        "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully",
        "/x/kfp/local/orchestrator/task_executor.py:100: UserWarning: Task 'x': settings",
    ]
    assert all(CONSOLE_LINE.search(line) for line in shown)
    assert not any(CONSOLE_LINE.search(line) for line in hidden)
