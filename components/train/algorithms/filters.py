"""Sample weighting, forking tokens, noisy-reward correction, rollout importance weights and DAPO's filters.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from components.train.algorithms._core import (
    _LOG_RATIO_BOUND,
    _check_nonneg,
    _check_unit_interval,
    _group_index,
    _zero_outside,
)

# ----------------------------------------------------------------------------------------------
# Seed-paper techniques
# ----------------------------------------------------------------------------------------------


def weight_positive_samples(
    advantages: Tensor,
    positive_weight: float,
    *,
    rewards: Tensor | None = None,
    reward_threshold: float = 0.0,
) -> Tensor:
    """W-REINFORCE / NSR weighting: scale the advantage of positive samples by lambda.

    Formula: ``A' = lambda * A`` on positive samples, ``A`` elsewhere. A sample is positive
    when ``rewards_i > reward_threshold`` if ``rewards`` [B] is given (broadcast over L), else
    where ``A > 0`` elementwise. ``lambda = 0`` is pure NSR (learn only from negatives),
    ``lambda = 1`` leaves A unchanged, the paper recommends 0.1.
    Paper: arXiv:2506.01347. verl: none.
    Shapes: advantages [B] or [B, L], rewards [B] or None -> same shape as advantages.
    """
    _check_nonneg("positive_weight", positive_weight)
    if rewards is None:
        positive = advantages > 0
    else:
        positive = rewards > reward_threshold
        if advantages.dim() == 2:
            positive = positive.unsqueeze(-1)
    return torch.where(positive, advantages * positive_weight, advantages)


def forking_token_mask(entropy: Tensor, response_mask: Tensor, top_rho: float) -> Tensor:
    """Keep only the top-rho fraction of valid tokens by entropy ("forking tokens").

    Formula: ``k = ceil(top_rho * n_valid)`` over the whole batch passed in; keep the k valid
    tokens with the largest entropy. Ties are broken deterministically: at equal entropy the
    earlier token in row-major (b, t) order wins. AND the result into the loss mask.
    Paper: "Beyond the 80/20 Rule", arXiv:2506.01939 (top 20% -> ``top_rho=0.2``).
    Departure: the paper thresholds at the batch entropy quantile (keeping every tie); here
    exactly k tokens are kept. ``ceil`` has 1e-9 slack so 0.7 * 10 keeps 7, not 8.
    verl: none in core_algos. Entropy is only compared (no gradient).
    Shapes: entropy [B, L] float, response_mask [B, L] bool -> [B, L] bool.
    """
    _check_unit_interval("top_rho", top_rho)
    flat = torch.where(
        response_mask, entropy.detach(), torch.full_like(entropy, -math.inf, requires_grad=False)
    ).reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    n_valid = response_mask.sum().to(torch.float64)
    k = torch.ceil(n_valid * top_rho - 1e-9)
    return (ranks.reshape(entropy.shape) < k) & response_mask


def noisy_reward_backward_correction(rewards: Tensor, fp_rate: float, fn_rate: float) -> Tensor:
    """Backward correction for a noisy binary verifier: unbiased estimate of the clean reward.

    Model: observed ``r~`` in {0, 1}; ``rho0 = fp_rate = P(r~=1 | r=0)``, ``rho1 = fn_rate =
    P(r~=0 | r=1)``, so ``E[r~ | r] = rho0 + (1 - rho0 - rho1) r``. Formula::

        r_hat = (r~ - rho0) / (1 - rho0 - rho1),      E[r_hat | r] = r

    (r~=1 -> (1 - rho0)/(1 - rho0 - rho1), r~=0 -> -rho0/(1 - rho0 - rho1)). Apply before the
    advantage estimator. Requires ``rho0 + rho1 < 1`` (ValueError otherwise).
    Paper: "Reinforcement Learning with Verifiable yet Noisy Rewards under Imperfect
    Verifiers", arXiv:2510.00915 (PGBC). verl: none.
    Shapes: rewards [B] (any shape) -> same shape.
    """
    _check_unit_interval("fp_rate", fp_rate)
    _check_unit_interval("fn_rate", fn_rate)
    if not fp_rate + fn_rate < 1.0:
        raise ValueError(f"fp_rate + fn_rate must be < 1, got {fp_rate} + {fn_rate}")
    return (rewards - fp_rate) / (1.0 - fp_rate - fn_rate)


def noisy_reward_forward_correction(rewards: Tensor, fn_rate: float) -> Tensor:
    """Forward correction for a noisy binary verifier: score-function weights needing only FN.

    Formula (weights of the paper, ``w_0 = rho1 - 1`` for r~=0, ``w_1 = rho1`` for r~=1)::

        w = r~ + rho1 - 1,      E[w | r] = (1 - rho0 - rho1) (r - 1)

    so ``E[w grad log pi] = (1 - rho0 - rho1) grad J``: the expected update points along the
    clean gradient (scaled) whatever rho0 is, as long as rho0 + rho1 < 1. Use ``w`` as the
    per-sequence score-function coefficient, e.g. ``reinforce`` loss with advantages
    ``w`` broadcast over valid tokens. CAUTION: ``w`` is ``r~`` shifted by a constant, so a
    group-mean baseline (grpo, dr_grpo, rloo) cancels the shift; the correction only acts
    when the weights are used without re-centering. The weights are from the paper; how its
    GRPO hook composes them with group normalisation was not verified here.
    Paper: arXiv:2510.00915 (PGFC). verl: none. Requires ``0 <= fn_rate < 1``.
    Shapes: rewards [B] (any shape) -> same shape.
    """
    _check_unit_interval("fn_rate", fn_rate, closed_high=False)
    return rewards + (fn_rate - 1.0)


# ----------------------------------------------------------------------------------------------
# Rollout (inference-engine vs trainer) mismatch correction
# ----------------------------------------------------------------------------------------------


def rollout_is_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    response_mask: Tensor,
    *,
    mode: Literal["tis", "mis"],
    cap: float,
    level: Literal["token", "sequence"] = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weights correcting for the rollout engine's distribution (TIS / MIS).

    Ratio: token level ``rho_t = exp(clamp(old - rollout, -20, 20))``; sequence level
    ``rho_i = exp(clamp(sum_{t valid}(old - rollout), -20, 20))`` broadcast to its tokens.
    Weights (detached, zero where masked)::

        tis:  w = min(rho, cap)                 (truncated IS)
        mis:  w = rho * [rho <= cap]            (masked IS: drop tokens / sequences over cap)

    Multiply the per-token policy loss by ``w`` before aggregation. Metrics (per token, [B, L],
    zero where masked): ``tis_clipped`` = [rho > cap] (truncated in tis, masked out in mis),
    ``is_ratio`` = rho.
    Sources: TIS, Yao et al. 2025 "Your Efficient RL Framework Secretly Brings You Off-Policy
    RL Training" (blog, no arXiv id); MIS, Liu et al. 2025 "When Speed Kills Stability" (blog).
    verl: rollout importance sampling / rollout correction helpers
    (``compute_rollout_importance_weights``; module name varies across versions).
    Shapes: old_logprobs [B, L], rollout_logprobs [B, L], response_mask [B, L] bool ->
    (weights [B, L], {"tis_clipped": [B, L], "is_ratio": [B, L]}).
    """
    if mode not in ("tis", "mis"):
        raise ValueError(f"mode must be 'tis' or 'mis', got {mode!r}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if not cap > 0.0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    log_ratio = _zero_outside((old_logprobs - rollout_logprobs).detach(), response_mask)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand(response_mask.shape)
    ratio = torch.exp(torch.clamp(log_ratio, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND))
    over = ratio > cap
    if mode == "tis":
        weights = torch.clamp(ratio, max=cap)
    else:
        weights = torch.where(over, torch.zeros_like(ratio), ratio)
    metrics = {
        "tis_clipped": _zero_outside(over.to(ratio.dtype), response_mask),
        "is_ratio": _zero_outside(ratio, response_mask),
    }
    return _zero_outside(weights, response_mask), metrics


# ----------------------------------------------------------------------------------------------
# DAPO filters and shaping
# ----------------------------------------------------------------------------------------------


def zero_variance_group_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling: which sequences to keep (True) — groups whose rewards differ.

    Formula: ``keep_i = max_g(r) != min_g(r)`` for i's group g. A group whose rewards are all
    equal (including a group of size 1) has zero GRPO advantage and is dropped (False).
    Paper: DAPO, arXiv:2503.14476. verl: the DAPO recipe's ``filter_groups`` (metric std > 0).
    Shapes: rewards [B] float, group_ids [B] int -> [B] bool.
    """
    inverse, num_groups = _group_index(group_ids)
    base = rewards.new_zeros(num_groups)
    gmax = base.scatter_reduce(0, inverse, rewards, "amax", include_self=False)
    gmin = base.scatter_reduce(0, inverse, rewards, "amin", include_self=False)
    return (gmax != gmin)[inverse]


def overlong_mask(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO overlong filtering: drop every token of truncated responses from the loss.

    Formula: ``mask'_{i,t} = mask_{i,t} and not truncated_i``.
    Paper: DAPO, arXiv:2503.14476. verl: none in core_algos.
    Shapes: response_mask [B, L] bool, truncated [B] bool -> [B, L] bool.
    """
    return response_mask & ~truncated.unsqueeze(-1)
