"""The train stage's objective, assembled from the algorithm library: pure tensor code.

`build_targets` turns one iteration's rollouts, rewards and the no-grad passes (old, reference,
entropy) into everything the updates need: advantages, the loss mask, importance weights and the
rows that take part. `micro_batch_loss` is the loss of one micro-batch, normalized by the GLOBAL
token / sequence counts of its mini-batch, so the sum over micro-batches is the mini-batch loss.

Order of operations (each step optional, by config):
1. noisy-verifier correction of the rewards (backward or forward);
2. DAPO dynamic sampling: rows of zero-variance groups leave the batch (counted);
3. DAPO overlong filtering: truncated responses leave the loss mask; SimpleTIR's void-turn
   filter: multi-turn trajectories with a void turn leave it too;
4. KL folded into the token reward (kl_in_reward) before the advantage estimator;
5. the advantage estimator, by registry name;
6. forking-token mask: only the top-rho tokens by entropy stay in the loss mask;
7. rollout correction weights (TIS / MIS) from the recorded rollout logprobs.
Shapes: N rows (sequences) of the iteration, L response positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.core.config import TrainSection
from components.train import algorithms as algos


@dataclass
class Targets:
    advantages: torch.Tensor  # [N, L]
    loss_mask: torch.Tensor  # [N, L] bool: tokens that enter the loss
    is_weights: torch.Tensor  # [N, L] rollout-correction weights (1 when off)
    keep: torch.Tensor  # [N] bool: rows that take part in the updates
    metrics: dict[str, float]


def response_mask_of(lengths: list[int], sampled: list[list[int]] | None = None) -> torch.Tensor:
    """[N, L] bool mask of the response tokens that enter the loss: every token within each
    response's length, and, for multi-turn rollouts (`sampled`), only those the policy sampled:
    a tool's or environment's tokens are conditioning, not actions, so they leave the loss, the
    KL, the advantages' token counts and every token metric."""
    L = max(max(lengths, default=1), 1)
    mask = torch.arange(L).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    if sampled is not None:
        mask = mask & pad_rows([[float(v) for v in m] for m in sampled], L).bool()
    return mask


