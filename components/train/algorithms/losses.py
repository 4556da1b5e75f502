"""Policy losses (``POLICY_LOSSES``): PPO clip (clip-higher, dual-clip), GSPO, CISPO, REINFORCE.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

import torch
from torch import Tensor

from components.train.algorithms._core import (
    _LOG_RATIO_BOUND,
    POLICY_LOSSES,
    _check_nonneg,
    _zero_outside,
    masked_mean,
)

# ----------------------------------------------------------------------------------------------
# Policy losses:
#   fn(logprobs, old_logprobs, advantages, response_mask, **options)
#       -> (per-token loss [B, L], {metric: [B, L]})
# ----------------------------------------------------------------------------------------------

POLICY_LOSS_METRICS: tuple[str, ...] = (
    "ratio",
    "ppo_kl",
    "approx_kl",
    "clipfrac",
    "clipfrac_low",
    "clipfrac_high",
    "dual_clipfrac",
)
"""Metric keys every registered policy loss returns (each a detached [B, L] tensor, zero where
the mask is False; aggregate them with the same normaliser as the loss):

* ``ratio``         importance ratio used by the loss (GSPO: the sequence ratio s_i per token)
* ``ppo_kl``        ``old_logprobs - logprobs`` (k1 of old vs new); its token mean is verl's
                    ``ppo_kl`` / ``actor/ppo_kl``
