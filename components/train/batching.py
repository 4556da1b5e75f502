"""Turning scored rollouts into training tensors: sequences, token-budget micro-batches, LR.

Pure helpers of the train stage (no DeepSpeed, no I/O), tested on their own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from components.core.errors import StageError
from components.core.turns import has_void_turn
from components.model.vision import IMAGES_REF


@dataclass
class Rollouts:
    """The iteration's scored rollouts as Python lists, validated for training."""

    prompt_ids: list[str]
    prompt_tokens: list[list[int]]
    response_tokens: list[list[int]]
    rollout_logprobs: list[list[float]]
    rewards: np.ndarray  # [N] float64
    truncated: np.ndarray  # [N] bool
    sampled: list[list[int]] | None = None
    """Multi-turn rollouts: 1 per response token the policy sampled, 0 per token a tool or
    environment wrote (`response_mask`); None when every token was sampled (single-turn)."""
    turns: list[list[dict]] | None = None
    """Multi-turn rollouts: each row's turns ({role, content, start, end}); None otherwise."""
    images_ref: list[str | None] | None = None
    """Image prompts: each row's `images_ref` (components/model/vision.py); None otherwise."""
    vision: list | None = None
    """Image prompts: each row's VisionInputs, once the stage has read them (`resolve_images`)."""

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
        sampled = None
        if "response_mask" in table.column_names:
            sampled = table.column("response_mask").to_pylist()
            for i, (t, m) in enumerate(zip(resp, sampled, strict=True)):
                if m is None or len(m) != len(t) or any(v not in (0, 1) for v in m):
                    raise StageError(
                        f"{source}: row {i}: response_mask must hold one 0 or 1 per response "
                        f"token ({len(t)} tokens); regenerate the rollouts"
                    )
        return cls(
            prompt_ids=table.column("prompt_id").to_pylist(),
            prompt_tokens=table.column("prompt_token_ids").to_pylist(),
            response_tokens=resp,
            rollout_logprobs=lps,
            rewards=rewards,
            truncated=np.asarray(table.column("finish_reason").to_pylist()) == "length",
            sampled=sampled,
            turns=table.column("turns").to_pylist() if "turns" in table.column_names else None,
            images_ref=(
                table.column(IMAGES_REF).to_pylist() if IMAGES_REF in table.column_names else None
            ),
        )

    def void(self, answer_pattern: str) -> np.ndarray:
        """[N] bool: rows holding a void turn (components/core/turns.py); none without turns."""
        if self.turns is None:
            return np.zeros(len(self), dtype=bool)
        answer = re.compile(answer_pattern)
        return np.array([has_void_turn(t or [], answer) for t in self.turns], dtype=bool)

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
    vision: Any = None
    """Image prompts: the rows' VisionInputs, concatenated in row order; None otherwise."""
    prompt_lengths: torch.Tensor | None = None  # [b]

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
    """Right-padded tensors of `rows`, built in numpy with one flat copy per array (no per-row
    tensor construction: a mini-batch holds thousands of rows)."""
    p_len = np.fromiter((len(ro.prompt_tokens[r]) for r in rows), np.int64, len(rows))
    q_len = np.fromiter((len(ro.response_tokens[r]) for r in rows), np.int64, len(rows))
    seq_len = p_len + q_len
    b, S, L = len(rows), int(seq_len.max()), max(int(q_len.max()), 1)
    flat = np.fromiter(
        (t for r in rows for t in (*ro.prompt_tokens[r], *ro.response_tokens[r])),
        np.int64,
        int(seq_len.sum()),
    )
    col = np.arange(S)
    filled = col[None, :] < seq_len[:, None]  # [b, S]
    input_ids = np.full((b, S), pad_id, np.int64)
    input_ids[filled] = flat  # row-major order of `filled` is the order of `flat`
    resp_col = np.arange(L)
    mask = resp_col[None, :] < q_len[:, None]  # [b, L]
    # Position whose logits predict response token t: prompt length - 1 + t (0 where padded).
    index = np.where(mask, p_len[:, None] - 1 + resp_col[None, :], 0)
    tokens = np.full((b, L), pad_id, np.int64)
    # Response tokens sit in input_ids right after the prompt.
    tokens[mask] = input_ids[np.arange(b)[:, None], np.where(mask, index + 1, 0)][mask]
    vision = None
    if ro.vision is not None:
        from components.model.vision import VisionInputs

        vision = VisionInputs.cat([ro.vision[r] for r in rows])
    return MicroBatch(
        rows,
        torch.from_numpy(input_ids),
        torch.from_numpy(filled.astype(np.int64)),
        torch.from_numpy(index),
        torch.from_numpy(tokens),
        torch.from_numpy(mask),
        vision,
        torch.from_numpy(p_len),
    )


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
