"""The KFP v2 pipeline: compiled to IR, and run for real on kfp.local's SubprocessRunner."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from components.core.config import load_config
from pipelines.train import eval_checkpoints


def test_compile_unrolls_iterations_with_stage_images(workspace, tmp_path):
    out = tmp_path / "pipeline.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "compile", str(workspace), "-o", str(out),
         "--iterations", "3", "--set", "cluster.image_tag=v9"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ir, platform = yaml.safe_load_all(out.read_text())
    tasks = ir["root"]["dag"]["tasks"]
    names = sorted(t["taskInfo"]["name"] for t in tasks.values())
    for i in range(3):
        for stage in ("generate", "verify", "train"):
            assert f"{stage}-{i:05d}" in names
    assert {"init", "evaluate-00000", "evaluate-00003", "report"} <= set(names)
    executors = ir["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert images == {
        f"ghcr.io/rlvr-project/rlvr-{s}:v9" for s in ("generate", "verify", "train", "evaluate")
    }
    for e in executors.values():
        assert "components." in " ".join(e["container"]["command"])  # bodies import the stages
    # Every task waits for the previous stage of its iteration.
    by_name = {t["taskInfo"]["name"]: t for t in tasks.values()}
    deps = lambda n: {tasks[d]["taskInfo"]["name"] for d in by_name[n].get("dependentTasks", [])}  # noqa: E731
    assert deps("verify-00001") == {"generate-00001"} and deps("generate-00001") == {"train-00000"}
    assert deps("evaluate-00003") == {"train-00002"}
    assert deps("report") == {f"evaluate-{c:05d}" for c in range(4)}
    # evaluate of checkpoint i+1 and generate of iteration i+1 both wait only for train i, so
    # they can run side by side.
    assert deps("generate-00002") == {"train-00001"} == deps("evaluate-00002")


def test_compiled_placement_from_config(workspace, tmp_path, monkeypatch):
    """GPU requests only on GPU stages, node pools, tolerations, /dev/shm, retries, timeouts,
    secret env by reference with no secret value, and caching off everywhere."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "super-secret-value-123")
    out = tmp_path / "pipeline.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "compile", str(workspace), "-o", str(out),
         "--set", "cluster.stages.train.accelerator_count=8", "--set", "cluster.stages.verify.retries=5"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "super-secret-value-123" not in text and "testing" not in text
    ir, platform = yaml.safe_load_all(text)
    tasks = ir["root"]["dag"]["tasks"]
    executors = ir["deploymentSpec"]["executors"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for task in tasks.values():
        name = task["taskInfo"]["name"]
        stage = name.split("-")[0]
        assert task["cachingOptions"].get("enableCache", False) is False, name
        exe = task["componentRef"]["name"].replace("comp-", "exec-")
        resources = executors[exe]["container"].get("resources", {})
        accel = resources.get("accelerator", {})
        spec = k8s[exe]
        if stage in ("generate", "train", "evaluate"):
            want = 8 if stage == "train" else 1
            assert accel["resourceType"] == "nvidia.com/gpu" and int(accel["resourceCount"]) == want
            assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert spec["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
            pool = "generate" if stage == "evaluate" else stage
            assert spec["nodeSelector"]["labels"] == {"rlvr.io/pool": pool}
        else:
            assert not accel, name
            assert "tolerations" not in spec and "emptyDirMounts" not in spec
        if stage == "verify":
            assert spec["nodeSelector"]["labels"] == {"rlvr.io/pool": "verify"}
            assert task["retryPolicy"]["maxRetryCount"] == 5
        assert int(spec["activeDeadlineSeconds"]) > 0
        env = {e["envVar"] for e in spec["secretAsEnv"][0]["keyToEnv"]}
        assert spec["secretAsEnv"][0]["secretName"] == "rlvr-object-store"
        assert env == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_eval_checkpoints_every(workspace):
    cfg = load_config(workspace, ["run.iterations=5", "evaluate.every=2"])
    assert eval_checkpoints(cfg) == [0, 2, 4, 5]


@pytest.mark.slow
def test_rlvr_run_two_iterations_on_kfp_local_and_resume(workspace):
    cmd = [sys.executable, "-m", "pipelines.cli", "run", str(workspace), "--iterations", "2",
           "--set", "evaluate.every=2", "--set", "generate.num_shards=2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = workspace.parent / "runs" / "t"
    for d in ("checkpoints/00000", "checkpoints/00001", "checkpoints/00002", "train_state/00002",
              "iterations/00001/rollouts/shard-00000-of-00002",
              "iterations/00001/rollouts/shard-00001-of-00002", "iterations/00001/scored", "evals/00000", "evals/00002"):  # fmt: skip
        assert (root / d / "_SUCCESS").is_file(), d
    assert not (root / "evals/00001").exists()  # evaluate.every=2
    assert (root / "report/report.md").is_file() and (root / "report/history.png").is_file()
    assert yaml.safe_load((root / "run.yaml").read_text())["run"]["iterations"] == 2
    assert "held-out evaluation" in proc.stdout and "00002" in proc.stdout
    state = json.loads((root / "train_state/00002/state.json").read_text())
    assert state["step"] == 2

    # Resume: drop the last train output; a rerun redoes only what is missing.
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("**/_SUCCESS")}
    import shutil

    shutil.rmtree(root / "checkpoints/00002")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    redone = {p.relative_to(root).parent.as_posix() for p, t in stamps.items()
              if not p.exists() or p.stat().st_mtime_ns != t}  # fmt: skip
    # (the run-level report is always regenerated from whatever evaluations exist)
    assert redone == {"checkpoints/00002", "train_state/00002", "report"}
    # evals/00002 was committed before and is kept, as documented (use --force to redo).
    assert (root / "checkpoints/00002/_SUCCESS").is_file()
