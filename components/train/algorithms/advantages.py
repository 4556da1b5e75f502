"""Advantage estimators (``ADVANTAGES``): GRPO, Dr. GRPO, RLOO, REINFORCE++, pass@k, W-REINFORCE.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from components.train.algorithms._core import (
    ADVANTAGES,
    _group_index,
    _outcome_scores,
    _zero_outside,
    broadcast_to_tokens,
    discounted_returns,
    group_mean_std,
    masked_whiten,
    outcome_to_token_rewards,
)
from components.train.algorithms.filters import (
    weight_positive_samples,
)

# ----------------------------------------------------------------------------------------------
# Advantage estimators: fn(rewards [B], group_ids [B], response_mask [B, L], **options) -> [B, L]
# ----------------------------------------------------------------------------------------------


@ADVANTAGES.register("grpo", group_relative=True)
def grpo_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    response_mask: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO group-normalised outcome advantage.

    Formula: ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` broadcast to every valid token;
    with ``norm_by_std=False`` it is ``r_i - mean_g(r)`` (Dr.GRPO). ``std_g`` is the unbiased
    (``torch.std``) std of the group; a group of size 1 uses mean 0 and std 1, as verl.
    Paper: DeepSeekMath, arXiv:2402.03300.
    verl: ``compute_grpo_outcome_advantage`` (``norm_adv_by_std_in_grpo``, epsilon=1e-6).
    Shapes: rewards [B] (or [B, L] token rewards, summed over valid tokens), group_ids [B],
    response_mask [B, L] bool -> [B, L], zero where the mask is False.
    """
    scores = _outcome_scores(rewards, response_mask)
    mean, std, _ = group_mean_std(scores, group_ids)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return broadcast_to_tokens(adv, response_mask)


@ADVANTAGES.register("dr_grpo", group_relative=True)
def dr_grpo_advantage(rewards: Tensor, group_ids: Tensor, response_mask: Tensor) -> Tensor:
    """Dr.GRPO advantage: group-mean baseline, no std normalisation.

    Formula: ``A_i = r_i - mean_g(r)`` broadcast to valid tokens (a singleton group has
    mean 0, so ``A_i = r_i``, as verl). Pair with the ``seq-mean-token-sum-norm`` aggregation to
    reproduce the paper's length-unbiased objective.
    Paper: "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783.
    verl: ``compute_grpo_outcome_advantage`` with ``norm_adv_by_std_in_grpo=False``.
    Shapes: rewards [B] (or [B, L]), group_ids [B], response_mask [B, L] -> [B, L].
    """
    return grpo_advantage(rewards, group_ids, response_mask, norm_by_std=False)