* ``approx_kl``     ``0.5 * (logprobs - old_logprobs)^2`` (k2)
* ``clipfrac``      1.0 where the clipped branch is active (verl's ``pg_clipfrac``)
* ``clipfrac_low``  1.0 where the lower clip bound binds (see each loss)
* ``clipfrac_high`` 1.0 where the upper clip bound binds (see each loss)
* ``dual_clipfrac`` 1.0 where the dual clip binds (verl's ``pg_clipfrac_lower``); else 0
"""


def _policy_metrics(
    logprobs: Tensor,
    old_logprobs: Tensor,
    response_mask: Tensor,
    *,
    ratio: Tensor,
    clip_low: Tensor | None = None,
    clip_high: Tensor | None = None,
    dual: Tensor | None = None,
) -> dict[str, Tensor]:
    diff = (logprobs - old_logprobs).detach()
    zero = torch.zeros_like(diff)

    def flag(x: Tensor | None) -> Tensor:
        return zero if x is None else x.to(diff.dtype)

    low, high = flag(clip_low), flag(clip_high)
    raw = {
        "ratio": ratio.detach(),
        "ppo_kl": -diff,
        "approx_kl": 0.5 * diff * diff,
        "clipfrac": torch.maximum(low, high),
        "clipfrac_low": low,
        "clipfrac_high": high,
        "dual_clipfrac": flag(dual),
    }
    return {key: _zero_outside(raw[key], response_mask) for key in POLICY_LOSS_METRICS}


def _masked_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Replace padding entries by 0 so NaN/inf there can reach neither the loss nor a gradient."""
    return (
        _zero_outside(logprobs, response_mask),
        _zero_outside(old_logprobs, response_mask),
        _zero_outside(advantages, response_mask),
    )


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return torch.clamp(logprobs - old_logprobs, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with DAPO clip-higher and optional dual clip (GRPO's loss).

    Formula (per token; ``r = exp(clamp(logprobs - old_logprobs, -20, 20))``)::

        l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
        if dual_clip = c (> 1) and A < 0:  l = min(l, -A * c)

    Metrics: ``clipfrac_high`` = [A > 0 and r > 1 + clip_high]; ``clipfrac_low`` =
    [A < 0 and r < 1 - clip_low]; ``clipfrac`` = [clipped term > unclipped term] (verl's
    ``pg_clipfrac``, equal to low + high); ``dual_clipfrac`` = [A < 0 and
    max(...) > -A * c] (verl's ``pg_clipfrac_lower``). Gradient is zero on clipped tokens.
    Papers: PPO arXiv:1707.06347; clip-higher DAPO arXiv:2503.14476; dual clip
    arXiv:1912.09729.
    verl: ``compute_policy_loss`` / ``compute_policy_loss_vanilla`` (``clip_ratio_low``,
    ``clip_ratio_high``, ``clip_ratio_c``). Departure: verl always applies the dual clip
    (``clip_ratio_c=3.0``); here it is off unless ``dual_clip`` is given.
    Shapes: all inputs [B, L] (response_mask bool) -> loss [B, L], metrics {name: [B, L]},
    unaggregated and zero where the mask is False.
    """
    _check_nonneg("clip_low", clip_low)
    _check_nonneg("clip_high", clip_high)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip!r}")
    logprobs, old_logprobs, advantages = _masked_inputs(
        logprobs, old_logprobs, advantages, response_mask
    )
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual = None
    if dual_clip is not None:
        bound = -advantages * dual_clip
        negative = advantages < 0
        dual = negative & (loss > bound)
        loss = torch.where(negative, torch.minimum(loss, bound), loss)
    metrics = _policy_metrics(
        logprobs,
        old_logprobs,
        response_mask,
        ratio=ratio,
        clip_low=(advantages < 0) & (ratio < 1.0 - clip_low),
        clip_high=(advantages > 0) & (ratio > 1.0 + clip_high),
        dual=dual,
    )
    return _zero_outside(loss, response_mask), metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: clipped surrogate on the length-normalised *sequence* importance ratio.

    Formula::

        s_i      = exp( mean_{t valid} (logprobs - old_logprobs) )
        s_{i,t}  = exp( min(logprobs_t - sg(logprobs_t) + sg(log s_i), 10) )   (value = s_i)
        l_{i,t}  = max(-A * s_{i,t}, -A * clip(s_{i,t}, 1 - clip_low, 1 + clip_high))

    The stop-gradient trick makes ``d l_{i,t} / d logprobs_t = -A * s_i`` (unclipped) and
    zero w.r.t. every other token, so aggregating with ``seq-mean-token-mean`` gives exactly
    the GSPO gradient ``-A_i s_i mean_t grad log pi_t`` (use that mode to match the paper;
    verl forces it). Metrics: ``ratio`` = s_i per token, ``clipfrac_high`` = [A > 0 and
    s_i > 1 + clip_high], ``clipfrac_low`` = [A < 0 and s_i < 1 - clip_low].
    Paper: arXiv:2507.18071. verl: ``compute_policy_loss_gspo`` (defaults
    ``clip_ratio_low=3e-4``, ``clip_ratio_high=4e-4``, log-ratio clamp max 10).
    Departure: verl hard-codes ``seq-mean-token-mean`` inside; here aggregation is the caller's.
    Shapes: all inputs [B, L] -> loss [B, L], metrics {name: [B, L]}, zero where masked.
    """
    _check_nonneg("clip_low", clip_low)
    _check_nonneg("clip_high", clip_high)
    logprobs, old_logprobs, advantages = _masked_inputs(
        logprobs, old_logprobs, advantages, response_mask
    )
    seq_log_ratio = masked_mean(logprobs - old_logprobs, response_mask, dim=-1)  # [B]
    log_s = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_s, max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = _policy_metrics(
        logprobs,
        old_logprobs,
        response_mask,
        ratio=seq_ratio,
        clip_low=(advantages < 0) & (seq_ratio < 1.0 - clip_low),
        clip_high=(advantages > 0) & (seq_ratio > 1.0 + clip_high),
    )
    return _zero_outside(loss, response_mask), metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: REINFORCE with a clipped, stop-gradient importance-sampling weight.

    Formula: ``l_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * logprobs_t`` with
    ``r_t = exp(clamp(logprobs - old_logprobs, -20, 20))``. Every token keeps a gradient
    (``-w_t A_t grad log pi_t``); no token is dropped by clipping. The default
    ``clip_low=1.0`` puts the lower bound at 0, i.e. no lower clip (the paper "did not impose
    a lower bound ... only tuned eps_high"); the paper does not publish eps_high, 0.28 is a
    conventional starting point (DAPO's clip-higher value).
    Metrics: the weight is clipped regardless of the sign of A, so ``clipfrac_high`` =
    [r > 1 + clip_high], ``clipfrac_low`` = [r < 1 - clip_low], ``clipfrac`` = either.
    Paper: MiniMax-M1, arXiv:2506.13585. verl: none in core_algos.
    Shapes: all inputs [B, L] -> loss [B, L], metrics {name: [B, L]}, zero where masked.
    """
    _check_nonneg("clip_low", clip_low)
    _check_nonneg("clip_high", clip_high)
    logprobs, old_logprobs, advantages = _masked_inputs(
        logprobs, old_logprobs, advantages, response_mask
    )
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs))
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * advantages * logprobs
    metrics = _policy_metrics(
        logprobs,
        old_logprobs,
        response_mask,
        ratio=ratio,
        clip_low=ratio < 1.0 - clip_low,
        clip_high=ratio > 1.0 + clip_high,
    )
    return _zero_outside(loss, response_mask), metrics


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain REINFORCE (score-function) loss, no ratio, no clip.

    Formula: ``l_t = -A_t * logprobs_t``; gradient ``-A_t grad log pi_t``. ``old_logprobs``
    only feeds the diagnostic metrics (``ratio``, ``ppo_kl``, ``approx_kl``; clip flags are 0).
    Paper: Williams 1992 (no arXiv id); used by NSR/W-REINFORCE, arXiv:2506.01347.
    verl: none in core_algos (closest: ``compute_policy_loss`` with ratio fixed at 1).
    Shapes: all inputs [B, L] -> loss [B, L], metrics {name: [B, L]}, zero where masked.
    """
    logprobs, old_logprobs, advantages = _masked_inputs(
        logprobs, old_logprobs, advantages, response_mask
    )
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs))
    loss = -advantages * logprobs
    metrics = _policy_metrics(logprobs, old_logprobs, response_mask, ratio=ratio)
    return _zero_outside(loss, response_mask), metrics
