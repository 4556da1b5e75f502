"""One rank of a DeepSpeed gradient/state check (run by tests/train/test_zero_exactness.py).

    python tests/support/zero_worker.py SCORED_PARQUET CHECKPOINT_DIR OUT_DIR ZERO_STAGE [MICRO_BUDGET]

ROWS (environment) limits the mini-batch to its first ROWS rows, to give ranks uneven or empty
shares.
Environment: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (gloo). Each rank takes its strided
share of one mini-batch, accumulates gradients with the GLOBAL token/sequence counts, and rank 0
writes the full gradient (gathered across ZeRO partitions) and, after one optimizer step, the
train state to OUT_DIR as safetensors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from components.core.config import TrainSection
from components.model.checkpoint import load_policy
from components.train import distributed, update
from components.train import state as train_state
from components.train.batching import Rollouts, plan_micro_batches, shard_rows
from components.train.objective import build_targets, pad_rows, response_mask_of


def full_grad(engine, p: torch.nn.Parameter) -> torch.Tensor:
    from deepspeed.utils import safe_get_full_grad

    g = safe_get_full_grad(p) if engine.zero_optimization_stage() > 0 else p.grad
    return g.detach().float().cpu().clone()


def main() -> None:
    import deepspeed

    scored, ckpt, out, zero = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    budget = int(sys.argv[5]) if len(sys.argv) > 5 else 10**6
    t = TrainSection(zero_stage=zero, lr=1e-3, micro_batch_tokens=budget)
    torch.manual_seed(0)
    model, tok = load_policy(ckpt)
    rank, world = distributed.init_distributed("cpu")
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=list(model.parameters()),
        config=distributed.deepspeed_config(t, world, torch.float32),
    )
    ro = Rollouts.from_table(pq.read_table(scored), scored)
    mask = response_mask_of([len(r) for r in ro.response_tokens])
    old = pad_rows(ro.rollout_logprobs, mask.shape[1])
    targets = build_targets(
        t,
        rewards=torch.tensor(ro.rewards, dtype=torch.float32),
        group_ids=ro.group_ids(),
        response_mask=mask,
        truncated=torch.tensor(ro.truncated),
        old_logprobs=old,
        rollout_logprobs=old,
    )
    rows = list(range(int(os.environ.get("ROWS", len(ro)))))  # fewer rows: uneven / empty ranks
    mine = shard_rows(rows, rank, world)
    plan = plan_micro_batches(ro.lengths(), mine, budget) if mine else []
    plan += [[]] * (
        max(int(distributed.all_reduce_max(len(plan))), 1) - len(plan)
    )  # as the stage does
    update.accumulate_mini_batch(
        engine,
        ro,
        plan,
        targets,
        old,
        None,
        t,
        num_tokens=int(mask[rows].sum()),
        num_seqs=len(rows),
        horizon=8,
        temperature=1.0,
        pad_id=tok.pad_token_id,
        device="cpu",
        world=world,
    )
    grads = {n: full_grad(engine, p) for n, p in engine.module.named_parameters()}
    engine.step()
    # the whole state on rank 0, to compare (the stage shares it out among the ranks)
    everything = {name: 0 for name, _ in train_state.trainable(engine.module)}
    tensors = train_state.snapshot(engine, rank, world, everything)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file(grads, str(out / "grads.safetensors"))
        tensors.pop(f"rng.torch.{rank}")
        save_file(tensors, str(out / "state.safetensors"))


if __name__ == "__main__":
    # as rlvr's own processes leave (components/core/quick_exit.py): atexit handlers (the
    # process group's teardown) run, static destructors do not; left to them, a finished
    # rank now and then aborted with "terminate called without an active exception"
    from components.core.quick_exit import run_then_exit

    run_then_exit(main)
