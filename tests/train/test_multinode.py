"""Multi-node training (train.nodes > 1) without a cluster: the node entry's reading of each job
controller's environment, and real two-"node" runs on this machine whose update equals one node
of two processes.

The two-node runs start the exact command a TrainJob's pods run (from the spec the train task
would submit), twice, with the variables Kubeflow Trainer sets in each pod (PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) and a loopback master: two
torchrun agents, one rank each, static rendezvous. One node of two processes and two nodes of
one have the same ranks holding the same rows and the same gloo all-reduce over two ranks, so
the gradients (read back as Adam's first moment, exactly (1 - beta1) x the clipped gradient
after the first step) and the checkpoint agree to float round-off; the bound is 1e-5 relative.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout
from components.train import jobspec
from components.train.node import NodePlace, node_place, rank_env, torchrun_command
from tests.support.runs import free_port, one_update, prepare_update


def test_trainer_v2_environment_places_the_node():
    env = {
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": "8",
        "PET_NODE_RANK": "3",
        "PET_MASTER_ADDR": "job-node-0-0.job",
        "PET_MASTER_PORT": "29400",
    }
    assert node_place(env, 4, 8) == NodePlace(3, "job-node-0-0.job", 29400)


def test_pytorchjob_environment_places_the_node():
    """The Training Operator's RANK is the pod's index (Master 0, Worker i is i + 1)."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    assert node_place(env, 2, 8) == NodePlace(1, "job-master-0", 23456)
    # newer operators add PET_NPROC_PER_NODE (and may leave the master as MASTER_*)
    assert node_place({**env, "PET_NPROC_PER_NODE": "8"}, 2, 8).node_rank == 1


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (
            {
                "PET_NNODES": "3",
                "PET_NODE_RANK": "0",
                "PET_MASTER_ADDR": "a",
                "PET_MASTER_PORT": "1",
            },
            "PET_NNODES=3 nodes but train.nodes is 2",
        ),
        (
            {
                "PET_NPROC_PER_NODE": "4",
                "PET_NODE_RANK": "0",
                "PET_MASTER_ADDR": "a",
                "PET_MASTER_PORT": "1",
            },
            "PET_NPROC_PER_NODE=4 processes per node but this config runs 8",
        ),
        ({"PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1"}, "no node rank"),
        ({"PET_NODE_RANK": "0", "PET_MASTER_PORT": "1"}, "PET_MASTER_ADDR"),
        (
            {"PET_NODE_RANK": "2", "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1"},
            "PET_NODE_RANK=2 is outside the job's 2 nodes",
        ),
        (
            {"PET_NODE_RANK": "x", "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1"},
            "PET_NODE_RANK='x' is not an integer",
        ),
    ],
)
def test_a_job_that_disagrees_with_the_config_is_refused(env, match):
    with pytest.raises(StageError, match=match):
        node_place(env, 2, 8)


def test_a_pod_without_its_resolved_config_is_refused_clearly(monkeypatch):
    """`env:NAME` (every pod's config) names the variable and the fix; the pod entry exits 2
    with that message, no traceback, and starts nothing."""
    from components.core.config import ConfigError
    from components.core.stage_cli import config_from_arg

    monkeypatch.delenv("RLVR_CONFIG_JSON", raising=False)
    with pytest.raises(ConfigError, match="environment variable RLVR_CONFIG_JSON is not set"):
        config_from_arg("env:RLVR_CONFIG_JSON", [])
    monkeypatch.setenv("RLVR_CONFIG_JSON", '{"train": {"nodes": "two"}}')
    with pytest.raises(ConfigError, match="env:RLVR_CONFIG_JSON: not a valid resolved config"):
        config_from_arg("env:RLVR_CONFIG_JSON", [])
    with pytest.raises(ConfigError, match="--set applies to config files only"):
        config_from_arg("env:RLVR_CONFIG_JSON", ["train.lr=1"])
    env = {k: v for k, v in os.environ.items() if k != "RLVR_CONFIG_JSON"}
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train.node",
            "env:RLVR_CONFIG_JSON",
            "--run-id",
            "r",
            "--iteration",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "error: env:RLVR_CONFIG_JSON: environment variable RLVR_CONFIG_JSON is not set" in (
        ran.stderr
    )


def test_node_runs_torchrun_with_a_static_rendezvous_at_node_0():
    cmd = torchrun_command(2, 8, NodePlace(1, "m", 29400), ["cfg", "--segment", "0"], 1800)
    assert cmd[1:] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=1",
        "--master-addr=m",
        "--master-port=29400",
        "--rdzv-conf=timeout=1800",
        "--max-restarts=0",
        "-m",
        "components.train",
        "cfg",
        "--segment",
        "0",
    ]
    # a PyTorchJob worker's RANK=1 is the node's, never a rank's: it stays with the agent
    env = rank_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}


