"""Tests for components.evaluate.metrics: hand-computed values and brute-force enumeration."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from components.evaluate.metrics import (
    ProblemSamples,
    _maj_at_k_dp,
    bootstrap_ci,
    default_ks,
    maj_at_k,
    pass_at_k,
    summarize,
    summarize_by,
)

EXACT = 1e-12


# --------------------------------------------------------------------------------------------
# Independent brute-force references
# --------------------------------------------------------------------------------------------


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    """Fraction of k-subsets containing at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    """Average over all k-subsets of the majority-vote score, ties split uniformly."""
    # answer-level correctness: fraction of that answer's samples that are correct
    q = {}
    for a in set(answers) - {None}:
        flags = [c for x, c in zip(answers, correct, strict=True) if x == a]
        q[a] = sum(flags) / len(flags)
    scores = []
    for subset in itertools.combinations(range(len(answers)), k):
        votes: dict[str, int] = {}
        for i in subset:
            if answers[i] is not None:
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if not votes:
            scores.append(0.0)
            continue
        top = max(votes.values())
        tied = [a for a, v in votes.items() if v == top]
        scores.append(sum(q[a] for a in tied) / len(tied))
    return sum(scores) / len(scores)


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


def test_pass_at_k_hand_values() -> None:
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=EXACT)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    #   product form: 1 - (1 - 2/4)(1 - 2/5) = 1 - 0.5 * 0.6 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=EXACT)
    # k=1 is the fraction correct: 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=EXACT)
    # n=8, c=2, k=3: 1 - C(6,3)/C(8,3) = 1 - 20/56 = 36/56
    assert pass_at_k(8, 2, 3) == pytest.approx(36 / 56, abs=EXACT)
    # no correct sample -> 0
    assert pass_at_k(6, 0, 3) == 0.0


def test_pass_at_k_is_one_when_every_subset_has_a_correct_sample() -> None:
    # n - c < k: 4 - 2 = 2 < 3
    assert pass_at_k(4, 2, 3) == 1.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 1, 0), (4, 1, -1), (1, 0, 2)])
def test_pass_at_k_rejects_bad_k(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=rf"k={k}.*n={n}"):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_bad_c() -> None:
    with pytest.raises(ValueError, match="c="):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="c="):
        pass_at_k(4, -1, 1)


def test_pass_at_k_matches_enumeration_and_comb_ratio() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            correct = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                expected = brute_pass_at_k(correct, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=EXACT)
                assert pass_at_k(n, c, k) == pytest.approx(
                    1 - math.comb(n - c, k) / math.comb(n, k), abs=EXACT
                )


def test_pass_at_k_large_n_is_stable() -> None:
    # C(1024, 512) overflows float64 but the product form does not.
    value = pass_at_k(1024, 1, 512)
    assert value == pytest.approx(0.5, abs=EXACT)


# --------------------------------------------------------------------------------------------
# default_ks
# --------------------------------------------------------------------------------------------


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(2) == [1, 2]
    assert default_ks(12) == [1, 2, 4, 8]
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12, extra=(12, 3, 4, 3)) == [1, 2, 3, 4, 8, 12]


def test_default_ks_rejects_bad_extra() -> None:
    with pytest.raises(ValueError, match="k=13"):
        default_ks(12, extra=[13])
    with pytest.raises(ValueError, match="k=0"):
        default_ks(12, extra=[0])
    with pytest.raises(ValueError):
        default_ks(0)


# --------------------------------------------------------------------------------------------
# maj@k
# --------------------------------------------------------------------------------------------


def test_maj_at_k_hand_values() -> None:
    answers = ["a", "a", "b", None]
    correct = [True, True, False, False]
    # k=1: the drawn sample's answer wins; 'a' in 2 of 4 draws
    assert maj_at_k(answers, correct, 1) == pytest.approx(0.5, abs=EXACT)
    # k=2, the 6 pairs: {a,a}:1 {a1,b}:1/2 {a1,N}:1 {a2,b}:1/2 {a2,N}:1 {b,N}:0 -> 4/6
    assert maj_at_k(answers, correct, 2) == pytest.approx(2 / 3, abs=EXACT)
    # k=3, the 4 triples: {a,a,b}:1 {a,a,N}:1 {a1,b,N}:1/2 {a2,b,N}:1/2 -> 3/4
    assert maj_at_k(answers, correct, 3) == pytest.approx(0.75, abs=EXACT)
    # k=4: 'a' has 2 votes, 'b' 1, None does not vote -> 1
    assert maj_at_k(answers, correct, 4) == pytest.approx(1.0, abs=EXACT)


def test_maj_at_k_none_never_wins() -> None:
    # three Nones outnumber one correct answer, but Nones are not votes
    assert maj_at_k([None, None, None, "x"], [False, False, False, True], 4) == 1.0
    assert maj_at_k([None, None], [False, False], 1) == 0.0
    assert maj_at_k([None, None], [False, False], 2) == 0.0
    assert _maj_at_k_dp([None, None], [False, False], 2) == 0.0


