"""The KFP v2 pipeline: compiled to IR, and run for real on kfp.local's SubprocessRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.core.config import load_config
from components.core.warm import eval_checkpoints

ROOT = Path(__file__).resolve().parents[2]


def _compile(workspace, out, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "compile", str(workspace), "-o", str(out), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load_all(out.read_text())


def test_compile_segment_pipeline_with_stage_images(workspace, tmp_path):
    ir, platform = _compile(
        workspace,
        tmp_path / "p.yaml",
        "--iterations",
        "3",
        "--set",
        "cluster.image_tag=v9",
        "--set",
        "verify.num_shards=2",
    )
    tasks = ir["root"]["dag"]["tasks"]
    names = sorted(t["taskInfo"]["name"] for t in tasks.values())
    assert names == sorted(
        [
            "init",
            "generate",
            "verify-shard-00000-of-00002",
            "verify-shard-00001-of-00002",
            "train",
            "evaluate",
            "next-segment",
            "report",
        ]
    )
    executors = ir["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert images == {
        f"ghcr.io/rlvr-project/rlvr-{s}:v9" for s in ("generate", "verify", "train", "evaluate")
    }
    for e in executors.values():
        command = " ".join(e["container"]["command"])
        assert "components." in command or "pipelines." in command  # bodies import the stages
        assert "pip install" not in command  # the images carry kfp: no start-up install
    by_name = {t["taskInfo"]["name"]: t for t in tasks.values()}
    deps = lambda n: {tasks[d]["taskInfo"]["name"] for d in by_name[n].get("dependentTasks", [])}  # noqa: E731
    # Every task but the report starts at once; they meet through the store, not the DAG.
    for w in (
        "init",
        "generate",
        "verify-shard-00000-of-00002",
        "train",
        "evaluate",
        "next-segment",
    ):
        assert deps(w) == set(), w
    assert deps("report") == {"evaluate"}
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert {"segment", "chain", "run_id", "store", "config_json"} <= set(params)


def test_generate_runs_code_with_tools(workspace, tmp_path):
    """With the python tool the policy's code runs in generate (and evaluate) too: the generate
    pod carries the runs-code label the code-sandbox overlay matches."""
    out = tmp_path / "tools.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "compile",
            str(workspace),
            "-o",
            str(out),
            "--set",
            "generate.tools=[python]",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    ir, platform = yaml.safe_load_all(out.read_text())
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    labelled = set()
    for task in ir["root"]["dag"]["tasks"].values():
        exe = task["componentRef"]["name"].replace("comp-", "exec-")
        labels = k8s[exe].get("podMetadata", {}).get("labels", {})
        if labels.get("rlvr.dev/runs-code") == "true":
            labelled.add(task["taskInfo"]["name"].split("-")[0])
    assert labelled == {"generate", "verify", "evaluate"}


def test_the_weight_channel_labels_its_pods_and_gives_train_its_ip(workspace, tmp_path):
    """train.handoff.channel: broadcast: the train pod (sender) and the generate pods
    (receivers) carry the label the weight-channel overlay's NetworkPolicy admits, and the
    train pod gets its own IP, which it publishes for the receivers; no other pod changes."""
    out = tmp_path / "channel.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "compile",
            str(workspace),
            "-o",
            str(out),
            "--set",
            "train.handoff.channel=broadcast",
            "--set",
            "generate.num_shards=2",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    ir, platform = yaml.safe_load_all(out.read_text())
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    roles, ips = {}, set()
    for task in ir["root"]["dag"]["tasks"].values():
        name = task["taskInfo"]["name"]
        spec = k8s[task["componentRef"]["name"].replace("comp-", "exec-")]
        role = spec.get("podMetadata", {}).get("labels", {}).get("rlvr.dev/weight-channel")
        if role:
            roles[name] = role
        for env in spec.get("fieldPathAsEnv", []):
            if env == {"name": "POD_IP", "fieldPath": "status.podIP"}:
                ips.add(name)
    assert roles == {
        "train": "sender",
        "generate-shard-00000-of-00002": "receiver",
        "generate-shard-00001-of-00002": "receiver",
    }
    assert ips == {"train"}
    policy = yaml.safe_load(
        (ROOT / "manifests/overlays/weight-channel/networkpolicy.yaml").read_text()
    )["spec"]
    (selector,) = policy["podSelector"]["matchExpressions"]
    assert selector["key"] == "rlvr.dev/weight-channel"
    assert set(selector["values"]) == set(roles.values())


def test_pipeline_size_does_not_grow_with_iterations(workspace, tmp_path):
    """A 1,000-iteration run compiles, in seconds, to the same tasks as a 3-iteration one: the
    segment is a run-time parameter (a KFP run on Argo must stay far below etcd's ~1.5 MiB)."""
    import time

    t0 = time.perf_counter()
    _compile(workspace, tmp_path / "big.yaml", "--iterations", "1000")
    seconds = time.perf_counter() - t0
    _compile(workspace, tmp_path / "small.yaml", "--iterations", "3")
    big, small = (tmp_path / "big.yaml").stat().st_size, (tmp_path / "small.yaml").stat().st_size
    assert big < 500_000 and seconds < 30
    assert abs(big - small) < 100  # only the embedded config's iteration count differs


def test_compiled_placement_from_config(workspace, tmp_path, monkeypatch):
    """GPU requests only on GPU stages, node pools, tolerations, /dev/shm, retries, timeouts,
    secret env by reference with no secret value, and caching off everywhere."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "super-secret-value-123")
    out = tmp_path / "pipeline.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "compile",
            str(workspace),
            "-o",
            str(out),
            "--set",
            "cluster.stages.train.accelerator_count=8",
            "--set",
            "cluster.stages.verify.retries=5",
        ],
        capture_output=True,
        text=True,
    )
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
        # the code-sandbox overlay gives exactly these pods its seccomp profile and egress policy
        labels = spec.get("podMetadata", {}).get("labels", {})
        runs_code = labels.get("rlvr.dev/runs-code") == "true"
        assert runs_code == (stage in ("verify", "evaluate")), name
        env = {e["envVar"] for e in spec["secretAsEnv"][0]["keyToEnv"]}
        assert spec["secretAsEnv"][0]["secretName"] == "rlvr-object-store"
        assert env == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_eval_checkpoints_every(workspace):
    cfg = load_config(workspace, ["run.iterations=5", "evaluate.every=2"])
    assert eval_checkpoints(cfg) == [0, 2, 4, 5]


@pytest.mark.slow
def test_rlvr_run_in_segments_on_kfp_local_and_resume(workspace):
    """Three iterations in two segments of warm workers (two generate shards, two evaluation
    shards and their gather), then a resume that redoes only what is missing: a segment with
    nothing to do does not even start."""
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        str(workspace),
        "--iterations",
        "3",
        "--set",
        "run.segment_iterations=2",
        "--set",
        "evaluate.every=2",
        "--set",
        "generate.num_shards=2",
        "--set",
        "evaluate.num_shards=2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 iterations in 2 segment(s)" in proc.stderr
    root = workspace.parent / "runs" / "t"
    for d in (
        "checkpoints/00000",
        "checkpoints/00003",
        "train_state/00003",
        "iterations/00002/rollouts/shard-00000-of-00002",
        "iterations/00002/rollouts/shard-00001-of-00002",
        "iterations/00002/scored",
        "evals/00000",
        "evals/00002",
        "evals/00003",
    ):
        assert (root / d / "_SUCCESS").is_file(), d
    assert not (root / "evals/00001").exists()  # evaluate.every=2
    for c in (0, 2, 3):
        for k in range(2):
            assert (root / f"eval_shards/{c:05d}/shard-{k:05d}-of-00002/_SUCCESS").is_file()
    assert (root / "report/report.md").is_file() and (root / "report/history.png").is_file()
    assert (root / "report/timeline.png").is_file()
    # evaluations happen as the run goes: checkpoint 0's is committed before the last train
    # (an interrupted run still has its held-out numbers)
    committed = lambda d: (root / d / "_SUCCESS").stat().st_mtime_ns  # noqa: E731
    assert committed("evals/00000") < committed("checkpoints/00003")
    assert yaml.safe_load((root / "run.yaml").read_text())["run"]["iterations"] == 3
    assert "held-out evaluation" in proc.stdout and "00003" in proc.stdout
    assert "an iteration" in proc.stderr  # the timing summary
    state = json.loads((root / "train_state/00003/state.json").read_text())
    assert state["step"] == 3
    # One warm train worker per segment: it built its engine once and reused it.
    engines = [
        json.loads((root / f"checkpoints/{c:05d}/_SUCCESS").read_text())["stats"]["train/engine"]
        for c in (1, 2, 3)
    ]
    assert engines == ["load", "reuse", "load"]
    for i in range(3):
        rollouts = root / f"iterations/{i:05d}/rollouts/shard-00000-of-00002/_SUCCESS"
        stats = json.loads(rollouts.read_text())["stats"]
        assert stats["policy_version"] == i and stats["timeline"]["task"].startswith("generate")
    # Each worker's whole output is kept in a log file per segment.
    assert "train 00002" in (root / "logs/segment-00001/train.log").read_text()

    # Resume: drop the last train output; a rerun redoes only what is missing.
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("**/_SUCCESS")}
    import shutil

    shutil.rmtree(root / "checkpoints/00003")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "segment 0 (iterations 0..1): done" in proc.stderr
    redone = {
        p.relative_to(root).parent.as_posix()
        for p, t in stamps.items()
        if not p.exists() or p.stat().st_mtime_ns != t
    }
    # Training is deterministic: checkpoint 3 comes back with the same content, so its
    # evaluation is still up to date. Its evaluation shards were resampled: the plan uncommits
    # them so that the gather cannot combine them with a new checkpoint (here the same one).
    # The run-level report is always regenerated.
    assert redone == {
        "checkpoints/00003",
        "train_state/00003",
        "report",
        "eval_shards/00003/shard-00000-of-00002",
        "eval_shards/00003/shard-00001-of-00002",
    }
    assert (root / "checkpoints/00003/_SUCCESS").is_file()


@pytest.mark.slow
def test_a_failing_worker_stops_the_run_with_its_error(workspace):
    """A verifier that fails every sample: verify's worker fails at iteration 0, the other
    workers stop waiting at once, and `rlvr run` ends with the stage's own message, the task's
    log file and how to resume; committed outputs stay."""
    import time

    plugin = workspace.parent / "broken_plugin.py"
    plugin.write_text("def compute_score(*args, **kwargs):\n    raise KeyError('no grader')\n")
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        str(workspace),
        "--iterations",
        "2",
        "--set",
        f"verify.rewards.arithmetic={plugin}:compute_score",
        "--set",
        "run.wait_timeout_s=600",
        "--skip-check",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
    assert proc.returncode == 2, proc.stderr[-3000:]  # bad input (the verifier), not a crash
    assert time.monotonic() - t0 < 120  # nobody waited out run.wait_timeout_s
    err = proc.stderr
    # verify fails at iteration 0, and evaluate of the base checkpoint (the same verifier
    # scores it) at checkpoint 0: whichever comes first is named, with its own message.
    import re

    failed_stage = re.search(r"error: task (verify|evaluate) failed: ", err)
    assert failed_stage, err
    stage = failed_stage[1]
    assert "samples errored or timed out" in err and "no grader" in err
    assert "ERROR:root" not in err and "Traceback" not in err
    assert f"{stage}.log" in err
    assert f"rerun that step: rlvr stage {stage} {workspace} --run-id t" in err
    assert "--set run.wait_timeout_s=600 --skip-check" not in err  # only --set overrides repeat
    assert "--iteration 0   (" in err and f"then resume the run: rlvr run {workspace}" in err
    root = workspace.parent / "runs" / "t"
    assert not (root / "iterations/00000/scored/_SUCCESS").exists()  # nothing scored
    # this attempt's markers, nobody else's (beside the retention's readers' leases)
    (attempt,) = [d for d in (root / "status").iterdir() if d.name != "retention"]
    train = json.loads((attempt / "failed/train.json").read_text())
    assert train["peer"] is True and "no grader" in train["error"]


def test_rlvr_run_checks_everything_before_any_work(workspace):
    """The same broken verifier without --skip-check: `rlvr run` stops before any task starts,
    with exit 2, the verifier's error, and nothing written to the run."""
    plugin = workspace.parent / "broken_plugin.py"
    plugin.write_text("def compute_score(*args, **kwargs):\n    raise KeyError('no grader')\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "run",
            str(workspace),
            "--set",
            f"verify.rewards.arithmetic={plugin}:compute_score",
            "--set",
            "train.policy_loss_options={clip_hi: 0.3}",
        ],
        capture_output=True,
        text=True,
        cwd=workspace.parent,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert "2 problems" in err and "Traceback" not in err
    assert "train.policy_loss_options.clip_hi: is not an option of policy loss 'ppo_clip'" in err
    assert "failed on a sample of data_source 'arithmetic'" in err and "no grader" in err
    assert not (workspace.parent / "runs").exists()
