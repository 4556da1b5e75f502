"""The curriculum prompt sampler (docs/algorithms.md, "Curriculum").

The verify stage commits, for every prompt of an iteration, how many samples it scored and how
many succeeded (`iterations/<i>/prompt_stats/`, components/core/prompt_stats.py). With `data.sampler:
curriculum` the generate stage folds those tables, iteration by iteration, into what the run
knows about each prompt (:class:`History`) and draws iteration t's prompts from it
(:func:`curriculum_indices`):

* a share (`explore_share`) of the prompts is drawn uniformly from prompts never sampled;
* the rest by weight ``E[p(1-p)] ** sharpness`` under the prompt's Beta posterior, whose prior
  is its group's pooled pass rate (`group_by`, e.g. a difficulty level) worth `prior_strength`
  samples: prompts the policy always or never solves give GRPO no signal and are drawn less;
* a prompt solved by every sample in `retire_after` consecutive draws of it retires, and may be
  drawn again `return_after` iterations after the iteration that retired it.

Iteration t sees the stats of iterations up to t - 1 - train.max_staleness only: exactly those
committed before checkpoint t - max_staleness, which generate waits for anyway. So the draw is a
pure function of (run seed, t, committed stats): deterministic, resumable, and the same in every
generate shard. Draws without replacement by weight use exponential keys (Efraimidis-Spirakis):
the k smallest ``-log(u_i) / w_i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from components.core.config import CurriculumSection
from components.core.errors import UserError
from components.core.prompt_stats import row_of

__all__ = ["History", "beta_signal", "curriculum_indices", "group_keys"]


def group_keys(table: pa.Table, group_by: str | None) -> np.ndarray:
    """One group id per train-set row: the value of `group_by` (a column, or
    `extra_info.<field>`), as integer codes; all zeros when `group_by` is None."""
    if group_by is None:
        return np.zeros(table.num_rows, dtype=np.int64)
    column, _, fieldname = group_by.partition(".")
    if column not in table.column_names:
        raise UserError(
            f"data.curriculum.group_by={group_by!r}: the train set has no column {column!r} "
            f"(columns: {table.column_names}); name one of them, extra_info.<field>, or null"
        )
    values = table.column(column)
    if fieldname:
        if not pa.types.is_struct(values.type) or values.type.get_field_index(fieldname) < 0:
            raise UserError(
                f"data.curriculum.group_by={group_by!r}: column {column!r} has no field "
                f"{fieldname!r} (type {values.type}); name an existing field or null"
            )
        values = pa.compute.struct_field(values, fieldname)
    codes = pa.compute.dictionary_encode(values.cast(pa.string())).combine_chunks()
    return np.asarray(codes.indices.fill_null(-1), dtype=np.int64)


@dataclass
class History:
    """What the run knows about each train-set row after folding iterations `< next_iteration`."""

    num_rows: int
    attempts: np.ndarray = field(init=False)
    successes: np.ndarray = field(init=False)
    last_seen: np.ndarray = field(init=False)  # -1: never sampled
    streak: np.ndarray = field(init=False)  # consecutive draws with every sample solved
    retired_at: np.ndarray = field(init=False)  # -1: not retired
    excluded: np.ndarray = field(init=False)  # generate skipped it (prompt too long): never scored
    next_iteration: int = 0

    def __post_init__(self) -> None:
        n = self.num_rows
        self.attempts = np.zeros(n, np.int64)
        self.successes = np.zeros(n, np.int64)
        self.last_seen = np.full(n, -1, np.int64)
        self.streak = np.zeros(n, np.int64)
        self.retired_at = np.full(n, -1, np.int64)
        self.excluded = np.zeros(n, bool)

    def fold(
        self, stats: pa.Table, iteration: int, retire_after: int, skipped: Sequence[int] = ()
    ) -> None:
        """Add one iteration's prompt stats (iterations must come in order, none skipped), and
        the rows generate skipped that iteration (longer than generate.max_prompt_tokens: they
        would never be scored, so they are never drawn again)."""
        if iteration != self.next_iteration:
            raise ValueError(f"fold iteration {iteration} after {self.next_iteration - 1}")
        if len(skipped):
            self.excluded[np.asarray(skipped, np.int64)] = True
        rows = np.array([row_of(p) for p in stats.column("prompt_id").to_pylist()], np.int64)
        if rows.size:
            if rows.max() >= self.num_rows:
                raise UserError(
                    f"prompt stats of iteration {iteration} name row {rows.max()}, but the "
                    f"train set has {self.num_rows} rows: the train set changed during the run"
                )
            a = np.asarray(stats.column("attempts"), np.int64)
            s = np.asarray(stats.column("successes"), np.int64)
            self.attempts[rows] += a
            self.successes[rows] += s
            self.last_seen[rows] = iteration
            solved = s == a
            self.streak[rows] = np.where(solved, self.streak[rows] + 1, 0)
            retire = rows[self.streak[rows] >= retire_after]
            self.retired_at[retire] = iteration
            self.streak[retire] = 0
        self.next_iteration = iteration + 1


def beta_signal(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """E[p(1-p)] for p ~ Beta(alpha, beta): the expected variance of a sample's 0/1 reward, which
    is largest for prompts solved about half the time and small for those always or never solved.
    """
    total = alpha + beta
    return alpha * beta / (total * (total + 1.0))


def _posterior(
    history: History, groups: np.ndarray, c: CurriculumSection
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row Beta posterior (alpha, beta) of the pass rate: the group's pooled pass rate worth
    `prior_strength` samples, plus the row's own successes and failures."""
    num_groups = int(groups.max()) + 1 if groups.size else 0
    valid = groups >= 0
    g = np.where(valid, groups, num_groups)  # rows with no group value share one extra group
    ga = np.bincount(g, weights=history.attempts, minlength=num_groups + 1)
    gs = np.bincount(g, weights=history.successes, minlength=num_groups + 1)
    pooled = (1.0 + gs) / (2.0 + ga)  # each group's pass rate under a Beta(1, 1) prior
    alpha = c.prior_strength * pooled[g] + history.successes
    beta = c.prior_strength * (1.0 - pooled[g]) + (history.attempts - history.successes)
    return alpha, beta