def test_maj_at_k_full_tie_is_split_uniformly() -> None:
    # one correct and two wrong answers each with one vote: winner is uniform over three
    answers = ["a", "b", "c"]
    assert maj_at_k(answers, [True, False, False], 3) == pytest.approx(1 / 3, abs=EXACT)
    assert _maj_at_k_dp(answers, [True, False, False], 3) == pytest.approx(1 / 3, abs=EXACT)


def test_maj_at_k_inconsistent_correctness_uses_answer_fraction() -> None:
    # the same answer judged correct once and wrong once -> the answer counts as 1/2 correct
    assert maj_at_k(["a", "a"], [True, False], 1) == pytest.approx(0.5, abs=EXACT)
    assert maj_at_k(["a", "a"], [True, False], 2) == pytest.approx(0.5, abs=EXACT)


def test_maj_at_k_validates_input() -> None:
    with pytest.raises(ValueError, match="same length"):
        maj_at_k(["a", "b"], [True], 1)
    with pytest.raises(ValueError, match="k=3"):
        maj_at_k(["a", "b"], [True, False], 3)
    with pytest.raises(ValueError, match="k=0"):
        maj_at_k(["a", "b"], [True, False], 0)


def _random_case(rng: random.Random, n: int) -> tuple[list[str | None], list[bool]]:
    pool: list[str | None] = [None, "1", "2", "3", "4"][: rng.randint(1, 5)]
    answers = [rng.choice(pool) for _ in range(n)]
    if rng.random() < 0.8:
        truth = rng.choice(["1", "2", "3"])
        correct = [a == truth for a in answers]
    else:
        correct = [rng.random() < 0.5 for _ in answers]
    return answers, correct


def test_maj_at_k_matches_brute_force_small_n() -> None:
    rng = random.Random(1234)
    for _ in range(150):
        n = rng.randint(1, 6)
        answers, correct = _random_case(rng, n)
        for k in range(1, n + 1):
            expected = brute_maj_at_k(answers, correct, k)
            assert maj_at_k(answers, correct, k) == pytest.approx(expected, abs=EXACT)
            # the dynamic programme used for large C(n, k) gives the same value
            assert _maj_at_k_dp(answers, correct, k) == pytest.approx(expected, abs=EXACT)


def test_maj_at_k_fast_path_matches_brute_force() -> None:
    # C(14, 7) = 3432 subsets: beyond the enumeration limit, so maj_at_k uses the DP.
    rng = random.Random(7)
    for _ in range(3):
        answers, correct = _random_case(rng, 14)
        for k in (5, 7, 9):
            expected = brute_maj_at_k(answers, correct, k)
            assert maj_at_k(answers, correct, k) == pytest.approx(expected, abs=EXACT)


def test_maj_at_k_large_n_is_finite_and_bounded() -> None:
    rng = random.Random(0)
    answers = [rng.choice(["a", "b", "c", None]) for _ in range(256)]
    correct = [a == "a" for a in answers]
    values = [maj_at_k(answers, correct, k) for k in (1, 16, 256)]
    assert all(0.0 <= v <= 1.0 for v in values)
    # k=1 is the fraction of samples answering 'a'
    assert values[0] == pytest.approx(answers.count("a") / 256, abs=1e-10)


# --------------------------------------------------------------------------------------------
# bootstrap
# --------------------------------------------------------------------------------------------


def test_bootstrap_ci_is_deterministic_and_contains_mean() -> None:
    rng = np.random.default_rng(0)
    values = rng.random(200).tolist()
    a = bootstrap_ci(values, resamples=500, seed=3)
    b = bootstrap_ci(values, resamples=500, seed=3)
    c = bootstrap_ci(values, resamples=500, seed=4)
    assert a == b
    assert a != c
    lo, hi = a
    assert lo < float(np.mean(values)) < hi
    assert isinstance(lo, float) and isinstance(hi, float)


def test_bootstrap_ci_width_matches_normal_approximation() -> None:
    # 400 problems with pass rate 1/2: standard error 0.025, 95% interval about +-0.049
    values = [1.0, 0.0] * 200
    lo, hi = bootstrap_ci(values, resamples=2000, seed=0)
    assert lo == pytest.approx(0.5 - 1.96 * 0.025, abs=0.008)
    assert hi == pytest.approx(0.5 + 1.96 * 0.025, abs=0.008)
    # a narrower level gives a narrower interval
    lo90, hi90 = bootstrap_ci(values, resamples=2000, seed=0, alpha=0.1)
    assert lo < lo90 < hi90 < hi


def test_bootstrap_ci_constant_values() -> None:
    assert bootstrap_ci([0.25] * 10, resamples=50, seed=0) == (0.25, 0.25)


