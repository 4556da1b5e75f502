"""Pure evaluation metrics: pass@k, maj@k, bootstrap intervals and per-problem summaries.

Everything in this module is a pure function of its arguments (no I/O, no global state); the only
randomness is the bootstrap, which draws from ``numpy.random.default_rng(seed)``.

Definitions
-----------
A *problem* is one held-out prompt with ``n`` sampled responses. Each response has a scalar
reward, a boolean ``correct`` flag, an extracted final answer (``None`` when nothing could be
extracted) and a length in tokens.

``correct``
    For the usual binary verifiable rewards (0 or 1) a response is correct when
    ``reward > CORRECT_THRESHOLD`` (0.5). :meth:`ProblemSamples.from_rewards` applies this rule;
    callers with a different notion of correctness may pass ``correct`` explicitly.

``pass@k``
    The unbiased estimator of Chen et al. 2021 (arXiv:2107.03374): the probability that a
    uniformly random ``k``-subset of the ``n`` samples contains at least one correct sample,
    ``1 - C(n - c, k) / C(n, k)``, averaged over problems.

``maj@k``
    The expected accuracy of a majority vote over a uniformly random ``k``-subset of the ``n``
    samples (exact expectation, no Monte Carlo). See :func:`maj_at_k` for the vote and tie rules.

``mean@n``
    The mean reward over all ``n`` samples, averaged over problems.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "CORRECT_THRESHOLD",
    "ProblemSamples",
    "bootstrap_ci",
    "default_ks",
    "maj_at_k",
    "pass_at_k",
    "summarize",
    "summarize_by",
]

#: A response is correct when its reward is strictly greater than this (binary 0/1 rewards).
CORRECT_THRESHOLD = 0.5

#: maj@k enumerates every k-subset when there are at most this many; otherwise it uses the exact
#: dynamic programme in :func:`_maj_at_k_dp` (faster beyond ~100 subsets). Both give the same value.
_MAX_ENUMERATED_SUBSETS = 100

#: Upper bound on the number of (resample, problem) indices drawn at once by the bootstrap.
_BOOTSTRAP_CHUNK_ELEMENTS = 4_000_000


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


def _check_k(n: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1 (got n={n}); every problem needs at least one sample")
    if k < 1 or k > n:
        raise ValueError(
            f"k must satisfy 1 <= k <= n, got k={k} with n={n}; "
            f"sample at least k responses per prompt or choose k in [1, {n}]"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem with ``c`` correct out of ``n`` samples.

    Computes ``1 - C(n - c, k) / C(n, k)`` in the numerically stable product form
    ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``; returns exactly 1.0 when ``n - c < k`` (every
    ``k``-subset then contains a correct sample).

    Raises:
        ValueError: if ``k < 1`` or ``k > n``, or ``c`` is not in ``[0, n]``.
    """
    _check_k(n, k)
    if c < 0 or c > n:
        raise ValueError(f"c must satisfy 0 <= c <= n, got c={c} with n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def default_ks(n: int, extra: Iterable[int] = ()) -> list[int]:
    """Every power of two ``<= n`` plus the ``extra`` ks, sorted and de-duplicated.

    Raises:
        ValueError: if ``n < 1`` or an extra k is outside ``[1, n]``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 (got n={n})")
    ks = {1 << i for i in range(n.bit_length()) if (1 << i) <= n}
    for k in extra:
        _check_k(n, int(k))
        ks.add(int(k))
    return sorted(ks)


# --------------------------------------------------------------------------------------------
# maj@k
# --------------------------------------------------------------------------------------------


def _answer_groups(
    answers: Sequence[str | None], correct: Sequence[bool]
) -> tuple[dict[str, tuple[int, float]], int]:
    """Group samples by extracted answer.

    Returns ``({answer: (votes, correctness)}, num_none)`` where ``correctness`` is the fraction
    of that answer's samples flagged correct (1.0 or 0.0 whenever the verifier is a function of
    the extracted answer, which is the usual case).
    """
    votes: dict[str, int] = {}
    n_correct: dict[str, int] = {}
    num_none = 0
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            num_none += 1
            continue
        votes[answer] = votes.get(answer, 0) + 1
        n_correct[answer] = n_correct.get(answer, 0) + int(bool(ok))
    groups = {a: (votes[a], n_correct[a] / votes[a]) for a in votes}
    return groups, num_none


def _subset_vote_score(subset: Sequence[str | None], correctness: dict[str, float]) -> float:
    """Score of one majority vote: the mean correctness of the answers tied for most votes."""
    votes: dict[str, int] = {}
    for answer in subset:
        if answer is not None:
            votes[answer] = votes.get(answer, 0) + 1
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [a for a, v in votes.items() if v == top]
    return sum(correctness[a] for a in winners) / len(winners)


def _maj_at_k_enumerate(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k by enumerating all ``C(n, k)`` subsets (exact; only for small ``C(n, k)``)."""
    groups, _ = _answer_groups(answers, correct)
    correctness = {a: q for a, (_, q) in groups.items()}
    total = 0.0
    count = 0
    for subset in itertools.combinations(answers, k):
        total += _subset_vote_score(subset, correctness)
        count += 1
    return total / count


