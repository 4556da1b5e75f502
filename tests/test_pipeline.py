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
    ir = yaml.safe_load(out.read_text())
    tasks = ir["root"]["dag"]["tasks"]
    names = sorted(t["taskInfo"]["name"] for t in tasks.values())
    for i in range(3):
        for stage in ("generate", "verify", "train"):
            assert f"{stage}-{i:05d}" in names
    assert {"init", "evaluate-00000", "evaluate-00003"} <= set(names)
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


def test_eval_checkpoints_every(workspace):
    cfg = load_config(workspace, ["run.iterations=5", "evaluate.every=2"])
    assert eval_checkpoints(cfg) == [0, 2, 4, 5]


@pytest.mark.slow
def test_rlvr_run_two_iterations_on_kfp_local_and_resume(workspace):
    cmd = [sys.executable, "-m", "pipelines.cli", "run", str(workspace), "--iterations", "2",
           "--set", "evaluate.every=2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = workspace.parent / "runs" / "t"
    for d in ("checkpoints/00000", "checkpoints/00001", "checkpoints/00002", "train_state/00002",
              "iterations/00001/rollouts", "iterations/00001/scored", "evals/00000", "evals/00002"):  # fmt: skip
        assert (root / d / "_SUCCESS").is_file(), d
    assert not (root / "evals/00001").exists()  # evaluate.every=2
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
    assert redone == {"checkpoints/00002", "train_state/00002"}
    # evals/00002 was committed before and is kept, as documented (use --force to redo).
    assert (root / "checkpoints/00002/_SUCCESS").is_file()