def test_nodes_enter_the_lineage_only_when_more_than_one():
    """A one-node run's lineage leaves the node count out (its declared role); a multi-node
    one records it."""
    from components.core.config_fields import lineage_dump

    base = {"model": {"base": "b"}, "data": {"train": "t.parquet"}}
    one = RunConfig.model_validate(base)
    assert "nodes" not in lineage_dump(one.train, one)
    multi = RunConfig.model_validate({**base, "train": {"nodes": 2}})
    assert lineage_dump(multi.train, multi)["nodes"] == 2


def test_check_flags_a_multi_node_config_that_cannot_be_placed():
    from components.core.errors import Problems
    from components.train.checks import check_train

    base = {"model": {"base": "b"}, "data": {"train": "t.parquet"}}
    cfg = RunConfig.model_validate(
        {
            **base,
            "train": {"nodes": 2, "processes": 16},
            "cluster": {"stages": {"train": {"accelerator_count": 8}}},
        }
    )
    problems = Problems()
    check_train(cfg, problems)
    (error,) = problems.errors
    assert error.where == "config train.processes" and "a train node has 8 GPUs" in error.what
    assert [p.where for p in problems.items if p.warning] == ["config train.zero_stage"]
    late = RunConfig.model_validate(
        {
            **base,
            "train": {"nodes": 2, "zero_stage": 3},
            "cluster": {"train_job": {"schedule_timeout_s": 7200, "rendezvous_timeout_s": 1800}},
        }
    )
    problems = Problems()
    check_train(late, problems)
    assert [p.where for p in problems.items] == ["config cluster.train_job.schedule_timeout_s"]
    fine = RunConfig.model_validate({**base, "train": {"nodes": 2, "zero_stage": 3}})
    problems = Problems()
    check_train(fine, problems)
    assert not problems.items
    one = RunConfig.model_validate({**base, "train": {"processes": 16}})  # one node: not judged
    problems = Problems()
    check_train(one, problems)
    assert not problems.items


