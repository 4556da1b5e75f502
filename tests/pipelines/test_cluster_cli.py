"""`rlvr submit`, `rlvr schedule` and `rlvr runs` through the real kfp.Client, against a loopback
HTTP server that implements the few KFP v2beta1 endpoints involved and records every request."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import yaml
from click.testing import CliRunner

from pipelines.cli import main


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_submit_sends_the_pipeline_spec_and_parameters(workspace, kfp_server, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-in-the-request")
    result = invoke(
        "submit",
        str(workspace),
        "--host",
        kfp_server.url,
        "--experiment",
        "exp-a",
        "--iterations",
        "3",
    )
    assert result.exit_code == 0, result.output
    assert "run id: run-123" in result.output
    assert f"{kfp_server.url}/#/runs/details/run-123" in result.output
    assert [e["display_name"] for e in kfp_server.posts("/apis/v2beta1/experiments")] == ["exp-a"]
    (run,) = kfp_server.posts("/apis/v2beta1/runs")
    assert run["experiment_id"] == "exp-1" and run["display_name"] == "t-train-seg00000"
    spec = run["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "rlvr-train"
    tasks = spec["pipeline_spec"]["root"]["dag"]["tasks"]
    names = {t["taskInfo"]["name"] for t in tasks.values()}
    assert {"generate", "verify", "train", "evaluate", "next-segment"} <= names
    assert "kubernetes" in spec["platform_spec"]["platforms"]
    params = run["runtime_config"]["parameters"]
    assert params["run_id"] == "t" and params["segment"] == 0 and params["chain"] is True
    assert params["experiment"] == "exp-a"
    assert json.loads(params["config_json"])["run"]["iterations"] == 3
    assert "never-in-the-request" not in json.dumps(kfp_server.requests)


def test_each_segment_submits_the_next_until_the_last(workspace, kfp_server, monkeypatch):
    """The body of the `next-segment` task, run as it runs in a pod: it submits segment+1 of the
    run to the in-cluster KFP API (here the recording server) with the same parameters, and
    nothing after the last segment or when chaining is off."""

    from components.core.commit import OutputDir
    from components.core.config import load_config
    from components.core.layout import RunLayout, store_for
    from pipelines.chain import chain_next_segment

    cfg = load_config(
        workspace,
        ["run.iterations=5", "run.segment_iterations=2", f"cluster.kfp_api={kfp_server.url}"],
    )
    params = dict(config_json=cfg.to_json(), run_id="t", store="", base_checkpoint="", eval_sets="")
    store, layout = store_for(cfg), RunLayout.of(cfg)

    def train_commits(c: int) -> None:  # what the segment's train worker leaves behind
        for uri in (layout.checkpoint(c), layout.train_state(c)):
            out = OutputDir(store, uri, "train")
            out.begin(force=True)
            out.put_bytes(b"{}", "state.json")
            out.commit({})

    assert chain_next_segment(params, segment=0, chain=False, experiment="e", namespace="") == ""
    # It waits for segment 0's last checkpoint (00002) before it submits segment 1.
    threading.Timer(0.3, train_commits, (2,)).start()
    assert (
        chain_next_segment(params, segment=0, chain=True, experiment="e", namespace="") == "run-123"
    )
    assert store.exists(layout.checkpoint(2) + "/_SUCCESS")
    # A retried task (its pod lost after submitting) finds the claim and submits nothing.
    again = chain_next_segment(params, segment=0, chain=True, experiment="e", namespace="")
    assert again == "run-123" and len(kfp_server.posts("/apis/v2beta1/runs")) == 1
    train_commits(4)
    assert (
        chain_next_segment(params, segment=1, chain=True, experiment="e", namespace="") == "run-123"
    )
    assert chain_next_segment(params, segment=2, chain=True, experiment="e", namespace="") == ""
    runs = kfp_server.posts("/apis/v2beta1/runs")
    assert [r["display_name"] for r in runs] == ["t-train-seg00001", "t-train-seg00002"]
    assert [r["runtime_config"]["parameters"]["segment"] for r in runs] == [1, 2]
    assert all(r["runtime_config"]["parameters"]["chain"] is True for r in runs)
    assert all("store" not in r["runtime_config"]["parameters"] for r in runs)  # "" = default
    # The next segment is the same compiled pipeline: its size does not depend on the segment.
    specs = {json.dumps(r["pipeline_spec"], sort_keys=True) for r in runs}
    assert len(specs) == 1


def test_submit_refuses_a_segment_past_the_end(workspace, kfp_server):
    result = invoke("submit", str(workspace), "--host", kfp_server.url, "--segment", "5")
    assert result.exit_code == 2 and "segments 0..0" in result.output
    assert kfp_server.posts("/apis/v2beta1/runs") == []


def test_submit_single_stage_rerun(workspace, kfp_server):
    result = invoke(
        "submit", str(workspace), "--host", kfp_server.url, "--stage", "verify", "--iteration", "3"
    )
    assert result.exit_code == 0, result.output
    (run,) = kfp_server.posts("/apis/v2beta1/runs")
    assert run["display_name"] == "t-stage-verify-00003"
    spec = run["pipeline_spec"]["pipeline_spec"]
    assert spec["pipelineInfo"]["name"] == "rlvr-stage-verify"
    assert [t["taskInfo"]["name"] for t in spec["root"]["dag"]["tasks"].values()] == [
        "verify-00003"
    ]
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["iteration"]["defaultValue"] == 3 and defaults["force"]["defaultValue"] is True


def test_schedule_creates_a_recurring_eval_of_the_latest_checkpoint(workspace, kfp_server):
    result = invoke("schedule", str(workspace), "--host", kfp_server.url, "--cron", "0 0 */6 * * *")
    assert result.exit_code == 0, result.output
    assert "recurring run id: rr-7" in result.output
    (rr,) = kfp_server.posts("/apis/v2beta1/recurringruns")
    assert rr["trigger"]["cron_schedule"]["cron"] == "0 0 */6 * * *"
    assert rr["max_concurrency"] == "1" or rr["max_concurrency"] == 1
    assert rr["no_catchup"] is True and rr["mode"] == "ENABLE"
    assert rr["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "rlvr-eval"
    assert rr["runtime_config"]["parameters"]["checkpoint"] == "latest"


def test_schedule_rejects_five_field_cron(workspace, kfp_server):
    result = invoke("schedule", str(workspace), "--host", kfp_server.url, "--cron", "0 */6 * * *")
    assert result.exit_code == 2 and "six fields" in result.output
    assert kfp_server.posts("/apis/v2beta1/recurringruns") == []


def test_runs_lists(kfp_server):
    result = invoke("runs", "--host", kfp_server.url)
    assert result.exit_code == 0, result.output
    assert "run-123" in result.output and "SUCCEEDED" in result.output


def test_compile_eval_and_stage_pipelines(workspace, tmp_path):
    out = tmp_path / "eval.yaml"
    assert invoke("compile", str(workspace), "-o", str(out), "--pipeline", "eval").exit_code == 0
    ir = next(yaml.safe_load_all(out.read_text()))
    assert ir["pipelineInfo"]["name"] == "rlvr-eval"
    assert ir["root"]["inputDefinitions"]["parameters"]["checkpoint"]["defaultValue"] == "latest"
    names = {t["taskInfo"]["name"] for t in ir["root"]["dag"]["tasks"].values()}
    assert names == {"resolve-checkpoint", "evaluate"}
    bad = invoke("compile", str(workspace), "-o", str(out), "--pipeline", "stage")
    assert bad.exit_code == 2 and "--stage" in bad.output


def _run_next_segment_task(cfg, tmp_path: Path, **params) -> str:
    """The compiled `next-segment` task run the way a KFP pod runs it: its embedded source by
    `kfp.dsl.executor_main` under `_KFP_RUNTIME=true`, here with this interpreter (the pod's
    `python3`). Returns the task's output parameter."""
    import os
    import subprocess
    import sys

    import yaml

    from pipelines.cluster import compile_to
    from pipelines.train import build_train_pipeline

    compiled = compile_to(build_train_pipeline(cfg), tmp_path / "p.yaml")
    ir = next(yaml.safe_load_all(Path(compiled).read_text()))  # the pipeline spec, then platform
    container = ir["deploymentSpec"]["executors"]["exec-next-segment"]["container"]
    program = tmp_path / "ephemeral_component.py"
    program.write_text(container["command"][3])
    out_file, param_file = tmp_path / "executor_output.json", tmp_path / "Output"
    executor_input = {
        "inputs": {"parameterValues": params},
        "outputs": {
            "parameters": {"Output": {"outputFile": str(param_file)}},
            "outputFile": str(out_file),
        },
    }
    env = {**os.environ, "_KFP_RUNTIME": "true"}
    root = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        "-m",
        "kfp.dsl.executor_main",
        "--component_module_path",
        str(program),
        "--executor_input",
        json.dumps(executor_input),
        "--function_to_execute",
        "next_segment",
    ]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out_file.read_text())["parameterValues"]["Output"]


