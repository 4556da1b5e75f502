"""The train stage's process plumbing: torch.distributed through DeepSpeed, the DeepSpeed config,
and the few collectives the stage calls itself (sums and maxima over ranks, a barrier)."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import torch

from components.core.config import TrainSection


def launched() -> bool:
    """A rank torchrun started (it sets TORCHELASTIC_RUN_ID for its workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def free_port() -> int:
    """A loopback port no one listens on now (for a rendezvous about to start)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def import_deepspeed():
    """`deepspeed`, imported without MLflow. DeepSpeed's autotuner (never used here) imports
    mlflow at deepspeed's import wherever it is installed (mlflow is a dev dependency, and
    common), and that import is a large part of a train worker's start-up. Hidden for that
    one import unless something already loaded it; rlvr's own MLflow tracker imports it
    normally afterwards."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` fails
    try:
        import deepspeed
    finally:
        if hide and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed


def init_distributed(device: str) -> tuple[int, int]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, NCCL on GPU)."""
    import torch.distributed as dist

    deepspeed = import_deepspeed()

    if not dist.is_initialized():
        # Trust a launcher's variables for a real multi-process group, and always under
        # torchrun (TORCHELASTIC_RUN_ID): even a world of one must meet the agent's store at
        # MASTER_PORT there (TORCHELASTIC_USE_AGENT_STORE), or it waits forever. Any other
        # single process gets a fresh loopback rendezvous: RANK/MASTER_PORT inherited from a
        # parent that is itself a rank (a notebook, a test run, a KFP local task) would point at
        # a taken port.
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not launched():
            port = free_port()
            os.environ.update(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        if device == "cpu":
            skip_shm_comm_op()
        deepspeed.init_distributed(
            dist_backend="nccl" if device == "cuda" else "gloo", verbose=False
        )
        # tear the group down before the interpreter finalizes: a process group left to
        # static destructors can end the process with "terminate called without an active
        # exception" (exit 134) after all its work succeeded
        atexit.register(_destroy_process_group)
    return dist.get_rank(), dist.get_world_size()


#: DeepSpeed's CPU shared-memory all-reduce op (deepspeed/comm/torch.py, `build_shm_op`).
SHM_COMM_OP = "deepspeed_shm_comm"


def skip_shm_comm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op on CPU.

    DeepSpeed's torch backend builds that C++ op whenever the accelerator is the CPU (about a
    minute with a C++ compiler on the first start; without one, a compile error), yet it serves
    only `inference_all_reduce`, tensor-parallel inference, which training never calls: its
    gradient all-reduce is torch.distributed's (gloo). So the op is marked incompatible for this
    process, and neither the machine nor the train image needs a compiler. The lookup it
    overrides, `deepspeed.ops.__compatible_ops__`, is pinned by a test."""
    import_deepspeed()
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__
    if compatible.get(SHM_COMM_OP):
        deepspeed.ops.__compatible_ops__ = {**compatible, SHM_COMM_OP: False}


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def zero_stage_for(t: TrainSection, dtype: torch.dtype) -> int:
    """The ZeRO stage to run. bf16 needs at least 1: DeepSpeed's ZeRO-0 bf16 optimizer cannot
    export Adam moments or fp32 master weights per parameter, so its state could not carry over
    between iterations. ZeRO-1 on one device computes the same update."""
    return max(t.zero_stage, 1) if dtype == torch.bfloat16 else t.zero_stage


def deepspeed_config(t: TrainSection, world: int, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "gradient_clipping": t.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": t.lr,
                "betas": list(t.betas),
                "eps": t.eps,
                "weight_decay": t.weight_decay,
                "torch_adam": True,
            },
        },
        "zero_optimization": {"stage": zero_stage_for(t, dtype)},
        "bf16": {"enabled": dtype == torch.bfloat16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _collective_device() -> torch.device:
    """Where a collective's tensor must live: NCCL reduces CUDA tensors only (a CPU tensor
    fails there), gloo CPU ones."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum_many(values: list[float]) -> list[float]:
    """Sum over ranks in ONE collective (a fixed order on every rank)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_reduce_max(x: float) -> float:
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return float(x)
    t = torch.tensor([x], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def grad_norm(engine) -> float | None:
    """Pre-clip global grad norm under ZeRO-0 (DeepSpeed reports it itself for ZeRO >= 1)."""
    if engine.zero_optimization_stage() != 0:
        return None
    grads = [p.grad.detach().float() for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return float(norm)  # gradients are already averaged over ranks at the boundary


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