def _binom_pmf(m: int, p: float) -> np.ndarray:
    """Binomial(m, p) probabilities for x = 0..m as float64 (computed in log space)."""
    x = np.arange(m + 1)
    if p >= 1.0:
        out = np.zeros(m + 1)
        out[m] = 1.0
        return out
    log_comb = np.array(
        [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) for i in x]
    )
    return np.exp(log_comb + x * math.log(p) + (m - x) * math.log1p(-p))


def _maj_at_k_dp(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k by an exact dynamic programme over vote counts (no enumeration, no sampling).

    For a uniformly random ``k``-subset the per-answer vote counts ``x_a`` (and the count ``x_0``
    of ``None`` answers) are multivariate hypergeometric: ``P(x) = prod_a C(m_a, x_a) / C(n, k)``
    with ``m_a`` the number of samples giving answer ``a``. By linearity,

        maj@k = sum_a q_a * sum_{v >= 1} P(x_a = v, x_b <= v for all b, T = 1 + t) / (1 + t)

    where ``q_a`` is the answer's correctness and ``T`` the number of answers tied at the top. For
    a fixed answer ``a`` and top count ``v`` a DP over the other answers tracks (votes used so
    far, number of other answers tied at ``v``) with each other answer restricted to ``x_b <= v``;
    ``None`` votes are unrestricted. The result only depends on ``m_a``, so answers are handled
    per distinct group size. To keep every intermediate value in floating-point range the
    binomial coefficients are replaced by Binomial(m, p) probabilities with ``p = k / n``: the
    factors ``p^x (1 - p)^(m - x)`` multiply to ``p^k (1 - p)^(n - k)`` for every subset and cancel
    against the same factor in ``C(n, k)``.
    """
    n = len(answers)
    groups, num_none = _answer_groups(answers, correct)
    if not groups:
        return 0.0
    p = k / n
    sizes = sorted({m for m, _ in groups.values()})
    size_count = {s: 0 for s in sizes}
    size_q = {s: 0.0 for s in sizes}
    for m, q in groups.values():
        size_count[m] += 1
        size_q[m] += q
    pmf = {s: _binom_pmf(s, p) for s in sizes}
    none_pmf = _binom_pmf(num_none, p)
    norm = float(_binom_pmf(n, p)[k])
    num_groups = len(groups)

    result = 0.0
    for s in sizes:
        if size_q[s] == 0.0:
            continue  # every answer of this size is wrong: contributes nothing
        others = [(m, size_count[m] - (1 if m == s else 0)) for m in sizes]
        prob_top = 0.0  # P(this particular answer wins, counting ties as 1/T)
        for v in range(1, min(s, k) + 1):
            rest = k - v
            # dp[u, t]: weight of using u votes on the other answers / None with t others tied at v
            dp = np.zeros((rest + 1, num_groups))
            dp[0, 0] = 1.0
            # None answers: any count, never tie, never win.
            new = np.zeros_like(dp)
            for x in range(min(num_none, rest) + 1):
                new[x:, :] += none_pmf[x] * dp[: rest + 1 - x, :]
            dp = new
            for m, count in others:
                below = pmf[m][: min(m, v - 1) + 1]  # x < v: no tie
                at_v = pmf[m][v] if m >= v else 0.0  # x == v: one more tie
                for _ in range(count):
                    new = np.zeros_like(dp)
                    for x, w in enumerate(below):
                        if x > rest:
                            break
                        new[x:, :] += w * dp[: rest + 1 - x, :]
                    if at_v and v <= rest:
                        new[v:, 1:] += at_v * dp[: rest + 1 - v, :-1]
                    dp = new
            ties = np.arange(1, num_groups + 1, dtype=np.float64)
            prob_top += pmf[s][v] * float(np.sum(dp[rest, :] / ties))
        result += size_q[s] * prob_top
    return float(result / norm)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Expected accuracy of a majority vote over a uniformly random ``k``-subset of the samples.

    Vote rule: each sample in the subset votes for its extracted answer; ``None`` answers are not
    votes (they can never win), and a subset whose samples are all ``None`` scores 0.

    Tie rule: if several answers share the highest vote count the tie is broken uniformly at
    random, so the subset scores the *expected* correctness of the winner, i.e. the mean
    correctness of the tied answers.

    Correctness of an answer: the fraction of the ``n`` samples with that answer that are flagged
    correct. It is 0 or 1 when the verifier's verdict is determined by the extracted answer; when
    it is not (e.g. a format penalty on some responses) the fraction is used.

    The value is exact: all ``C(n, k)`` subsets are enumerated when there are at most
    ``_MAX_ENUMERATED_SUBSETS`` of them, otherwise the equivalent dynamic programme in
    :func:`_maj_at_k_dp` is used (float64, agrees with enumeration to ~1e-12).

    Raises:
        ValueError: on mismatched lengths or ``k`` outside ``[1, n]``.
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"answers and correct must have the same length, got {len(answers)} and {len(correct)}"
        )
    n = len(answers)
    _check_k(n, k)
    if math.comb(n, k) <= _MAX_ENUMERATED_SUBSETS:
        return _maj_at_k_enumerate(answers, correct, k)
    return _maj_at_k_dp(answers, correct, k)


# --------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------


def bootstrap_ci(
    values: Sequence[float], *, resamples: int, seed: int, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap ``(1 - alpha)`` interval for the mean of ``values``.

    Resamples the problems (the entries of ``values``) with replacement ``resamples`` times using
    ``numpy.random.default_rng(seed)`` and returns the ``alpha / 2`` and ``1 - alpha / 2``
    quantiles of the resampled means. Deterministic for a given ``(values, resamples, seed)``.

    Raises:
        ValueError: on empty or non-finite values, ``resamples < 1`` or ``alpha`` not in (0, 1).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    size = x.size
    chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // size)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        idx = rng.integers(0, size, size=(stop - start, size))
        means[start:stop] = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProblemSamples:
    """The ``n`` scored samples of one held-out prompt.

    All per-sample lists must have the same length ``n >= 1``. Use :meth:`from_rewards` to derive
    ``correct`` from binary rewards with the module's rule (``reward > CORRECT_THRESHOLD``).
    """

    prompt_id: str
    data_source: str
    rewards: list[float]
    correct: list[bool]
    extracted_answers: list[str | None]
    response_lengths: list[int]

    def __post_init__(self) -> None:
        n = len(self.rewards)
        if n == 0:
            raise ValueError(f"problem {self.prompt_id!r} has no samples")
        lengths = {
            "correct": len(self.correct),
            "extracted_answers": len(self.extracted_answers),
            "response_lengths": len(self.response_lengths),
        }
        bad = {name: size for name, size in lengths.items() if size != n}
        if bad:
            raise ValueError(
                f"problem {self.prompt_id!r}: {len(self.rewards)} rewards but {bad}; "
                "every per-sample list must have one entry per sample"
            )

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.rewards)

    @classmethod
    def from_rewards(
        cls,
        prompt_id: str,
        data_source: str,
        rewards: Sequence[float],
        extracted_answers: Sequence[str | None],
        response_lengths: Sequence[int],
        *,
        threshold: float = CORRECT_THRESHOLD,
    ) -> ProblemSamples:
        """Build a problem with ``correct[i] = rewards[i] > threshold``."""
        return cls(
            prompt_id=prompt_id,
            data_source=data_source,
            rewards=[float(r) for r in rewards],
            correct=[float(r) > threshold for r in rewards],
            extracted_answers=list(extracted_answers),
            response_lengths=[int(x) for x in response_lengths],
        )


def summarize(
    problems: list[ProblemSamples],
    *,
    ks: Iterable[int] | None = None,
    bootstrap_resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """Aggregate metrics over problems that all have the same number of samples ``n``.

    Returns a dict with, in this order:

    - ``"n"``, ``"num_problems"``;
    - ``"pass@<k>"`` for every k in ``ks`` (default :func:`default_ks` of n);
    - ``"mean@<n>"``: mean reward;
    - ``"maj@<k>"`` for every k in ``ks``;
    - ``"response_length/mean"``: mean response length over all samples;
    - ``"pass@1_ci95"`` and ``"mean@<n>_ci95"``: ``[lo, hi]`` 95% percentile bootstrap intervals
      over problems (same seed, hence the same resamples, for both).

    Raises:
        ValueError: if ``problems`` is empty, the problems have different n, or a k is invalid.
    """
    if not problems:
        raise ValueError("summarize() needs at least one problem")
    sizes = sorted({p.n for p in problems})
    if len(sizes) != 1:
        raise ValueError(
            f"every problem must have the same number of samples n, got n in {sizes}; "
            "sample the same n responses for every prompt"
        )
    n = sizes[0]
    if ks is None:
        k_list = default_ks(n)
    else:
        k_list = sorted({int(k) for k in ks})
        if not k_list:
            raise ValueError("ks must not be empty; pass None for the default powers of two")
        for k in k_list:
            _check_k(n, k)

    num_correct = [sum(bool(c) for c in p.correct) for p in problems]
    out: dict = {"n": n, "num_problems": len(problems)}
    for k in k_list:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in num_correct]))
    mean_rewards = [float(np.mean(p.rewards)) for p in problems]
    out[f"mean@{n}"] = float(np.mean(mean_rewards))
    for k in k_list:
        out[f"maj@{k}"] = float(
            np.mean([maj_at_k(p.extracted_answers, p.correct, k) for p in problems])
        )
    out["response_length/mean"] = float(
        np.mean(
            np.concatenate([np.asarray(p.response_lengths, dtype=np.float64) for p in problems])
        )
    )
    pass1 = [c / n for c in num_correct]
    out["pass@1_ci95"] = list(bootstrap_ci(pass1, resamples=bootstrap_resamples, seed=seed))
    out[f"mean@{n}_ci95"] = list(
        bootstrap_ci(mean_rewards, resamples=bootstrap_resamples, seed=seed)
    )
    return out


_GROUP_KEYS = frozenset(f.name for f in fields(ProblemSamples)) - {
    "rewards",
    "correct",
    "extracted_answers",
    "response_lengths",
}


def summarize_by(
    problems: list[ProblemSamples],
    key: str = "data_source",
    *,
    ks: Iterable[int] | None = None,
    bootstrap_resamples: int = 1000,
    seed: int = 0,
) -> dict[str, dict]:
    """:func:`summarize` for each value of ``key`` (``"data_source"`` or ``"prompt_id"``).

    Returns ``{value: summary}`` with the values in sorted order.
    """
    if key not in _GROUP_KEYS:
        raise ValueError(f"key must be one of {sorted(_GROUP_KEYS)}, got {key!r}")
    if ks is not None:
        ks = list(ks)
    buckets: dict[str, list[ProblemSamples]] = {}
    for p in problems:
        buckets.setdefault(str(getattr(p, key)), []).append(p)
    return {
        value: summarize(buckets[value], ks=ks, bootstrap_resamples=bootstrap_resamples, seed=seed)
        for value in sorted(buckets)
    }
