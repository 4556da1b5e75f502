"""One container entry point, one process per GPU: how the train stage scales inside a pod.

    python -m components.train CONFIG --run-id ID --iteration I

`run` decides how many processes to use (`train.processes`, default: one per visible GPU, one on
CPU). With more than one, and when not already a launched rank (no TORCHELASTIC_RUN_ID), it re-launches
the stage under `torch.distributed.run --standalone --nproc_per_node N`; each rank then runs
`stage.run` with DeepSpeed data parallelism (NCCL on GPU, gloo on CPU), and rank 0 commits the
outputs. The pipeline sets the pod's GPU count from `cluster.stages.train.accelerator_count`.
Multi-node training is a documented follow-up (docs/deploy.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from components.core.config import RunConfig
from components.core.errors import StageError


def processes(cfg: RunConfig) -> int:
    if cfg.train.processes is not None:
        return cfg.train.processes
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def _launched() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def _relaunch(cfg: RunConfig, n: int, stage_args: list[str]) -> dict[str, Any]:
    """Run `python -m components.train CONFIG <stage_args>` as n ranks; rank 0's JSON result."""
    with tempfile.TemporaryDirectory(prefix="rlvr-launch-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(cfg.to_json())  # JSON is YAML; every path in it is already resolved
        args = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={n}", "-m", "components.train", str(config),
            "--run-id", cfg.run_id, *stage_args,
        ]  # fmt: skip
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
    last = proc.stdout[proc.stdout.rfind("\n{") + 1 :] if "\n{" in proc.stdout else proc.stdout
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        return {"skipped": False, "processes": n}


def run(cfg: RunConfig, iteration: int, *, force: bool = False) -> dict[str, Any]:
    """The train stage on as many local processes as configured (see the module docstring)."""
    from components.train import stage

    n = processes(cfg)
    if n <= 1 or _launched():  # one process, or already a launched rank
        return stage.run(cfg, iteration, force=force)
    return _relaunch(cfg, n, ["--iteration", str(iteration), *(["--force"] if force else [])])


def serve(
    cfg: RunConfig, segment: int, *, attempt: str | None = None, retried: bool = False
) -> dict[str, Any]:
    """The warm train worker of one segment, on as many local processes as configured: every
    rank serves the segment's iterations with its engine kept in memory."""
    from components.train import stage

    n = processes(cfg)
    if n <= 1 or _launched():
        return stage.serve(cfg, segment, attempt=attempt, retried=retried)
    return _relaunch(
        cfg, n, ["--segment", str(segment), *(["--attempt", attempt] if attempt else [])]
    )