def test_loopback_nodes_get_gpus_of_their_own(monkeypatch):
    """Two ranks on one GPU is an NCCL error: loopback nodes share the visible GPUs out."""
    from components.train import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launch._loopback_gpus(2, None) == (4, ["0,1,2,3", "4,5,6,7"])
    assert launch._loopback_gpus(2, 2) == (2, ["0,1", "2,3"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert launch._loopback_gpus(3, None) == (1, ["3", "5", "6"])
    with pytest.raises(StageError, match="needs 4 GPUs, and 3 are visible"):
        launch._loopback_gpus(2, 2)
    with pytest.raises(StageError, match="needs 4 GPUs, and 3 are visible"):
        launch._loopback_gpus(4, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch._loopback_gpus(2, None) == (1, [None, None])


RANK_SCRIPT = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(300)
"""

#: what a loopback agent becomes (node.py execs torchrun), with one rank that only sleeps
AGENT = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node=1",
    "--max-restarts=0",
]


def _rank_pid(path: Path, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the rank did not start")


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    return not _alive(pid)


def test_stopping_an_agent_stops_its_ranks(tmp_path):
    """A failed node's peers are stopped with SIGTERM, which torchrun passes on to its ranks
    (torch starts each rank in a session of its own, so no process-group kill reaches them)."""
    from components.train import launch

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    agent = subprocess.Popen([*AGENT, str(script), str(tmp_path / "pid")])
    rank = _rank_pid(tmp_path / "pid")
    launch._stop([agent])
    assert agent.returncode is not None and _gone(rank, 10)


def test_the_local_runner_stopping_a_train_task_stops_its_loopback_ranks(tmp_path):
    """The local runner stops a task by signalling its process group (pipelines/local_runner.py);
    the loopback agents are in that group, so their ranks end even when the task itself dies
    at once (it has no SIGTERM handler)."""
    import signal

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    task = subprocess.Popen(  # the task, as the runner starts it; its agent as launch does
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(300)",
            *AGENT,
            str(script),
            str(tmp_path / "pid"),
        ],
        start_new_session=True,
    )
    rank = _rank_pid(tmp_path / "pid")
    os.killpg(task.pid, signal.SIGTERM)
    task.wait(10)
    assert _gone(rank, 45)  # torchrun gives its ranks up to 30 s


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, unreaped
    except FileNotFoundError:
        return False


# --- real runs on loopback --------------------------------------------------------------------


@pytest.fixture
def prepared(tmp_path, tiny_assets) -> RunConfig:
    return prepare_update(tmp_path, tiny_assets)


def _assert_same_update(a: tuple, b: tuple) -> None:
    (wa, sa, ma), (wb, sb, mb) = a, b
    assert wa.keys() == wb.keys()
    moments = [k for k in sa if k.startswith("exp_avg.")]
    assert moments and {k for k in sa if not k.startswith("rng.")} == {
        k for k in sb if not k.startswith("rng.")
    }
    assert sum(float(sa[k].abs().sum()) for k in moments) > 0  # a real gradient to compare
    for key in moments:  # exp_avg after one step = (1 - beta1) x the clipped gradient
        assert torch.allclose(sb[key], sa[key], rtol=1e-5, atol=1e-12), key
    for key in wa:
        assert torch.allclose(wb[key], wa[key], rtol=1e-5, atol=1e-12), key
    assert mb["train/world_size"] == ma["train/world_size"] == 2
    for key in ("train/loss", "train/grad_norm"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-5), key


@pytest.mark.slow
def test_two_trainjob_pods_on_loopback_match_one_node_of_two_processes(prepared, tmp_path):
    """Under ZeRO-3, where weights and Adam moments are partitioned across the nodes and
    gathered one parameter at a time for rank 0 to write."""
    cfg = prepared
    cfg.train.zero_stage = 3
    config = tmp_path / "resolved.yaml"
    config.write_text(cfg.to_json())
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            str(config),
            "-i",
            "0",
            "--set",
            "train.processes=2",
        ],
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    single = one_update(cfg)

    # the TrainJob the train task would submit for this iteration, and what its pods run
    multi = RunConfig.model_validate_json(cfg.to_json())
    multi.train.nodes, multi.train.processes = 2, 1
    job = jobspec.train_job(multi, ["--iteration", "0"], name="j", namespace="rlvr", iterations=1)
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 1)
    pod_env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    command = [sys.executable, *trainer["command"][1:]]  # the image's python is this one
    port = free_port()
    agents = [
        subprocess.Popen(
            command,
            env={
                **os.environ,
                **pod_env,
                "PET_NNODES": "2",
                "PET_NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(node),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(2)
    ]
    outs = [a.communicate(timeout=600) for a in agents]
    for a, (_, err) in zip(agents, outs, strict=True):
        assert a.returncode == 0, err[-3000:]
    assert "rlvr train node 1/2: 1 rank(s), rendezvous at 127.0.0.1" in outs[1][1]
    two = one_update(cfg)
    _assert_same_update(single, two)
    base = load_file(f"{RunLayout.of(cfg).checkpoint(0)}/model.safetensors")
    assert {k: v.shape for k, v in two[0].items()} == {k: v.shape for k, v in base.items()}
    assert any(not torch.equal(two[0][k], base[k]) for k in base)


@pytest.mark.slow
def test_a_pod_entry_of_one_rank_trains(prepared, tmp_path):
    """torchrun with a world of one (one node, one rank): the rank meets the agent's store at
    the launcher's port, as every rank does (it once took a fresh port of its own, as a bare
    single process does, and waited there forever)."""
    job = jobspec.train_job(
        prepared, ["--iteration", "0"], name="j", namespace="rlvr", iterations=1
    )
    trainer = job["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    env.update(
        PET_NNODES="1",
        PET_NPROC_PER_NODE="1",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(free_port()),
    )
    prepared.train.processes = 1
    env["RLVR_CONFIG_JSON"] = prepared.to_json()
    ran = subprocess.run(
        [sys.executable, *trainer["command"][1:]],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert one_update(prepared)[2]["train/world_size"] == 1


@pytest.mark.slow
def test_stage_command_with_two_nodes_runs_loopback_agents(prepared, tmp_path):
    """Off a cluster, `python -m components.train` with train.nodes=2 starts two node agents
    itself (what `rlvr stage train` and the local runner do) and returns rank 0's result."""
    cfg = prepared
    cfg.train.processes = 1
    config = tmp_path / "resolved.yaml"
    config.write_text(cfg.to_json())
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            str(config),
            "-i",
            "0",
            "--set",
            "train.nodes=2",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    result = json.loads(two.stdout[two.stdout.rfind("\n{") + 1 :])
    assert result["skipped"] is False and result["uri"].endswith("checkpoints/00001")
    weights, state, metrics = one_update(cfg)
    assert metrics["train/world_size"] == 2
    # a node that fails takes the step down with a message, not a hang
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            str(config),
            "-i",
            "0",
            "--set",
            "train.nodes=2",
            "--set",
            "train.advantage=nope",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode != 0
    assert "train node" in bad.stderr and "failed" in bad.stderr