@ADVANTAGES.register("rloo", group_relative=True)
def rloo_advantage(rewards: Tensor, group_ids: Tensor, response_mask: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantage.

    Formula: ``A_i = r_i - mean_{j != i in g} r_j = (r_i - mean_g(r)) * n / (n - 1)``,
    broadcast to valid tokens.
    Paper: Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free!");
    Ahmadian et al., arXiv:2402.14740.
    verl: ``compute_rloo_outcome_advantage`` (``r*n/(n-1) - mean*n/(n-1)``).
    Departure: a group of size 1 gets advantage 0 (verl leaves the raw reward there).
    Shapes: rewards [B] (or [B, L]), group_ids [B], response_mask [B, L] -> [B, L].
    """
    scores = _outcome_scores(rewards, response_mask)
    mean, _, count = group_mean_std(scores, group_ids)
    factor = count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, (scores - mean) * factor, torch.zeros_like(scores))
    return broadcast_to_tokens(adv, response_mask)


@ADVANTAGES.register("reinforce_plus_plus", group_relative=False)
def reinforce_plus_plus_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
) -> Tensor:
    """REINFORCE++: discounted token returns, whitened over the batch's valid tokens.

    Formula: ``R`` = outcome reward on the last valid token (or the given [B, L] token rewards,
    e.g. from :func:`kl_in_reward`); ``G_t = sum_{k>=t} gamma^(k-t) R_k``;
    ``A = masked_whiten(G, mask)``. ``group_ids`` is unused. The whitening statistics are over
    whatever batch is passed in (the train stage passes the whole iteration's batch).
    Paper: arXiv:2501.03262.
    verl: ``compute_reinforce_plus_plus_outcome_advantage`` (masked_whiten semantics; see
    :func:`masked_whiten` for the n <= 1 departure).
    Shapes: rewards [B] or [B, L], group_ids [B], response_mask [B, L] -> [B, L].
    """
    del group_ids
    if rewards.dim() == 1:
        token_rewards = outcome_to_token_rewards(rewards, response_mask)
    else:
        token_rewards = rewards
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return _zero_outside(masked_whiten(returns, response_mask), response_mask)


@ADVANTAGES.register("reinforce_plus_plus_baseline", group_relative=True)
def reinforce_plus_plus_baseline_advantage(
    rewards: Tensor, group_ids: Tensor, response_mask: Tensor
) -> Tensor:
    """REINFORCE++-baseline: group-mean baseline, then whitening over the batch.

    Formula: ``a_i = r_i - mean_g(r)`` (singleton group: mean 0, as verl), broadcast to
    tokens, then ``A = masked_whiten(a, mask)`` over the valid tokens of the tensors passed in.
    Paper: arXiv:2501.03262.
    verl: ``compute_reinforce_plus_plus_baseline_outcome_advantage``.
    Shapes: rewards [B] (or [B, L]), group_ids [B], response_mask [B, L] -> [B, L].
    """
    scores = _outcome_scores(rewards, response_mask)
    mean, _, _ = group_mean_std(scores, group_ids)
    tokens = broadcast_to_tokens(scores - mean, response_mask)
    return _zero_outside(masked_whiten(tokens, response_mask), response_mask)


@ADVANTAGES.register("grpo_passk", group_relative=True)
def grpo_passk_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    response_mask: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Pass@k advantage: only each group's best response gets ``r_max - r_second_max``.

    Formula: for group g with best index ``i* = argmax r`` (ties: lowest batch index),
    ``A_{i*} = (r_max - r_2nd) / (std_g(r) + eps)`` (no division when ``norm_by_std`` is
    False) and ``A_i = 0`` for every other member; broadcast to valid tokens.
    Paper: arXiv:2503.19595 (as cited by verl).
    verl: ``compute_grpo_passk_outcome_advantage``.
    Departure: verl raises for groups of size 1 (needs a device sync); here they get 0.
    Shapes: rewards [B] (or [B, L]), group_ids [B], response_mask [B, L] -> [B, L].
    """
    scores = _outcome_scores(rewards, response_mask)
    inverse, num_groups = _group_index(group_ids)
    _, std, count = group_mean_std(scores, group_ids)
    neg_inf = torch.full((num_groups,), -math.inf, dtype=scores.dtype, device=scores.device)
    gmax = neg_inf.scatter_reduce(0, inverse, scores, "amax", include_self=False)[inverse]
    index = torch.arange(scores.shape[0], device=scores.device)
    candidate = torch.where(scores == gmax, index, scores.shape[0])
    first = torch.full((num_groups,), scores.shape[0], dtype=index.dtype, device=index.device)
    best = first.scatter_reduce(0, inverse, candidate, "amin", include_self=False)[inverse]
    is_best = index == best
    others = torch.where(is_best, torch.full_like(scores, -math.inf), scores)
    second = neg_inf.scatter_reduce(0, inverse, others, "amax", include_self=False)[inverse]
    second = torch.where(count > 1, second, gmax)  # singleton: no runner-up -> gap 0
    gap = gmax - second
    if norm_by_std:
        gap = gap / (std + eps)
    adv = torch.where(is_best & (count > 1), gap, torch.zeros_like(gap))
    return broadcast_to_tokens(adv, response_mask)


@ADVANTAGES.register("w_reinforce", group_relative=False)
def w_reinforce_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    response_mask: Tensor,
    *,
    positive_weight: float = 0.1,
) -> Tensor:
    """W-REINFORCE: the raw reward as advantage, positive samples down-weighted by lambda.

    Formula: ``A_i = lambda * r_i if r_i > 0 else r_i`` broadcast to valid tokens; with the
    paper's rewards in {-1, +1} this is ``lambda * L_PSR + L_NSR``. ``positive_weight=0`` is
    pure NSR (negative-sample reinforcement), ``1`` is plain REINFORCE. ``group_ids`` is unused.
    Use it with the ``reinforce`` policy loss (or ``ppo_clip``).
    NOTE: the paper's rewards are +-1; with {0, 1} rewards the incorrect samples carry no
    signal, so map them first (``2 * r - 1``).
    Paper: "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
    arXiv:2506.01347 (recommends lambda = 0.1). verl: none.
    Shapes: rewards [B] (or [B, L]), group_ids [B], response_mask [B, L] -> [B, L].
    """
    del group_ids
    scores = _outcome_scores(rewards, response_mask)
    return broadcast_to_tokens(weight_positive_samples(scores, positive_weight), response_mask)