def _weights(history: History, groups: np.ndarray, c: CurriculumSection) -> np.ndarray:
    """Per-row sampling weight E[p(1-p)] ** sharpness under the row's Beta posterior."""
    return beta_signal(*_posterior(history, groups, c)) ** c.sharpness


def curriculum_indices(
    history: History,
    groups: np.ndarray,
    count: int,
    seed: int,
    iteration: int,
    c: CurriculumSection,
) -> tuple[list[int], dict[str, float]]:
    """Iteration `iteration`'s train-set rows under the curriculum, and the sampler's figures.

    Returns `count` distinct rows: first up to round(explore_share * count) never-sampled rows,
    uniformly, then the rest by weight among rows not retired (retired rows whose `return_after`
    has passed are eligible again) and not excluded (skipped by generate); if too few rows are
    eligible, retired rows fill the draw, then excluded ones.
    """
    n = history.num_rows
    if count > n:
        raise UserError(
            f"data.prompts_per_iteration={count} exceeds the {n} rows of the train set; "
            "lower it or use a larger train set"
        )
    rng = np.random.default_rng([seed, iteration, 7])
    excluded = history.excluded
    unseen = np.flatnonzero((history.attempts == 0) & ~excluded)
    n_explore = min(round(c.explore_share * count), unseen.size)
    explored = rng.choice(unseen, size=n_explore, replace=False) if n_explore else unseen[:0]

    alpha, beta = _posterior(history, groups, c)
    weights = beta_signal(alpha, beta) ** c.sharpness
    retired = (history.retired_at >= 0) & (iteration - history.retired_at < c.return_after)
    # Exponential keys: the k smallest -log(u)/w are a weighted draw without replacement.
    keys = -np.log(rng.random(n)) / np.maximum(weights, 1e-300)
    taken = np.zeros(n, bool)
    taken[explored] = True
    eligible = ~retired & ~taken & ~excluded
    rest = count - n_explore
    chosen = _smallest(keys, eligible, rest)
    # Too few eligible rows: retired ones fill the draw, then (a train set of mostly too-long
    # prompts) skipped ones, so an iteration always has its prompts_per_iteration.
    for fill in (retired & ~taken & ~excluded, excluded & ~taken):
        if chosen.size < rest:
            chosen = np.concatenate([chosen, _smallest(keys, fill, rest - chosen.size)])
    rows = [int(x) for x in explored] + [int(x) for x in chosen]

    picked = np.asarray(rows, np.int64)
    a, b = alpha[picked], beta[picked]
    figures = {  # what the sampler expects of the prompts it drew, under their posteriors
        "explored": float(n_explore),
        "seen_share": float((history.attempts > 0).mean()),
        "retired": float(retired.sum()),
        "excluded": float(excluded.sum()),
        "expected_pass_rate": float((a / (a + b)).mean()),
        "expected_signal": float(beta_signal(a, b).mean()),
    }
    return rows, figures


def _smallest(keys: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """Up to k rows of `mask` with the smallest keys, in key order."""
    candidates = np.flatnonzero(mask)
    if k <= 0 or candidates.size == 0:
        return candidates[:0]
    if candidates.size > k:
        candidates = candidates[np.argpartition(keys[candidates], k - 1)[:k]]
    return candidates[np.argsort(keys[candidates], kind="stable")]
