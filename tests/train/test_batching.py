"""The train stage's collate: the vectorized version against a plain per-row reference."""

from __future__ import annotations

import numpy as np
import torch

from components.train.batching import Rollouts, collate


def reference_collate(ro: Rollouts, rows: list[int], pad_id: int):
    """One row at a time, the obvious way."""
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
    return input_ids, attn, index, tokens, mask


def test_collate_matches_the_per_row_reference():
    rng = np.random.default_rng(0)
    n = 40
    prompts = [list(rng.integers(3, 90, rng.integers(1, 9))) for _ in range(n)]
    # Some empty responses, some long ones.
    responses = [list(rng.integers(3, 90, rng.integers(0, 13))) for _ in range(n)]
    ro = Rollouts(
        prompt_ids=[f"p{i // 4}" for i in range(n)],
        prompt_tokens=[[int(t) for t in p] for p in prompts],
        response_tokens=[[int(t) for t in r] for r in responses],
        rollout_logprobs=[[0.0] * len(r) for r in responses],
        rewards=np.zeros(n),
        truncated=np.zeros(n, bool),
    )
    for rows in ([0], [5, 3, 17], list(range(n)), [i for i in range(n) if not responses[i]][:2]):
        if not rows:
            continue
        mb = collate(ro, rows, pad_id=0)
        ids, attn, index, tokens, mask = reference_collate(ro, rows, 0)
        assert torch.equal(mb.input_ids, ids)
        assert torch.equal(mb.attention_mask, attn)
        assert torch.equal(mb.response_index, index)
        assert torch.equal(mb.response_tokens, tokens)
        assert torch.equal(mb.response_mask, mask)
        assert mb.rows == rows
