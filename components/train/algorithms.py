"""Pure policy-gradient math for the train stage (GRPO family, PPO-style losses, KL, filters).

Every public function here is a pure function of tensors and scalar hyperparameters: it reads no
config object, does no I/O, never mutates its inputs and never synchronises with the device
(no ``.item()``, ``float(tensor)``, ``.tolist()`` or Python branching on tensor values). Raising
``ValueError`` on a bad *scalar hyperparameter* is the only validation performed. Values at
masked (padding) positions are ignored: outputs are zero there and NaN/inf in padding reaches
neither the result nor a gradient.

Vocabulary and shapes (used in every docstring)::

    B  number of sequences (responses) in the tensors passed in
    L  number of response positions (responses are right-padded)
    V  vocabulary size
    logprobs       [B, L] float  log pi_theta(y_t | x, y_<t) under the current policy (has grad)
    old_logprobs   [B, L] float  log-probs under the policy that is being improved (no grad)
    ref_logprobs   [B, L] float  log-probs under the frozen reference policy
    advantages     [B, L] float  per-token advantage (zero where the mask is False)
    response_mask  [B, L] bool   True means the token counts
    rewards        [B]    float  outcome reward per sequence
    group_ids      [B]    int64  sequences sharing a prompt share an id (the GRPO "group")

Four registries map names to functions: ``ADVANTAGES``, ``POLICY_LOSSES``,
``LOSS_AGGREGATIONS`` and ``KL_ESTIMATORS``. Where verl (``verl/trainer/ppo/core_algos.py``)
defines the same quantity the semantics match verl's; docstrings name the verl equivalent and
any deliberate departure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "POLICY_LOSS_METRICS",
    "Registry",
    "UnknownNameError",
    "aggregate_loss",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_from_logits",
    "forking_token_mask",
    "get_advantage_fn",
    "get_kl_fn",
    "get_policy_loss_fn",
    "group_mean_std",
    "kl_estimate",
    "kl_in_reward",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "noisy_reward_backward_correction",
    "noisy_reward_forward_correction",
    "outcome_to_token_rewards",
    "overlong_mask",
    "overlong_soft_penalty",
    "rollout_is_weights",
    "weight_positive_samples",
    "zero_variance_group_mask",
]

F = TypeVar("F", bound=Callable[..., object])

# Bound on log-ratios before exponentiation; same safety bound verl uses (exp(20) ~ 4.9e8).
_LOG_RATIO_BOUND = 20.0


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


class UnknownNameError(KeyError, ValueError):
    """Raised by ``Registry.get`` for an unknown name; catchable as ``KeyError`` or ``ValueError``.

    ``str(err)`` is the plain message (``KeyError`` would otherwise wrap it in quotes).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """A name -> callable table for one family of algorithms.

    ``register(name)`` is a decorator (stack it to register aliases); ``get(name)`` raises
    :class:`UnknownNameError` whose message lists every valid name, sorted; ``names()`` returns
    the sorted names.
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; re-registering a name raises ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.family} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """Return the callable registered under ``name``."""
        try:
            return self._fns[name]
        except (KeyError, TypeError):
            valid = ", ".join(self.names())
            raise UnknownNameError(
                f"unknown {self.family} {name!r}; valid names: {valid}"
            ) from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, names={self.names()})"


ADVANTAGES: Registry[Callable[..., Tensor]] = Registry("advantage estimator")
POLICY_LOSSES: Registry[Callable[..., tuple[Tensor, dict[str, Tensor]]]] = Registry("policy loss")
LOSS_AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("loss aggregation mode")
KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")


def get_advantage_fn(name: str) -> Callable[..., Tensor]:
    """Advantage estimator ``fn(rewards, group_ids, response_mask, **options) -> [B, L]``.

    verl: ``get_adv_estimator_fn``. Raises UnknownNameError listing the valid names.
    """
    return ADVANTAGES.get(name)


def get_policy_loss_fn(name: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """Policy loss ``fn(logprobs, old_logprobs, advantages, response_mask, **options)``.

    Returns ``(loss [B, L], {metric: [B, L]})``, see ``POLICY_LOSS_METRICS``.
    verl: ``get_policy_loss_fn``. Raises UnknownNameError listing the valid names.
    """
    return POLICY_LOSSES.get(name)


def get_kl_fn(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """Per-token KL estimator ``fn(logprobs, ref_logprobs) -> [B, L]`` (unmasked).

    verl: the ``kl_penalty`` name dispatch. Raises UnknownNameError listing the valid names.
    """
    return KL_ESTIMATORS.get(name)


# ----------------------------------------------------------------------------------------------
# Scalar-hyperparameter checks (the only validation; never inspects tensor values)
# ----------------------------------------------------------------------------------------------


def _check_nonneg(name: str, value: float) -> None:
    if not value >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _check_unit_interval(name: str, value: float, *, closed_high: bool = True) -> None:
    ok = 0.0 <= value <= 1.0 if closed_high else 0.0 <= value < 1.0
    if not ok:
        upper = "1]" if closed_high else "1)"
        raise ValueError(f"{name} must be in [0, {upper}, got {value!r}")


# ----------------------------------------------------------------------------------------------
# Masked reductions
# ----------------------------------------------------------------------------------------------


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is True.

    Formula: ``sum_{mask} values`` (over ``dim`` or all elements). Paper: none (utility).
    Shapes: values [B, L], mask [B, L] bool -> scalar, or [B] with ``dim=-1``.
    verl: ``verl.utils.torch_functional.masked_sum``. Departure: masked-out entries are
    selected away with ``torch.where`` rather than multiplied by 0, so NaN/inf in padding
    cannot leak into the result or its gradient.
    """
    selected = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is True.

    Formula: ``sum_{mask} values / max(count(mask), 1)``. Paper: none (utility).
    Shapes: values [B, L], mask [B, L] bool -> scalar, or [B] with ``dim=-1``.
    verl: ``verl.utils.torch_functional.masked_mean``. Departure: verl divides by
    ``count + 1e-8``; here the count is floored at 1 (exact for non-empty masks, 0 for empty).
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True) -> Tensor:
    """Whiten ``values`` with the mean and unbiased variance of the masked entries.

    Formula::

        n = count(mask);  mu = sum_{mask} v / n;  var = sum_{mask} (v - mu)^2 / (n - 1)
        out = (v - mu) * rsqrt(var + 1e-8)       (+ mu again if shift_mean is False)

    Paper: none (utility; REINFORCE++ arXiv:2501.03262 whitens advantages with it).
    Statistics are computed over *whatever tensors are passed in* (the train stage passes the
    whole iteration's batch). Shapes: values [B, L], mask [B, L] bool -> [B, L]; entries where
    the mask is False are transformed too (callers mask them), as in verl.
    verl: ``verl.utils.torch_functional.masked_whiten`` (unbiased ``masked_var``).
    Departure: verl raises when ``n <= 1``; raising would need a device sync, so here the
    Bessel denominator is floored at 1 (one valid token -> variance 0 -> output 0).
    """
    n = mask.sum().to(values.dtype)
    mean = masked_sum(values, mask) / n.clamp(min=1)
    centered = values - mean
    var = masked_sum(centered * centered, mask) / (n - 1).clamp(min=1)
    whitened = centered * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def _zero_outside(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


# ----------------------------------------------------------------------------------------------
# Group statistics
# ----------------------------------------------------------------------------------------------


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index per sample and the number of slots (B) to scatter into.

    Shapes: group_ids [B] int -> ([B] int64 in [0, G), B). Sort-based rather than
    ``torch.unique`` so every shape is static (no device sync on CUDA); slots >= G stay unused.
    """
    sorted_ids, order = torch.sort(group_ids, stable=True)
    starts = torch.ones_like(sorted_ids, dtype=torch.long)
    starts[1:] = (sorted_ids[1:] != sorted_ids[:-1]).long()
    dense = torch.cumsum(starts, dim=0) - 1
    return torch.empty_like(dense).scatter(0, order, dense), group_ids.shape[0]


def group_mean_std(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std and group size (verl singleton convention).

    Formula: for sample i in group g: ``mean_g = sum_g r / n_g``,
    ``std_g = sqrt(sum_g (r - mean_g)^2 / (n_g - 1))``, ``n_g``; a group of size 1 gets
    mean 0 and std 1, as in verl's ``compute_grpo_outcome_advantage`` (which uses
    ``torch.mean`` / ``torch.std``). Paper: GRPO, arXiv:2402.03300.
    Shapes: scores [B] float, group_ids [B] int -> (mean [B], std [B], count [B]).
    """
    inverse, num_groups = _group_index(group_ids)
    zeros = scores.new_zeros(num_groups)
    counts = zeros.index_add(0, inverse, torch.ones_like(scores))
    means = zeros.index_add(0, inverse, scores) / counts.clamp(min=1)
    centered = scores - means[inverse]
    sq = zeros.index_add(0, inverse, centered * centered)
    stds = torch.sqrt(sq / (counts - 1).clamp(min=1))
    single = counts <= 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    return means[inverse], stds[inverse], counts[inverse]


def _outcome_scores(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Sequence scores [B]: ``rewards`` if 1-D, else the masked token sum of a [B, L] tensor.

    Mirrors verl's ``scores = token_level_rewards.sum(dim=-1)``.
    """
    if rewards.dim() == 1:
        return rewards
    if rewards.dim() == 2:
        return masked_sum(rewards, response_mask, dim=-1)
    raise ValueError(f"rewards must be [B] or [B, L], got shape {tuple(rewards.shape)}")


def broadcast_to_tokens(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast a per-sequence value to every valid token.

    Formula: ``out[i, t] = scores[i] if mask[i, t] else 0``. Paper: none. verl:
    ``scores.unsqueeze(-1) * response_mask``.
    Shapes: scores [B], response_mask [B, L] bool -> [B, L].
    """
    return _zero_outside(scores.unsqueeze(-1).expand(response_mask.shape), response_mask)


def outcome_to_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Place each outcome reward on its sequence's last valid token.

    Formula: ``R[i, t] = r_i if t == last_valid(i) else 0``; an all-masked row gets zeros.
    Paper: none (outcome-reward convention of RLVR).
    Shapes: rewards [B], response_mask [B, L] bool -> [B, L].
    verl: the reward managers write the score at ``valid_response_length - 1``; here "last
    valid" is the last True position, so non-contiguous masks are handled too.
    """
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    last = torch.where(response_mask, positions, -1).amax(dim=-1)  # [B]; -1 if none valid
    at_last = positions.unsqueeze(0) == last.unsqueeze(-1)  # [B, L]
    return _zero_outside(rewards.unsqueeze(-1).expand(response_mask.shape), at_last)


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go ``G_t = sum_{k >= t} gamma^(k - t) R_k`` over valid tokens.

    Paper: REINFORCE (Williams 1992); as used by REINFORCE++, arXiv:2501.03262.

    Shapes: token_rewards [B, L], response_mask [B, L] bool -> [B, L] (zero where masked).
    verl: the return loop in ``compute_reinforce_plus_plus_outcome_advantage``. Rewards at
    masked positions are ignored (equal to verl's reset-after-EOS for right-padded masks).
    """
    _check_unit_interval("gamma", gamma)
    r = _zero_outside(token_rewards, response_mask)
    if gamma == 1.0:
        returns = torch.flip(torch.cumsum(torch.flip(r, dims=[-1]), dim=-1), dims=[-1])
    else:
        running = torch.zeros_like(r[:, 0])
        columns = []
        for t in reversed(range(r.shape[-1])):
            running = r[:, t] + gamma * running
            columns.append(running)
        returns = torch.stack(columns[::-1], dim=-1)
    return _zero_outside(returns, response_mask)


# ----------------------------------------------------------------------------------------------
# Advantage estimators: fn(rewards [B], group_ids [B], response_mask [B, L], **options) -> [B, L]
# ----------------------------------------------------------------------------------------------


@ADVANTAGES.register("grpo")
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


@ADVANTAGES.register("dr_grpo")
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


@ADVANTAGES.register("rloo")
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


@ADVANTAGES.register("reinforce_plus_plus")
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


@ADVANTAGES.register("reinforce_plus_plus_baseline")
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


@ADVANTAGES.register("grpo_passk")
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


@ADVANTAGES.register("w_reinforce")
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
    Paper: MiniMax-M1, arXiv:2506.13585. verl: no core_algos equivalent in the versions this
    was written against.
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


# ----------------------------------------------------------------------------------------------
# Loss aggregation
# ----------------------------------------------------------------------------------------------

Count = Tensor | float | int


def _denominator(value: Count | None, default: Tensor) -> Tensor | float:
    """The normaliser, floored at 1 so an all-masked batch gives loss 0 instead of NaN."""
    if value is None:
        return default.clamp(min=1)
    if isinstance(value, Tensor):
        return value.clamp(min=1)
    return max(float(value), 1.0)


def _local_num_seqs(response_mask: Tensor) -> Tensor:
    return response_mask.any(dim=-1).sum()


@LOSS_AGGREGATIONS.register("token-mean")
def _agg_token_mean(
    loss: Tensor,
    response_mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Token mean: ``sum_{i,t valid} l_{i,t} / num_tokens`` (DAPO token-level loss).

    Paper: DAPO, arXiv:2503.14476. verl: ``agg_loss(..., "token-mean")`` (``batch_num_tokens``).
    Shapes: loss [B, L], response_mask [B, L] bool -> scalar.
    """
    del num_seqs, horizon
    return masked_sum(loss, response_mask) / _denominator(num_tokens, response_mask.sum())


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _agg_seq_mean_token_sum(
    loss: Tensor,
    response_mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Sequence mean of token sums: ``sum_i (sum_{t valid} l_{i,t}) / num_seqs``.

    Paper: none specific (REINFORCE-style sequence loss). verl: ``seq-mean-token-sum``.
    Shapes: loss [B, L], response_mask [B, L] bool -> scalar.
    """
    del num_tokens, horizon
    seq = masked_sum(loss, response_mask, dim=-1)
    return seq.sum() / _denominator(num_seqs, _local_num_seqs(response_mask))


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _agg_seq_mean_token_mean(
    loss: Tensor,
    response_mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Sequence mean of token means: ``sum_i (sum_{t valid} l_{i,t} / |y_i|) / num_seqs``.

    Paper: GRPO as published (DeepSeekMath, arXiv:2402.03300); GSPO's objective
    (arXiv:2507.18071). verl: ``seq-mean-token-mean`` (divides by ``|y_i| + 1e-8``; here
    ``|y_i|`` is floored at 1, identical for non-empty sequences).
    Shapes: loss [B, L], response_mask [B, L] bool -> scalar.
    """
    del num_tokens, horizon
    seq = masked_mean(loss, response_mask, dim=-1)
    return seq.sum() / _denominator(num_seqs, _local_num_seqs(response_mask))


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _agg_seq_mean_token_sum_norm(
    loss: Tensor,
    response_mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Dr.GRPO: ``sum_{i,t valid} l_{i,t} / (num_seqs * horizon)``, horizon a constant length.

    Paper: arXiv:2503.20783 (``1/G * sum_i 1/MAX_TOKENS * sum_t``). verl:
    ``seq-mean-token-sum-norm`` (recent verl: token sums / ``loss_scale_factor`` / global batch
    size, as here; older verl divided by the horizon only, a constant factor ``num_seqs``
    larger). ``horizon`` defaults to ``L`` of this batch; pass the max response length.
    Shapes: loss [B, L], response_mask [B, L] bool -> scalar.
    """
    del num_tokens
    steps = loss.shape[-1] if horizon is None else horizon
    if not steps >= 1:
        raise ValueError(f"horizon must be >= 1, got {horizon!r}")
    seqs = _denominator(num_seqs, _local_num_seqs(response_mask))
    return masked_sum(loss, response_mask) / (seqs * steps)


def aggregate_loss(
    loss: Tensor,
    response_mask: Tensor,
    mode: str,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Reduce a per-token loss (or metric) [B, L] to a scalar, dispatching on ``mode``.

    Modes (see ``LOSS_AGGREGATIONS.names()``)::

        token-mean               sum_{i,t} m l / num_tokens
        seq-mean-token-sum       sum_i (sum_t m l) / num_seqs
        seq-mean-token-mean      sum_i (sum_t m l / sum_t m) / num_seqs
        seq-mean-token-sum-norm  sum_{i,t} m l / (num_seqs * horizon)      (Dr.GRPO)

    Defaults: ``num_tokens`` = valid tokens in *this* mask; ``num_seqs`` = sequences of this
    mask with at least one valid token (verl counts every row, empty ones included);
    ``horizon`` = ``loss.shape[-1]``. The train stage passes the GLOBAL counts of the whole
    mini-batch (and the fixed max response length as horizon), so summing this over
    micro-batches equals the full mini-batch aggregate exactly. Denominators are floored at 1
    (an all-masked batch yields 0, not NaN). Data parallelism: DeepSpeed *averages* gradients
    over the DP ranks, so for an exact global normaliser pass ``global_count / dp_size`` (verl
    multiplies the loss by ``dp_size`` for the same reason).
    verl: ``agg_loss(loss_mat, loss_mask, loss_agg_mode)``. Paper refs: DAPO
    arXiv:2503.14476 (token-mean), Dr.GRPO arXiv:2503.20783 (…-norm).
    Shapes: loss [B, L], response_mask [B, L] bool -> scalar tensor.
    """
    fn = LOSS_AGGREGATIONS.get(mode)
    return fn(loss, response_mask, num_tokens=num_tokens, num_seqs=num_seqs, horizon=horizon)


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


# ----------------------------------------------------------------------------------------------
# Logits -> per-token quantities
# ----------------------------------------------------------------------------------------------


def _row_chunks(x: Tensor, chunk_size: int | None) -> list[Tensor]:
    if chunk_size is None:
        return [x]
    if not chunk_size >= 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    return list(torch.split(x, chunk_size, dim=0))


def _compute_dtype(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Entropy of the softmax distribution at every position, numerically stable.

    Formula: ``H = logsumexp(z) - sum_v softmax(z)_v * z_v``.
    Rows (B*L positions) are processed ``chunk_size`` at a time to bound the temporary memory;
    fp16/bf16 logits are upcast to float32 per chunk (the result is float32 then).
    Paper: none (entropy metric / bonus; the forking-token paper arXiv:2506.01939 ranks by it).
    verl: ``verl.utils.torch_functional.entropy_from_logits``. Gradients flow (entropy bonus).
    Shapes: logits [B, L, V] -> [B, L].
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in _row_chunks(flat, chunk_size):
        z = _compute_dtype(chunk)
        lse = torch.logsumexp(z, dim=-1)
        probs = torch.exp(z - lse.unsqueeze(-1))
        # -inf logits (masked vocabulary) have p = 0 and contribute 0, not 0 * -inf = NaN.
        z_seen = torch.where(probs > 0, z, torch.zeros((), dtype=z.dtype, device=z.device))
        parts.append(lse - (probs * z_seen).sum(dim=-1))
    return torch.cat(parts).reshape(lead)


def logprobs_from_logits(
    logits: Tensor, tokens: Tensor, *, chunk_size: int | None = 1024
) -> Tensor:
    """Log-probability of ``tokens`` under ``softmax(logits)``, without a full log_softmax.

    Formula: ``log p(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}`` (gather, then subtract).
    Only the logsumexp per row is kept, never a [B, L, V] log_softmax; rows are chunked by
    ``chunk_size``; fp16/bf16 logits are upcast to float32 per chunk (result float32).
    ``tokens`` must be valid vocabulary ids everywhere (padding included). Paper: none.
    verl: ``verl.utils.torch_functional.logprobs_from_logits`` (``_v2`` variant).
    Shapes: logits [B, L, V], tokens [B, L] int64 -> [B, L].
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1, 1)
    parts = []
    for chunk, tok in zip(
        _row_chunks(flat, chunk_size), _row_chunks(flat_tokens, chunk_size), strict=True
    ):
        z = _compute_dtype(chunk)
        picked = torch.gather(z, -1, tok).squeeze(-1)
        parts.append(picked - torch.logsumexp(z, dim=-1))
    return torch.cat(parts).reshape(lead)


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


def overlong_soft_penalty(
    response_lengths: Tensor,
    max_length: int,
    buffer_length: int,
    *,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment, added to the outcome reward.

    Formula (``Lmax = max_length``, ``Lc = buffer_length``, ``|y|`` = response length)::

        0                                   if |y| <= Lmax - Lc
        factor * ((Lmax - Lc) - |y|) / Lc   if Lmax - Lc < |y| <= Lmax
        -factor                             if |y| > Lmax

    Paper: DAPO, arXiv:2503.14476 (eq. 13). verl: the DAPO reward manager's
    ``overlong_buffer`` (``min(-exceed_len / buffer_len * penalty_factor, 0)``), which equals
    this for ``|y| <= Lmax``.
    Shapes: response_lengths [B] (int or float) -> [B] float (float32 for integer input).
    """
    if not 1 <= buffer_length <= max_length:
        raise ValueError(
            f"need 1 <= buffer_length <= max_length, got {buffer_length}, {max_length}"
        )
    _check_nonneg("penalty_factor", penalty_factor)
    lengths = response_lengths if response_lengths.is_floating_point() else response_lengths.float()
    exceed = (lengths - (max_length - buffer_length)) / buffer_length
    return -penalty_factor * torch.clamp(exceed, min=0.0, max=1.0)
