"""One node of a multi-node train step (`train.nodes` > 1): what every pod of the job runs.

    python -m components.train.node CONFIG --run-id ID (--segment S [--attempt A] | --iteration I)

The job controller tells each pod its place in the job through the environment, and this entry
turns that into torchrun's static rendezvous: `nodes` agents, node 0's address as the master,
`processes` ranks per node, then `python -m components.train` as every rank (which runs the stage
itself: TORCHELASTIC_RUN_ID marks a launched rank). Rank 0 commits the outputs once every rank
has finished its update (components/train/stage.py), so a job of N nodes writes exactly what one
node of N x G processes would.

The environment, by controller:

- Kubeflow Trainer v2 (TrainJob, torch runtime): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT.
- Kubeflow Training Operator v1 (PyTorchJob): RANK (the pod's index: Master 0, Worker i is
  i + 1), MASTER_ADDR, MASTER_PORT; with nprocPerNode, PET_NPROC_PER_NODE too.

Node count and processes per node come from the config; a job whose controller says otherwise
(PET_NNODES, PET_NPROC_PER_NODE) is refused rather than run with a different world size.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from components.core.config import RunConfig
from components.core.errors import StageError

#: The variables a launched rank inherits that describe the agent's own place, not the rank's;
#: torchrun sets the rank's, and a stale RANK=1 (a PyTorchJob worker) must not leak into it.
AGENT_ONLY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@dataclass(frozen=True)
class NodePlace:
    """This node's place in the job: its index and where node 0's rendezvous listens."""

    node_rank: int
    master_addr: str
    master_port: int


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise StageError(f"environment variable {name}={env[name]!r} is not an integer") from None


def node_place(env: Mapping[str, str], nodes: int, per_node: int) -> NodePlace:
    """Where this node sits, from the job controller's variables (see the module docstring)."""
    if "PET_NNODES" in env and env["PET_NNODES"] != str(nodes):
        raise StageError(
            f"the job runs PET_NNODES={env['PET_NNODES']} nodes but train.nodes is "
            f"{nodes}; submit the job from this config (rlvr), or fix one of them"
        )
    if "PET_NPROC_PER_NODE" in env and env["PET_NPROC_PER_NODE"] not in {str(per_node), "auto"}:
        raise StageError(
            f"the job runs PET_NPROC_PER_NODE={env['PET_NPROC_PER_NODE']} processes "
            f"per node but this config runs {per_node} (train.processes, or the "
            "train pool's accelerator_count)"
        )
    # Kubeflow Trainer v2 sets the PET_* names; the Training Operator sets RANK (the pod's
    # index, which is the node's) and MASTER_*, and in newer releases some PET_* names too
    rank = next((v for v in ("PET_NODE_RANK", "RANK") if v in env), None)
    if rank is None:
        raise StageError(
            "no node rank in the environment (PET_NODE_RANK from Kubeflow Trainer, "
            "or RANK from a PyTorchJob); components.train.node runs as a pod of a "
            "multi-node train job"
        )
    addr = next((v for v in ("PET_MASTER_ADDR", "MASTER_ADDR") if env.get(v)), None)
    port = next((v for v in ("PET_MASTER_PORT", "MASTER_PORT") if env.get(v)), None)
    if addr is None or port is None:
        raise StageError(
            "PET_MASTER_ADDR / PET_MASTER_PORT (or MASTER_ADDR / MASTER_PORT) not "
            "set: the job controller gives every node node 0's address and port"
        )
    place = NodePlace(_int(env, rank), env[addr], _int(env, port))
    if not 0 <= place.node_rank < nodes:
        raise StageError(f"{rank}={place.node_rank} is outside the job's {nodes} nodes")
    return place


def torchrun_command(
    nodes: int, per_node: int, place: NodePlace, stage_args: list[str], rdzv_timeout_s: int
) -> list[str]:
    """This node's torchrun: a static rendezvous at node 0 that waits `rdzv_timeout_s` for every
    node to join, then the train stage as each rank."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        f"--node-rank={place.node_rank}",
        f"--master-addr={place.master_addr}",
        f"--master-port={place.master_port}",
        f"--rdzv-conf=timeout={rdzv_timeout_s}",
        "--max-restarts=0",
        "-m",
        "components.train",
        *stage_args,
    ]


def rank_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the node's agent passes on (the controller's agent-level variables out)."""
    return {k: v for k, v in env.items() if k not in AGENT_ONLY}


def run_node(cfg: RunConfig, stage_args: list[str]) -> NoReturn:
    """Become this node's torchrun (exec: in a pod this process is PID 1, and the kubelet's
    SIGTERM must reach torchrun, which passes it to the ranks; a wrapper would swallow it, and
    a wrapper killed alone would orphan the ranks)."""
    from components.train.launch import processes

    per_node = processes(cfg)
    place = node_place(os.environ, cfg.train.nodes, per_node)
    cmd = torchrun_command(
        cfg.train.nodes, per_node, place, stage_args, cfg.cluster.train_job.rendezvous_timeout_s
    )
    print(
        f"rlvr train node {place.node_rank}/{cfg.train.nodes}: {per_node} rank(s), rendezvous "
        f"at {place.master_addr}:{place.master_port}",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os.execve(cmd[0], cmd, rank_env(os.environ))


def main(argv: list[str] | None = None) -> None:
    """`python -m components.train.node CONFIG ...`: the stage command's own arguments."""
    import click

    from components.core.config import ConfigError
    from components.core.stage_cli import config_from_arg

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        click.echo(
            "usage: python -m components.train.node CONFIG --run-id ID "
            "(--segment S | --iteration I)",
            err=True,
        )
        sys.exit(2)
    run_id = args[args.index("--run-id") + 1] if "--run-id" in args[:-1] else None
    try:
        cfg = config_from_arg(args[0], [], run_id=run_id)
        run_node(cfg, args)
    except (ConfigError, StageError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
