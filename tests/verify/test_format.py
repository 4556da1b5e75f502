"""Tests for the format reward, DAPO's soft overlong penalty and TRL-style reward plugins."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from components.verify.executor import ScoreItem, score_batch
from components.verify.format import format_score, soft_overlong_penalty
from components.verify.rewards import (
    PluginVerifier,
    TRLPluginVerifier,
    get_verifier,
    load_plugin,
    resolve_verifier,
)

# --------------------------------------------------------------------------- format_score


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("<think>2 + 2</think><answer>4</answer>", "4"),
        ("  <think>\nhalf of 1\n</think>\nSo $\\boxed{\\frac{1}{2}}$.\n", "\\frac{1}{2}"),
        ("<think></think> <answer> x = 3 </answer>", "x = 3"),
        ("<think>a</think> first \\boxed{1}, finally \\boxed{2}", "2"),
    ],
)
def test_format_accepted(response: str, answer: str) -> None:
    assert format_score(response) == {"score": 1.0, "extracted_answer": answer}


@pytest.mark.parametrize(
    "response",
    [
        "",
        "<answer>4</answer>",  # no reasoning block
        "Sure! <think>x</think><answer>4</answer>",  # something before <think>
        "<think>x</think><think>y</think><answer>4</answer>",  # two blocks
        "<think>x<answer>4</answer>",  # never closed
        "<think>x</think> the answer is 4",  # no marked answer
        "<think>\\boxed{4}</think> done",  # boxed only inside the reasoning
        "<think>x</think><answer>  </answer>",  # empty answer
        "<think>x</think><answer>1</answer><answer>2</answer>",  # two answers
        "<think>x</think><answer>4",  # answer not closed
        "<think>x</think> \\boxed{4",  # unbalanced box
    ],
)
def test_format_rejected(response: str) -> None:
    assert format_score(response)["score"] == 0.0


def test_format_custom_pattern() -> None:
    pattern = r"Answer: (\d+)"
    assert format_score(" Answer: 12\n", pattern=pattern) == {
        "score": 1.0,
        "extracted_answer": "12",
    }
    assert format_score("Answer: 12 apples", pattern=pattern)["score"] == 0.0
    # from extra_info when no pattern is passed; no group -> no extracted answer
    assert format_score("DONE", None, {"format_pattern": "DONE|OK"}) == {
        "score": 1.0,
        "extracted_answer": None,
    }


def test_format_is_registered() -> None:
    assert get_verifier("format") is format_score
    assert resolve_verifier("format")("ds", "<think>a</think><answer>b</answer>", "", None) == {
        "score": 1.0,
        "extracted_answer": "b",
    }


# ------------------------------------------------------------------ soft_overlong_penalty


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (16, 0.0),
        (17, -0.25),
        (18, -0.5),
        (19, -0.75),
        (20, -1.0),
        (21, -1.0),
        (500, -1.0),
    ],
)
def test_soft_overlong_penalty(length: int, expected: float) -> None:
    # max_length 20, buffer 4: free up to 16, then -1/4 per token, -1 at 20 and beyond
    assert soft_overlong_penalty(length, max_length=20, buffer=4) == pytest.approx(expected)


def test_soft_overlong_penalty_dapo_hand_values() -> None:
    # Lmax = 10, Lc = 4 -> free up to 6; 7 -> (6 - 7)/4 = -0.25; 10 -> -1; 12 -> -1
    out = [soft_overlong_penalty(n, max_length=10, buffer=4) for n in (5, 6, 7, 10, 12)]
    assert out == pytest.approx([0.0, 0.0, -0.25, -1.0, -1.0], abs=1e-12)
    # 0.5 * 2/4
    assert soft_overlong_penalty(8, max_length=10, buffer=4, penalty=0.5) == pytest.approx(-0.25)
    # a fractional ramp: (6 - 7)/3 with max_length 9, buffer 3
    assert soft_overlong_penalty(7, max_length=9, buffer=3) == pytest.approx(-1 / 3)


def test_soft_overlong_penalty_scaled_and_edge_cases() -> None:
    assert soft_overlong_penalty(18, max_length=20, buffer=4, penalty=0.5) == pytest.approx(-0.25)
    assert soft_overlong_penalty(3, max_length=10, buffer=10) == pytest.approx(-0.3)
    # buffer 0: a plain step at max_length
    assert soft_overlong_penalty(20, max_length=20, buffer=0) == 0.0
    assert soft_overlong_penalty(21, max_length=20, buffer=0) == -1.0
    assert soft_overlong_penalty(21, max_length=20, buffer=0, penalty=0.0) == 0.0
    for kwargs in (
        {"max_length": 0, "buffer": 0},
        {"max_length": 10, "buffer": 11},
        {"max_length": 10, "buffer": -1},
        {"max_length": 10, "buffer": 2, "penalty": -1.0},
    ):
        with pytest.raises(ValueError):
            soft_overlong_penalty(5, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        soft_overlong_penalty(-1, max_length=10, buffer=2)


# --------------------------------------------------------------------------- TRL plugins

PLUGINS = textwrap.dedent(
    """
    def verl_style(data_source, solution_str, ground_truth, extra_info):
        return float(solution_str.strip() == ground_truth)


    def trl_length(completions, **kwargs):
        return [float(len(c)) for c in completions]


    def trl_columns(prompts, completions, ground_truth, data_source, difficulty, **kwargs):
        return [
            float(c.strip() == g) + (0.5 if p == "q" and s == "ds" and d == 3 else 0.0)
            for p, c, g, s, d in zip(prompts, completions, ground_truth, data_source, difficulty)
        ]


    def trl_narrow(completions, ground_truth):
        # no **kwargs: other columns must not be passed
        return [float(c == g) for c, g in zip(completions, ground_truth)]


    def trl_none(completions, **kwargs):
        return [None for _ in completions]


    def trl_too_many(completions, **kwargs):
        return [1.0, 2.0]


    def trl_nan(completions, **kwargs):
        return [float("nan")]


    def only_kwargs(**kwargs):
        return [0.25 * len(kwargs["completions"])]
    """
)


@pytest.fixture()
def plugins(tmp_path: Path) -> str:
    path = tmp_path / "trl_rewards.py"
    path.write_text(PLUGINS)
    return str(path)


def test_signature_detection(plugins: str) -> None:
    verl = load_plugin(f"{plugins}:verl_style")
    assert type(verl) is PluginVerifier
    assert verl("4", "4") == {"score": 1.0, "extracted_answer": None}
    trl = load_plugin(f"{plugins}:trl_length")
    assert isinstance(trl, TRLPluginVerifier)
    assert trl("abcd", "gt") == {"score": 4.0, "extracted_answer": None}
    assert isinstance(load_plugin(f"{plugins}:trl_columns"), TRLPluginVerifier)  # prompts first
    # TRL calls by keyword; a function taking only **kwargs needs the signature spelled out
    assert type(load_plugin(f"{plugins}:only_kwargs")) is PluginVerifier
    assert load_plugin(f"{plugins}:only_kwargs", signature="trl")("x", "y")["score"] == 0.25
    with pytest.raises(ValueError, match="signature"):
        load_plugin(f"{plugins}:trl_length", signature="openai")  # type: ignore[arg-type]


def test_trl_columns_are_passed(plugins: str) -> None:
    fn = load_plugin(f"{plugins}:trl_columns")
    extra = {"prompt": "q", "difficulty": 3, "data_source": "ds"}
    assert fn(" 42 ", "42", extra)["score"] == 1.5
    assert fn("41", "42", extra, data_source="other")["score"] == 0.0
    narrow = load_plugin(f"{plugins}:trl_narrow")
    assert narrow("42", "42", {"prompt": "q", "difficulty": 3})["score"] == 1.0


def test_trl_bad_results_are_errors(plugins: str) -> None:
    with pytest.raises(ValueError, match="returned None"):
        load_plugin(f"{plugins}:trl_none")("x", "y")
    with pytest.raises(ValueError, match="one score per completion"):
        load_plugin(f"{plugins}:trl_too_many")("x", "y")
    with pytest.raises(ValueError, match="finite"):
        load_plugin(f"{plugins}:trl_nan")("x", "y")


def test_trl_plugin_in_score_batch(plugins: str) -> None:
    items = [
        ScoreItem(f"{plugins}:trl_length", "ds", "abc", "gt"),
        ScoreItem(f"{plugins}:trl_none", "ds", "abc", "gt"),
        ScoreItem(f"{plugins}:verl_style", "ds", "gt", "gt"),
    ]
    results = score_batch(items, num_workers=1, timeout_s=10)
    assert results[0].reward == 3.0 and results[0].error is None
    assert results[1].reward == 0.0 and "returned None" in (results[1].error or "")
    assert results[2].reward == 1.0
