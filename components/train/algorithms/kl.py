"""KL estimators (``KL_ESTIMATORS``, ``kl_estimate``, ``kl_in_reward``): k1, abs, k2, k3 and the straight-through variants.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

import torch
from torch import Tensor

from components.train.algorithms._core import (
    _LOG_RATIO_BOUND,
    KL_ESTIMATORS,
    _zero_outside,
    outcome_to_token_rewards,
)

# ----------------------------------------------------------------------------------------------
# KL estimators: fn(logprobs [B, L], ref_logprobs [B, L]) -> [B, L] (unmasked)
# ----------------------------------------------------------------------------------------------


@KL_ESTIMATORS.register("k1")
@KL_ESTIMATORS.register("kl")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1: ``logprobs - ref_logprobs`` (unbiased value, high variance).

    Source: Schulman, "Approximating KL Divergence" (2020 blog). verl: ``kl`` / ``k1``.
    Shapes: [B, L], [B, L] -> [B, L].
    """
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("abs")
def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``|logprobs - ref_logprobs|``. Paper: none.

    verl: ``abs``. Shapes: [B, L], [B, L] -> [B, L].
    """
    return (logprobs - ref_logprobs).abs()


@KL_ESTIMATORS.register("k2")
@KL_ESTIMATORS.register("mse")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2: ``0.5 * (logprobs - ref_logprobs)^2``; its gradient is an unbiased KL gradient.

    Source: Schulman (2020 blog). verl: ``mse`` / ``k2``. Shapes: [B, L], [B, L] -> [B, L].
    """
    diff = logprobs - ref_logprobs
    return 0.5 * diff * diff


@KL_ESTIMATORS.register("k3")
@KL_ESTIMATORS.register("low_var_kl")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 (low-variance): ``exp(d) - d - 1`` with ``d = clamp(ref - logprobs, -20, 20)``,
    result clamped to [-10, 10].

    Used by GRPO (DeepSeekMath, arXiv:2402.03300); estimator from Schulman, "Approximating KL
    Divergence" (2020 blog, no arXiv id). verl: ``low_var_kl`` / ``k3`` (same clamps).
    Shapes: [B, L], [B, L] -> [B, L].
    """
    d = torch.clamp(ref_logprobs - logprobs, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def _straight_through_k2(value: Tensor, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    grad_path = kl_k2(logprobs, ref_logprobs)
    return grad_path - grad_path.detach() + value.detach()


@KL_ESTIMATORS.register("k1+")
def kl_k1_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Value of k1, gradient of k2: ``k2 - sg(k2) + sg(k1)``. verl: ``k1+``.

    Source: Schulman (2020 blog) for k1/k2; the straight-through combination is verl's.

    Shapes: [B, L], [B, L] -> [B, L].
    """
    return _straight_through_k2(kl_k1(logprobs, ref_logprobs), logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k3+")
def kl_k3_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Value of k3, gradient of k2: ``k2 - sg(k2) + sg(k3)``. verl: ``k3+``.

    Source: Schulman (2020 blog) for k3/k2; the straight-through combination is verl's.

    Shapes: [B, L], [B, L] -> [B, L].
    """
    return _straight_through_k2(kl_k3(logprobs, ref_logprobs), logprobs, ref_logprobs)


def kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    kind: str,
    *,
    response_mask: Tensor | None = None,
) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate of the registered ``kind``.

    Kinds: ``k1``/``kl`` = d, ``abs`` = |d|, ``k2``/``mse`` = d^2 / 2, ``k3``/``low_var_kl`` =
    exp(-d) + d - 1 (clamped as verl), ``k1+``/``k3+`` = value of k1/k3 with the gradient of k2;
    where ``d = logprobs - ref_logprobs``. Source: Schulman, "Approximating KL Divergence"
    (2020 blog); k3 as the GRPO KL loss, arXiv:2402.03300.
    verl: ``kl_penalty(logprob, ref_logprob, kl_penalty)``.
    Shapes: logprobs [B, L], ref_logprobs [B, L] (, response_mask [B, L] bool) -> [B, L];
    zero where the mask is False if a mask is given, unmasked otherwise.
    """
    kl = KL_ESTIMATORS.get(kind)(logprobs, ref_logprobs)
    return kl if response_mask is None else _zero_outside(kl, response_mask)


def kl_in_reward(rewards: Tensor, kl: Tensor, response_mask: Tensor, coef: float) -> Tensor:
    """Fold a KL penalty into token-level rewards ("use_kl_in_reward" mode).

    Formula: ``R[i, t] = r_i * [t == last_valid(i)] - coef * kl[i, t]`` on valid tokens, 0
    elsewhere. ``kl`` is detached (rewards carry no gradient). Paper: InstructGPT-style
    per-token KL reward, arXiv:2203.02155. Feed the result to
    ``reinforce_plus_plus`` (token-level returns) or to any estimator (which then uses the
    masked token sum as the sequence score, as verl does).
    verl: ``apply_kl_penalty`` (``token_level_rewards = token_level_scores - beta * kld``), with a
    fixed coefficient (the adaptive controller is stateful and lives with the caller).
    Shapes: rewards [B], kl [B, L], response_mask [B, L] bool -> [B, L].
    """
    token_rewards = outcome_to_token_rewards(rewards, response_mask)
    return _zero_outside(token_rewards - coef * kl.detach(), response_mask)