def test_the_next_segment_task_submits_under_the_kfp_runtime(workspace, kfp_server, tmp_path):
    """The task's body runs under `_KFP_RUNTIME=true`, where kfp's client and DSL do not import:
    with `chain` off it returns at once; with it on it submits segment 1 (from a fresh
    interpreter) once segment 0's last checkpoint is committed."""
    from components.core.commit import OutputDir
    from components.core.config import load_config
    from components.core.layout import RunLayout, store_for

    cfg = load_config(
        workspace,
        ["run.iterations=4", "run.segment_iterations=2", f"cluster.kfp_api={kfp_server.url}"],
    )  # noqa: E501
    params = dict(config_json=cfg.to_json(), run_id="t", segment=0, experiment="e")
    assert _run_next_segment_task(cfg, tmp_path, **params, chain=False) == ""
    assert kfp_server.posts("/apis/v2beta1/runs") == []
    store, layout = store_for(cfg), RunLayout.of(cfg)
    for uri in (layout.checkpoint(2), layout.train_state(2)):
        out = OutputDir(store, uri, "train")
        out.begin(force=True)
        out.put_bytes(b"{}", "state.json")
        out.commit({})
    assert _run_next_segment_task(cfg, tmp_path, **params, chain=True) == "run-123"
    (run,) = kfp_server.posts("/apis/v2beta1/runs")
    assert run["display_name"] == "t-train-seg00001"
    assert run["runtime_config"]["parameters"]["segment"] == 1
