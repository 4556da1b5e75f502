"""Turning scored rollouts into training tensors: sequences, token-budget micro-batches, LR.

Pure helpers of the train stage (no DeepSpeed, no I/O), tested on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from components.core.errors import StageError


@dataclass
class Rollouts:
    """The iteration's scored rollouts as Python lists, validated for training."""

    prompt_ids: list[str]
    prompt_tokens: list[list[int]]
    response_tokens: list[list[int]]
    rollout_logprobs: list[list[float]]
    rewards: np.ndarray  # [N] float64
    truncated: np.ndarray  # [N] bool

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @classmethod
    def from_table(cls, table: pa.Table, source: str) -> Rollouts:
        rewards = np.asarray(table.column("reward").to_numpy(zero_copy_only=False), np.float64)
        bad = np.flatnonzero(~np.isfinite(rewards))
        if bad.size:
            raise StageError(
                f"{source}: column 'reward' has {bad.size} non-finite values (first at row "
                f"{int(bad[0])}); fix the verifier that produced them and rerun verify"
            )
        resp = table.column("response_token_ids").to_pylist()
        lps = table.column("response_logprobs").to_pylist()
        for i, (t, lp) in enumerate(zip(resp, lps, strict=True)):
            if len(t) != len(lp):
                raise StageError(
                    f"{source}: row {i}: response_token_ids has {len(t)} tokens but "
                    f"response_logprobs has {len(lp)}; they must align one per token "
                    "(regenerate the rollouts)"
                )
        return cls(
            prompt_ids=table.column("prompt_id").to_pylist(),
            prompt_tokens=table.column("prompt_token_ids").to_pylist(),
            response_tokens=resp,
            rollout_logprobs=lps,
            rewards=rewards,
            truncated=np.asarray(table.column("finish_reason").to_pylist()) == "length",
        )

    def group_ids(self) -> torch.Tensor:
        """Integer id per row, equal for rows that share a prompt (a GRPO group).  # [N]"""
        index: dict[str, int] = {}
        return torch.tensor([index.setdefault(p, len(index)) for p in self.prompt_ids])

    def lengths(self) -> list[int]:
        return [
            len(p) + len(r) for p, r in zip(self.prompt_tokens, self.response_tokens, strict=True)
        ]


@dataclass
class MicroBatch:
    rows: list[int]  # indices into the Rollouts
    input_ids: torch.Tensor  # [b, S] right-padded prompt + response
    attention_mask: torch.Tensor  # [b, S]
    response_index: torch.Tensor  # [b, L] position in the sequence whose logits predict token t
    response_tokens: torch.Tensor  # [b, L]
    response_mask: torch.Tensor  # [b, L] bool, True = token counts

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def plan_micro_batches(lengths: list[int], rows: list[int], token_budget: int) -> list[list[int]]:
    """Split `rows` into micro-batches whose padded size (rows x longest) fits `token_budget`.

    Rows are sorted by length (longest first) so each micro-batch holds similar lengths and padding
    stays small. A row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(rows, key=lambda r: (-lengths[r], r))
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for r in order:
        new_longest = max(longest, lengths[r])
        if cur and new_longest * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, new_longest = [], lengths[r]
        cur.append(r)
        longest = new_longest
    if cur:
        out.append(cur)
    return out


def collate(ro: Rollouts, rows: list[int], pad_id: int) -> MicroBatch:
    seqs = [ro.prompt_tokens[r] + ro.response_tokens[r] for r in rows]
    S = max(len(s) for s in seqs)
    L = max(max(len(ro.response_tokens[r]) for r in rows), 1)
    b = len(rows)
    input_ids = torch.full((b, S), pad_id, dtype=torch.long)
    attn = torch.zeros((b, S), dtype=torch.long)
    index = torch.zeros((b, L), dtype=torch.long)
    tokens = torch.full((b, L), pad_id, dtype=torch.long)
    mask = torch.zeros((b, L), dtype=torch.bool)
    for i, r in enumerate(rows):
        s, p, q = seqs[i], len(ro.prompt_tokens[r]), len(ro.response_tokens[r])
        input_ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        if q:
            index[i, :q] = torch.arange(p - 1, p - 1 + q)
            tokens[i, :q] = torch.tensor(ro.response_tokens[r])
            mask[i, :q] = True
    return MicroBatch(rows, input_ids, attn, index, tokens, mask)


def learning_rate(
    step: int,
    *,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str,
    min_lr_ratio: float = 0.0,
) -> float:
    """LR of optimizer step `step` (0-based) over the WHOLE run, not per iteration.

    Linear warmup from base_lr/warmup_steps to base_lr over `warmup_steps`, then constant, or cosine
    down to base_lr * min_lr_ratio at `total_steps`.
    """
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    if schedule != "cosine":
        raise ValueError(f"unknown lr_schedule {schedule!r}; valid: constant, cosine")
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    floor = base_lr * min_lr_ratio
    return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def shard_rows(rows: list[int], rank: int, world: int) -> list[int]:
    """This rank's slice of a mini-batch (strided, so ranks get similar length mixes)."""
    return rows[rank::world]