def pad_rows(rows: list[list[float]], L: int) -> torch.Tensor:
    out = torch.zeros((len(rows), L), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def build_targets(
    t: TrainSection,
    *,
    rewards: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
    response_mask: torch.Tensor,  # [N, L] bool
    truncated: torch.Tensor,  # [N] bool
    old_logprobs: torch.Tensor,  # [N, L]
    rollout_logprobs: torch.Tensor,  # [N, L]
    ref_logprobs: torch.Tensor | None = None,  # [N, L]
    entropy: torch.Tensor | None = None,  # [N, L]
    void: torch.Tensor | None = None,  # [N] bool: rows with a void turn (multi-turn)
) -> Targets:
    metrics: dict[str, float] = {}
    if t.noisy_reward == "backward":
        rewards = algos.noisy_reward_backward_correction(rewards, t.noisy_fp_rate, t.noisy_fn_rate)
    elif t.noisy_reward == "forward":
        rewards = algos.noisy_reward_forward_correction(rewards, t.noisy_fn_rate)

    informative = algos.zero_variance_group_mask(rewards, group_ids)
    metrics["train/zero_var_groups"] = float(len(set(group_ids[~informative].tolist())))
    keep = informative if t.dynamic_sampling else torch.ones_like(informative)
    metrics["train/dropped_rows"] = float((~keep).sum())

    loss_mask = response_mask.clone()
    if t.overlong_filter:
        loss_mask = algos.overlong_mask(response_mask, truncated)
        metrics["train/overlong_masked"] = float(truncated.sum())
    if t.void_turn_filter and void is not None:
        loss_mask = loss_mask & ~void[:, None]
        metrics["train/void_masked"] = float(void.sum())

    if ref_logprobs is not None and response_mask.any():
        kl_ref = algos.kl_estimate(
            old_logprobs, ref_logprobs, t.kl_estimator, response_mask=response_mask
        )
        metrics["train/kl_ref"] = float(algos.masked_mean(kl_ref, response_mask))
    score: torch.Tensor = rewards
    if t.kl_coef > 0 and t.kl_in_reward:
        if ref_logprobs is None:
            raise ValueError("kl_in_reward needs reference logprobs")
        kl = algos.kl_estimate(
            old_logprobs, ref_logprobs, t.kl_estimator, response_mask=response_mask
        )
        score = algos.kl_in_reward(rewards, kl, response_mask, t.kl_coef)
        metrics["train/kl_in_reward"] = float(
            algos.masked_mean(kl, response_mask) if response_mask.any() else 0.0
        )
    advantages = algos.get_advantage_fn(t.advantage)(
        score, group_ids, response_mask, **t.advantage_options
    )

    if t.forking_top_rho is not None:
        if entropy is None:
            raise ValueError("forking_top_rho needs the old policy's token entropy")
        loss_mask = loss_mask & algos.forking_token_mask(entropy, loss_mask, t.forking_top_rho)

    is_weights = torch.ones_like(old_logprobs)
    if t.rollout_correction is not None:
        is_weights, is_metrics = algos.rollout_is_weights(
            old_logprobs,
            rollout_logprobs,
            response_mask,
            mode=t.rollout_correction,
            cap=t.rollout_correction_cap,
            level=t.rollout_correction_level,
        )
        clipped = is_metrics["tis_clipped"]
        metrics["train/tis_clipped"] = float(algos.masked_mean(clipped.float(), response_mask))

    valid = advantages[loss_mask & keep.unsqueeze(1)]
    metrics["train/adv_mean"] = float(valid.mean()) if valid.numel() else 0.0
    metrics["train/adv_std"] = float(valid.std()) if valid.numel() > 1 else 0.0
    metrics["train/reward_mean"] = float(rewards.mean())
    return Targets(advantages, loss_mask, is_weights, keep, metrics)


def rollout_mismatch(
    old_logprobs: torch.Tensor,  # [N, L] the trainer's, before any update
    rollout_logprobs: torch.Tensor,  # [N, L] the sampler's
    response_mask: torch.Tensor,  # [N, L] bool: sampled tokens
) -> dict[str, float]:
    """How far the sampler's logprobs are from the trainer's for the same weights (a bf16
    sampler against an fp32 trainer, a different attention kernel): over sampled tokens,
    mean and max of |d| with d = old - rollout, and KL(rollout || trainer) by k3 (samples
    come from the sampler). verl logs the same as rollout_corr/*. Empty masks give zeros."""
    d = (old_logprobs - rollout_logprobs)[response_mask].double()
    if d.numel() == 0:
        d = torch.zeros(1, dtype=torch.float64)
    kl = torch.exp(d) - d - 1  # k3 of KL(rollout || trainer): ratio trainer / rollout = exp(d)
    return {
        "train/rollout_lp_diff_mean": float(d.abs().mean()),
        "train/rollout_lp_diff_max": float(d.abs().max()),
        "train/rollout_kl": float(kl.mean()),
    }


def micro_batch_loss(
    t: TrainSection,
    *,
    logprobs: torch.Tensor,  # [b, Lb] with grad
    entropy: torch.Tensor | None,  # [b, Lb] (with grad when entropy_coef > 0)
    old_logprobs: torch.Tensor,  # [b, Lb]
    advantages: torch.Tensor,  # [b, Lb]
    loss_mask: torch.Tensor,  # [b, Lb] bool
    is_weights: torch.Tensor,  # [b, Lb]
    ref_logprobs: torch.Tensor | None,  # [b, Lb]
    num_tokens: float,
    num_seqs: float,
    horizon: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch (its share of the mini-batch loss) and per-token metrics."""
    pg, metrics = algos.get_policy_loss_fn(t.policy_loss)(
        logprobs, old_logprobs, advantages, loss_mask, **t.policy_loss_options
    )
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "horizon": horizon}
    pg_loss = algos.aggregate_loss(pg * is_weights, loss_mask, t.loss_agg, **agg)
    loss = pg_loss
    out: dict[str, torch.Tensor] = {k: v.detach() for k, v in metrics.items()}
    parts = {"pg_loss": pg_loss.detach()}
    if t.kl_coef > 0 and not t.kl_in_reward:
        if ref_logprobs is None:
            raise ValueError("a KL penalty needs reference logprobs")
        kl = algos.kl_estimate(logprobs, ref_logprobs, t.kl_estimator, response_mask=loss_mask)
        kl_loss = algos.aggregate_loss(kl, loss_mask, t.loss_agg, **agg)
        loss = loss + t.kl_coef * kl_loss
        out["kl"] = kl.detach()
        parts["kl_loss"] = kl_loss.detach()
    if entropy is not None:
        out["entropy"] = entropy.detach()
        if t.entropy_coef > 0:
            ent_loss = algos.aggregate_loss(entropy, loss_mask, t.loss_agg, **agg)
            loss = loss - t.entropy_coef * ent_loss
    return loss, {**out, **{f"_{k}": v for k, v in parts.items()}}
