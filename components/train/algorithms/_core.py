"""Registries, scalar checks, masked reductions and group helpers shared by the families.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from components.core.errors import UserError

F = TypeVar("F", bound=Callable[..., object])

# Bound on log-ratios before exponentiation; same safety bound verl uses (exp(20) ~ 4.9e8).
_LOG_RATIO_BOUND = 20.0


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


class UnknownNameError(KeyError, UserError):
    """Raised by ``Registry.get`` for an unknown name; catchable as ``KeyError`` or ``ValueError``.

    ``str(err)`` is the plain message (``KeyError`` would otherwise wrap it in quotes).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """A name -> callable table for one family of algorithms.

    ``register(name, **traits)`` is a decorator (stack it to register aliases); ``get(name)``
    raises :class:`UnknownNameError` whose message lists every valid name, sorted; ``names()``
    returns the sorted names. A family may require traits that every entry declares when it
    registers (the advantage estimators' ``group_relative``), read back with ``trait``.
    """

    def __init__(self, family: str, *, traits: tuple[str, ...] = ()) -> None:
        self.family = family
        self.required = traits
        self._fns: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` with its ``traits``; re-registering a name,
        or leaving out a trait the family requires, raises ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.family} name must be a non-empty string, got {name!r}")
        missing = [t for t in self.required if t not in traits]
        if missing:
            raise ValueError(
                f"{self.family} {name!r} must declare {', '.join(missing)} when it registers: "
                f"register({name!r}, {'=..., '.join(missing)}=...)"
            )

        def decorator(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._fns[name] = fn
            self._traits[name] = dict(traits)
            return fn

        return decorator

    def trait(self, name: str, key: str, default: Any = None) -> Any:
        """What entry ``name`` declared for trait ``key`` (``default`` for an unknown name)."""
        return self._traits.get(name, {}).get(key, default)

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


#: `group_relative`: a group whose rewards are all equal gets zero advantage (run health's "no
#: signal" is judged only for such estimators: components/train/health.py).
ADVANTAGES: Registry[Callable[..., Tensor]] = Registry(
    "advantage estimator", traits=("group_relative",)
)
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
