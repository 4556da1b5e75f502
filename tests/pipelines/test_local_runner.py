"""The concurrent local runner (pipelines/local_runner.py): real KFP pipelines on kfp.local with
tasks side by side, and a failure that stops the run with the task's own message."""

# (No `from __future__ import annotations`: KFP reads the components' real annotations.)

import time

import pytest
from kfp import dsl

from pipelines.local_runner import LocalRunError, run_pipeline


def test_the_runner_touches_no_private_name_of_kfp():
    """The local runner reads the compiled IR and runs KFP's executor command; of kfp it
    imports only the compiler and the DSL, so a kfp release that reorganizes kfp.local cannot
    break it (pyproject.toml's range, tested at both ends in CI)."""
    import ast
    import pathlib

    imported = set()
    for name in ("local_runner", "local_ir", "local_docker"):
        tree = ast.parse(pathlib.Path(f"pipelines/{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
    assert {m for m in imported if m.split(".")[0] == "kfp"} == {"kfp.compiler"}


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


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def flaky(root: str, fail_times: int) -> int:
    """Fails its first `fail_times` attempts; returns the attempt that succeeded (from 1)."""
    import pathlib

    marker = pathlib.Path(root, "attempts")
    attempt = int(marker.read_text()) + 1 if marker.exists() else 1
    marker.write_text(str(attempt))
    print(f"attempt {attempt}")
    if attempt <= fail_times:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def describe(n: int, label: str = "attempts", job: str = "") -> str:
    return f"{label}={n} ({type(n).__name__}) job={bool(job)}"


def test_outputs_flow_downstream_and_a_retried_task_keeps_both_logs(tmp_path):
    """An int output reaches the next task as an int, a component default applies, a runtime
    placeholder (the job id) is filled in, and set_retry is honoured, its attempts one log."""

    @dsl.pipeline(name="retry")
    def pipeline(root: str):
        first = flaky(root=root, fail_times=1).set_display_name("flaky")
        first.set_retry(num_retries=2, backoff_duration="0s")
        describe(n=first.output, job=dsl.PIPELINE_JOB_ID_PLACEHOLDER).set_display_name("describe")

    outputs = run_pipeline(
        pipeline,
        {"root": str(tmp_path)},
        pipeline_root=str(tmp_path / "kfp"),
        log_dir=tmp_path / "logs",
    )
    assert outputs["flaky"] == {"Output": 2}
    assert outputs["describe"] == {"Output": "attempts=2 (int) job=True"}
    log = (tmp_path / "logs" / "flaky.log").read_text()
    assert "attempt 1" in log and "RuntimeError: attempt 1 fails" in log and "attempt 2" in log
    (job,) = (tmp_path / "kfp").iterdir()  # the compiled IR kept with the tasks' outputs
    assert (job / "pipeline.yaml").exists() and (job / "flaky" / "executor_output.json").exists()


def test_a_task_out_of_retries_fails_the_run(tmp_path):
    @dsl.pipeline(name="retry")
    def pipeline(root: str):
        flaky(root=root, fail_times=5).set_display_name("flaky").set_retry(
            num_retries=1, backoff_duration="0s"
        )

    with pytest.raises(LocalRunError) as e:
        run_pipeline(
            pipeline,
            {"root": str(tmp_path)},
            pipeline_root=str(tmp_path / "kfp"),
            log_dir=tmp_path / "logs",
        )
    assert "RuntimeError: attempt 2 fails" in str(e.value)
    assert (tmp_path / "attempts").read_text() == "2"


def test_what_the_runner_does_not_run_is_refused_with_a_reason(tmp_path):
    from pipelines.local_ir import PipelineNotRunnableLocally

    @dsl.pipeline(name="loop")
    def loop(root: str):
        with dsl.ParallelFor(items=[1, 2]) as n:
            describe(n=n)

    with pytest.raises(PipelineNotRunnableLocally, match="dsl.ParallelFor"):
        run_pipeline(loop, {"root": "x"}, pipeline_root=str(tmp_path), log_dir=tmp_path / "l")

    @dsl.pipeline(name="meet")
    def two(root: str):
        meet(root=root, me="a", other="b")

    with pytest.raises(PipelineNotRunnableLocally, match="no input named rot"):
        run_pipeline(two, {"rot": "x"}, pipeline_root=str(tmp_path), log_dir=tmp_path / "l")


def test_placeholders_are_filled_in_as_kfps_driver_does(tmp_path):
    """A list of task outputs (the compiler's `{{$.inputs.parameters[...]}}` references in a
    constant) becomes the values; a whole-value reference keeps its type; an unknown runtime
    placeholder is an error, not a literal string handed to the task."""
    from pipelines.local_ir import (
        IrTask,
        PipelineNotRunnableLocally,
        RunContext,
        task_command,
        task_inputs,
    )

    ctx = RunContext("p", str(tmp_path), job_id="0" * 32)
    task = IrTask(
        key="t",
        name="shown",
        component={
            "inputDefinitions": {
                "parameters": {"k": {"parameterType": "NUMBER_INTEGER", "defaultValue": 3}}
            }
        },
        container={
            "command": ["run", "{{$.pipeline_task_name}}", "{{$.inputs.parameters['k']}}"],
            "args": ["--out", "{{$.outputs.parameters['o'].output_file}}"],
        },
        inputs={
            "xs": {
                "runtimeValue": {
                    "constant": ["{{$.inputs.parameters['a']}}", "b-{{$.inputs.parameters['n']}}"]
                }
            },
            "one": {"runtimeValue": {"constant": "{{$.inputs.parameters['n']}}"}},
            "a": {"taskOutputParameter": {"producerTask": "up", "outputParameterKey": "Output"}},
            "n": {"componentInputParameter": "count"},
            "job": {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}},
        },
        depends=frozenset({"up"}),
    )
    values = task_inputs(task, {"count": 7}, {"up": {"Output": "A"}}, ctx)
    assert values == {"xs": ["A", "b-7"], "one": 7, "a": "A", "n": 7, "job": "0" * 32, "k": 3}
    command = task_command(task, {}, values, ctx)
    assert command == ["run", "shown", "3", "--out", str(tmp_path / "p-00000000" / "t" / "o")]
    bad = IrTask("t", "t", {}, {"command": ["{{$.workspace_path}}"]}, {}, frozenset())
    with pytest.raises(PipelineNotRunnableLocally, match="workspace_path"):
        task_command(bad, {}, {}, ctx)


def test_a_stopped_run_retries_nothing(tmp_path):
    """After Ctrl-C or SIGTERM (`_stopping`), a failed attempt is not retried and no task
    process starts."""
    from pipelines import local_runner
    from pipelines.local_ir import IrTask, Retry, RunContext

    calls = []

    def run(task, command, env):
        calls.append(task.name)
        return 1

    task = IrTask("t", "t", {}, {"command": ["true"]}, {}, frozenset(), Retry(count=3))
    ctx = RunContext("p", str(tmp_path))
    local_runner._stopping.set()
    try:
        assert local_runner._run_task(task, {}, {}, ctx, run, lambda: False) is None
        assert calls == ["t"]
        spawn = local_runner._make_subprocess_runner(tmp_path, lambda task: {})
        assert spawn(["sh", "-c", f"touch {tmp_path}/started"]) == 1
        assert not (tmp_path / "started").exists()
    finally:
        local_runner._stopping.clear()
