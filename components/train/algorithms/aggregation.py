"""Loss aggregation (``LOSS_AGGREGATIONS``, ``aggregate_loss``): token-mean and the sequence means.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

from torch import Tensor

from components.train.algorithms._core import (
    LOSS_AGGREGATIONS,
    masked_mean,
    masked_sum,
)

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