def test_bootstrap_ci_validates_input() -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([], resamples=10, seed=0)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], resamples=0, seed=0)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], resamples=10, seed=0, alpha=1.5)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, float("nan")], resamples=10, seed=0)


# --------------------------------------------------------------------------------------------
# ProblemSamples / summarize
# --------------------------------------------------------------------------------------------


def _problems() -> list[ProblemSamples]:
    p1 = ProblemSamples.from_rewards(
        "p1", "math", [1.0, 0.0, 0.0, 1.0], ["4", "3", None, "4"], [10, 20, 30, 40]
    )
    p2 = ProblemSamples.from_rewards(
        "p2", "gsm8k", [0.0, 0.0, 0.0, 0.0], ["1", "1", "2", None], [5, 5, 5, 5]
    )
    return [p1, p2]


def test_from_rewards_threshold() -> None:
    p = ProblemSamples.from_rewards("p", "s", [0.0, 0.5, 0.51, 1.0], [None] * 4, [1] * 4)
    assert p.correct == [False, False, True, True]
    assert p.n == 4
    q = ProblemSamples.from_rewards("p", "s", [0.2, 0.4], [None] * 2, [1] * 2, threshold=0.3)
    assert q.correct == [False, True]


def test_problem_samples_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="response_lengths"):
        ProblemSamples("p", "s", [1.0, 0.0], [True, False], ["a", "b"], [1])
    with pytest.raises(ValueError, match="no samples"):
        ProblemSamples("p", "s", [], [], [], [])


def test_summarize_hand_built() -> None:
    out = summarize(_problems(), bootstrap_resamples=1000, seed=0)
    assert list(out) == [
        "n",
        "num_problems",
        "pass@1",
        "pass@2",
        "pass@4",
        "mean@4",
        "maj@1",
        "maj@2",
        "maj@4",
        "response_length/mean",
        "pass@1_ci95",
        "mean@4_ci95",
    ]
    assert out["n"] == 4 and out["num_problems"] == 2
    # p1: c=2 of 4; p2: c=0
    assert out["pass@1"] == pytest.approx((0.5 + 0.0) / 2, abs=EXACT)
    # p1 pass@2 = 1 - C(2,2)/C(4,2) = 5/6
    assert out["pass@2"] == pytest.approx((5 / 6) / 2, abs=EXACT)
    assert out["pass@4"] == pytest.approx(0.5, abs=EXACT)
    assert out["mean@4"] == pytest.approx(0.25, abs=EXACT)
    # p1 has the structure of test_maj_at_k_hand_values ('4' correct twice, '3' wrong, None);
    # p2 never has a correct answer
    assert out["maj@1"] == pytest.approx(0.5 / 2, abs=EXACT)
    assert out["maj@2"] == pytest.approx((2 / 3) / 2, abs=EXACT)
    assert out["maj@4"] == pytest.approx(1.0 / 2, abs=EXACT)
    assert out["response_length/mean"] == pytest.approx((100 + 20) / 8, abs=EXACT)
    # per-problem pass@1 values are {0.5, 0}: resampled means lie in {0, 0.25, 0.5}
    assert out["pass@1_ci95"] == [0.0, 0.5]
    assert out["mean@4_ci95"] == [0.0, 0.5]
    # deterministic
    assert summarize(_problems(), bootstrap_resamples=1000, seed=0) == out


def test_summarize_custom_ks() -> None:
    out = summarize(_problems(), ks=[3, 1, 3], bootstrap_resamples=10, seed=0)
    assert [k for k in out if k.startswith("pass@") and not k.endswith("ci95")] == [
        "pass@1",
        "pass@3",
    ]
    # p1: 1 - C(2,3)/C(4,3) = 1 - 0 = 1
    assert out["pass@3"] == pytest.approx(0.5, abs=EXACT)
    with pytest.raises(ValueError, match="k=5"):
        summarize(_problems(), ks=[5], bootstrap_resamples=10, seed=0)


def test_summarize_rejects_mixed_n_and_empty() -> None:
    p3 = ProblemSamples.from_rewards("p3", "math", [1.0, 0.0], ["1", "2"], [1, 1])
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([*_problems(), p3], bootstrap_resamples=10, seed=0)
    with pytest.raises(ValueError):
        summarize([], bootstrap_resamples=10, seed=0)


def test_summarize_by_data_source() -> None:
    problems = _problems()
    out = summarize_by(problems, bootstrap_resamples=100, seed=0)
    assert list(out) == ["gsm8k", "math"]
    assert out["math"] == summarize([problems[0]], bootstrap_resamples=100, seed=0)
    assert out["gsm8k"]["pass@1"] == 0.0
    assert out["math"]["pass@1"] == pytest.approx(0.5, abs=EXACT)
    assert list(summarize_by(problems, key="prompt_id", bootstrap_resamples=10, seed=0)) == [
        "p1",
        "p2",
    ]
    with pytest.raises(ValueError, match="key"):
        summarize_by(problems, key="rewards", bootstrap_resamples=10, seed=0)
