"""One container entry point, one process per GPU: how the train stage scales inside a pod.

    python -m components.train CONFIG --run-id ID --iteration I

`run` decides how many processes to use (`train.processes`, default: one per visible GPU, one on
CPU). With more than one, and when not already a launched rank (no TORCHELASTIC_RUN_ID), it re-launches
the stage under `torch.distributed.run --standalone --nproc_per_node N`; each rank then runs
`stage.run` with DeepSpeed data parallelism (NCCL on GPU, gloo on CPU), and rank 0 commits the
outputs. The pipeline sets the pod's GPU count from `cluster.stages.train.accelerator_count`.

With `train.nodes` > 1 the ranks span nodes. In a pod (the pipeline's train task on a cluster)
the stage is submitted as a Kubeflow Trainer TrainJob or a PyTorchJob (components/train/jobs.py)
whose pods each run components/train/node.py; anywhere else, `train.nodes` agents of that same
entry meet over a loopback rendezvous on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from components.core.config import RunConfig
from components.core.errors import StageError
from components.train.distributed import free_port, launched


def processes(cfg: RunConfig) -> int:
    if cfg.train.processes is not None:
        return cfg.train.processes
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def on_cluster() -> bool:
    """Inside a Kubernetes pod (the variable every pod gets for the API server's service)."""
    return "KUBERNETES_SERVICE_HOST" in os.environ


def _result(stdout: str, fallback: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's JSON result: the last JSON object the stage command printed."""
    last = stdout[stdout.rfind("\n{") + 1 :] if "\n{" in stdout else stdout
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        return fallback


def _relaunch(cfg: RunConfig, n: int, stage_args: list[str]) -> dict[str, Any]:
    """Run `python -m components.train CONFIG <stage_args>` as n ranks; rank 0's JSON result."""
    with tempfile.TemporaryDirectory(prefix="rlvr-launch-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(cfg.to_json())  # JSON is YAML; every path in it is already resolved
        args = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            "-m",
            "components.train",
            str(config),
            "--run-id",
            cfg.run_id,
            *stage_args,
        ]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
        }
        proc = subprocess.run(args, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise StageError(
            f"train on {n} processes failed (exit {proc.returncode}); see the ranks' logs above"
        )
    return _result(proc.stdout, {"skipped": False, "processes": n})


def _loopback_gpus(nodes: int, per_node: int | None) -> tuple[int, list[str | None]]:
    """Ranks per node and each node's CUDA_VISIBLE_DEVICES for `nodes` agents on this machine:
    disjoint slices of its visible GPUs (two ranks on one GPU is an NCCL error), or None each
    on a machine without one. `per_node` None: the visible GPUs shared out evenly."""
    import torch

    if not torch.cuda.is_available():
        return per_node or 1, [None] * nodes
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    per_node = per_node or len(ids) // nodes
    if per_node < 1 or nodes * per_node > len(ids):
        raise StageError(
            f"train.nodes={nodes} x {per_node or 1} rank(s) per node on this machine "
            f"needs {nodes * max(per_node, 1)} GPUs, and {len(ids)} are visible; "
            "lower train.processes or train.nodes (each rank needs a GPU of its own)"
        )
    return per_node, [",".join(ids[n * per_node : (n + 1) * per_node]) for n in range(nodes)]


def _stop(agents: list[subprocess.Popen], grace_s: float = 60.0) -> None:
    """End every agent still running: SIGTERM, which torchrun (each agent execs it) passes on to
    its ranks, waiting up to its own 30 s for them; SIGKILL only after `grace_s`. The agents
    stay in this task's process group, so a runner that stops the task's group (the local
    runner on a peer's failure or Ctrl-C) reaches them even if this process dies first."""
    live = [a for a in agents if a.poll() is None]
    for a in live:
        a.terminate()
    deadline = time.monotonic() + grace_s
    for a in live:
        try:
            a.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait()


def _loopback_nodes(cfg: RunConfig, stage_args: list[str]) -> dict[str, Any]:
    """`train.nodes` agents on this machine, each started as a job controller starts a pod
    (components/train/node.py with Kubeflow Trainer's PET_* variables), meeting over a loopback
    rendezvous: a multi-node config runs, and is tested, without a cluster. On a GPU machine
    each node gets its own GPUs."""
    nodes = cfg.train.nodes
    per_node, gpus = _loopback_gpus(nodes, cfg.train.processes)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rlvr-nodes-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(cfg.to_json())
        args = [
            sys.executable,
            "-m",
            "components.train.node",
            str(config),
            "--run-id",
            cfg.run_id,
            *stage_args,
        ]
        out = (Path(tmp) / "node-0.out").open("w+")
        agents: list[subprocess.Popen] = []
        try:
            for node in range(nodes):
                env = {
                    **os.environ,
                    "PET_NNODES": str(nodes),
                    "PET_NPROC_PER_NODE": str(per_node),
                    "PET_NODE_RANK": str(node),
                    "PET_MASTER_ADDR": "127.0.0.1",
                    "PET_MASTER_PORT": str(port),
                }
                if gpus[node] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[node]
                stdout = out if node == 0 else subprocess.DEVNULL  # rank 0's result is node 0's
                agents.append(subprocess.Popen(args, env=env, stdout=stdout))
            failed = None
            while failed is None and any(a.poll() is None for a in agents):
                failed = next((i for i, a in enumerate(agents) if a.poll()), None)
                time.sleep(0.2)
            failed = next((i for i, a in enumerate(agents) if a.poll()), failed)
        finally:
            _stop(agents)  # a failed node leaves its peers waiting in a collective
        out.seek(0)
        stdout_text = out.read()
        out.close()
    if failed is not None:
        raise StageError(
            f"train node {failed} of {nodes} failed (exit "
            f"{agents[failed].returncode}); see its ranks' logs above"
        )
    return _result(stdout_text, {"skipped": False, "nodes": nodes, "processes": per_node})


def _dispatch(cfg: RunConfig, stage_args: list[str], here, **job: Any) -> dict[str, Any]:
    """Run the stage here (`here()`), as local ranks, as loopback nodes, or as a cluster job
    (`job`: the attempt and whether KFP retries the task, for the failure marker)."""
    if launched():  # already a launched rank
        return here()
    if cfg.train.nodes > 1:
        if on_cluster():
            from components.train.jobs import run_job

            return run_job(cfg, stage_args, **job)
        return _loopback_nodes(cfg, stage_args)
    n = processes(cfg)
    return here() if n <= 1 else _relaunch(cfg, n, stage_args)


def run(cfg: RunConfig, iteration: int, *, force: bool = False) -> dict[str, Any]:
    """The train stage on as many processes and nodes as configured (see the module docstring)."""
    from components.train import stage

    args = ["--iteration", str(iteration), *(["--force"] if force else [])]
    return _dispatch(cfg, args, lambda: stage.run(cfg, iteration, force=force))


def serve(
    cfg: RunConfig, segment: int, *, attempt: str | None = None, retried: bool = False
) -> dict[str, Any]:
    """The warm train worker of one segment, on as many processes and nodes as configured: every
    rank serves the segment's iterations with its engine kept in memory."""
    from components.train import stage

    args = [
        "--segment",
        str(segment),
        *(["--attempt", attempt] if attempt else []),
        *(["--retried"] if retried else []),
    ]
    return _dispatch(
        cfg,
        args,
        lambda: stage.serve(cfg, segment, attempt=attempt, retried=retried),
        attempt=attempt,
        retried=retried,
    )
