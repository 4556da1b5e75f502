"""Recall rules of the math verifier: where a final answer stands in a response,
how it is spelled, and how relations, ratios and intervals compare. Every rule has its
near-miss negative next to it, and the labelled sets hold the whole verifier to its figures:
no false positive anywhere, and the recall measured in benchmarks/verify_accuracy.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.verify.math import compute_score, extract_answer, is_equivalent, normalize_answer

DATA = Path(__file__).resolve().parents[1] / "data"

# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "answer", "rule"),
    [
        # an answer label, its value on the next line, a trailing remark dropped
        ("work\n\nAnswer: $ 9 $", "9", "answer_label"),
        ("work\n\n**Final answer:**\n\\[ 9 \\]", "9", "answer_phrase"),
        ("Answer: 8 outcomes (out of the 36 possible)", "8 outcomes", "answer_label"),
        # a last line that is only a value, or an equation
        ("We solve it.\n\n$$f'(x) = 3x^2 - 4x$$", "f'(x) = 3x^2 - 4x", "last_line"),
        ("so\n42", "42", "last_line"),
        # a conclusion line
        ("Hence the remainder is 3.", "3", "conclusion"),
        # a last sentence that ends in math
        ("So the lines intersect at $(x, y) = (1, 3)$.", "(x, y) = (1, 3)", "final_sentence"),
        ("Factor it. So $x = 2$ or $x = 3$.", "x = 2, x = 3", "final_sentence"),
        ("So the other leg has length $b \\approx 11$.", "b \\approx 11", "final_sentence"),
        ("The area is $24$ square units.", "24", "final_sentence"),
        ("Solving:\n$$\nx = 7\n$$", "x = 7", "last_line"),
        # a last sentence that states a value in words
        ("The minimum value is −7.", "−7", "final_sentence"),
        ("So there are 10000 combinations.", "10000 combinations", "final_sentence"),
        ("The possible values are 9, 4, and 1.", "9, 4, 1", "final_sentence"),
        ("The ratio of boys to girls is 3 to 4.", "3 to 4", "final_sentence"),
        ("The range is all y ≥ 2.", "y ≥ 2", "final_sentence"),
        ("The percent increase is 12%.", "12%", "final_sentence"),
        # chat-template debris ends the response
        ("the solution is $x < 4$.<|im_end|>\n<|im_start|>user\nnext", "x < 4", "final_sentence"),
    ],
)
def test_extraction_recall_rules(text: str, answer: str, rule: str) -> None:
    assert extract_answer(text) == (answer, rule)


@pytest.mark.parametrize(
    "text",
    [
        # math in the middle of a sentence that goes on is not a conclusion
        "Next we substitute $x = 5$ into the second equation and simplify it.",
        "We need to find $x$ first, then check that 12 is in range.",
        "Let me think about this problem step by step",
    ],
)
def test_extraction_declines_non_conclusions(text: str) -> None:
    answer, _ = extract_answer(text)
    assert answer is None or answer == "x"


# ------------------------------------------------------------------------- normalization


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("−7", "-7"),
        ("2π", "2\\pi"),
        ("[2, oo)", "[2,\\infty)"),
        ("x ∈ [1, 2]", "x\\in[1,2]"),
        ("1 \\colon 2 \\colon 3", "1:2:3"),
        ("2:4:6", "1:2:3"),
        ("0.5:1:1.5", "1:2:3"),
        ("3 to 4", "\\frac{3}{4}"),
        ("\\mathbb{R}", "(-\\infty,\\infty)"),
        ("\\text{all real numbers}", "(-\\infty,\\infty)"),
        ("\\cfrac{2}{3}", "\\frac{2}{3}"),
        ("x \\gt 5", "x>5"),
        ("]1, 2]", "(1,2]"),
        ("[1, 2[", "[1,2)"),
    ],
)
def test_normalization_recall(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # an equation's stated value, for a truth that is not an equation
        ("2^{10} = 1024", "1024", True),
        ("2^{10} = 1025", "1024", False),
        ("\\frac{4}{6} = \\frac{2}{3}", "\\frac{2}{3}", True),
        ("(x, y) = (1, 3)", "(1, 3)", True),
        ("(x, y) = (3, 1)", "(1, 3)", False),
        ("f'(x) = 5 - 4x + 3x^2", "3x^2 - 4x + 5", True),
        ("f'(x) = 5 + 4x + 3x^2", "3x^2 - 4x + 5", False),
        ("7 = x", "7", True),
        ("b \\approx 11", "11", True),
        ("b \\approx 11", "12", False),
        # an equation truth is compared as an equation
        ("y = 2x + 3", "y = 2x + 3", True),
        ("y = 2x + 4", "y = 2x + 3", False),
        # lists of equations against sets and pairs
        ("x = 2, x = 3", "\\{2, 3\\}", True),
        ("x = 2, x = 3", "3", False),
        ("x = -1, y = 2", "(-1, 2)", True),
        ("x = 2, y = -1", "(-1, 2)", False),
        # chains, set-builder, complements
        ("3 > x > -2", "-2 < x < 3", True),
        ("3 \\ge x > -2", "(-2, 3]", True),
        ("3 > x > -2", "[-2, 3)", False),
        ("\\{x \\mid x < 1\\}", "x < 1", True),
        ("\\{x : x \\ge 1\\}", "[1, \\infty)", True),
        ("\\{x \\mid x < 1\\}", "x \\le 1", False),
        ("[0, \\infty) \\setminus \\{1\\}", "[0, 1) \\cup (1, \\infty)", True),
        ("[0, \\infty) \\setminus \\{0\\}", "(0, \\infty)", True),
        ("[0, \\infty) \\setminus \\{2\\}", "[0, 1) \\cup (1, \\infty)", False),
        ("\\mathbb{R} \\setminus \\{0\\}", "(-\\infty, 0) \\cup (0, \\infty)", True),
        ("x \\neq 1", "(-\\infty, 1) \\cup (1, \\infty)", True),
        ("x \\neq 1", "(-\\infty, 1) \\cup (1, 2)", False),
        ("\\text{all real numbers}", "(-\\infty, \\infty)", True),
        ("x \\in \\mathbb{R}", "(-\\infty, \\infty)", True),
        # ratios: their value, in any number of parts; reversed is wrong
        ("3 to 4", "3:4", True),
        ("6:8", "3:4", True),
        ("4:3", "3:4", False),
        ("1 \\colon 2 \\colon 3", "1:2:3", True),
        ("2:4:6", "1:2:3", True),
        ("1:3:2", "1:2:3", False),
        # intervals from inequalities; endpoints matter
        ("1 < x \\le 2", "(1, 2]", True),
        ("1 \\le x \\le 2", "(1, 2]", False),
        ("y ≥ 2", "[2, \\infty)", True),
        ("[2, oo)", "[2, \\infty)", True),
        ("(2, oo)", "[2, \\infty)", False),
        # unicode and text spellings
        ("−7", "-7", True),
        ("−7", "7", False),
        ("2√3", "2\\sqrt{3}", True),
        ("9, 4, 1", "\\{1, 4, 9\\}", True),
        ("9, 4", "\\{1, 4, 9\\}", False),
        ("\\varnothing", "\\emptyset", True),
    ],
)
def test_equivalence_recall(pred: str, gt: str, expected: bool) -> None:
    assert is_equivalent(pred, gt) is expected


@pytest.mark.parametrize(
    ("response", "gt", "score"),
    [
        ("Answer: 8 outcomes (out of the 36 possible)", "8", 1.0),
        ("Answer: 9 outcomes (out of the 36 possible)", "8", 0.0),
        ("Therefore the probability is $\\cfrac{4}{6} = \\cfrac{2}{3}$.", "\\frac{2}{3}", 1.0),
        ("Therefore the probability is $\\cfrac{4}{6} = \\cfrac{1}{3}$.", "\\frac{2}{3}", 0.0),
        ("So there are 10000 combinations.", "10,\\!000", 1.0),
        ("So there are 1000 combinations.", "10,\\!000", 0.0),
        # two answers where one is asked for: never rewarded
        ("The answer could be $3$ or $5$.", "5", 0.0),
        ("So $x = 2$ and $y = 5$.", "5", 0.0),
    ],
)
def test_responses_recall(response: str, gt: str, score: float) -> None:
    assert compute_score(response, gt)["score"] == score


# ------------------------------------------------------------------- labelled data sets


def _load(name: str) -> list[dict]:
    with (DATA / name).open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize(
    ("name", "min_accuracy"),
    [
        # written before the recall work, from the families the issue names
        ("math_recall.jsonl", 0.97),
        # written independently of the verifier's code; used while developing the rules
        ("math_heldout_v1.jsonl", 0.95),
        # written independently after the rules were fixed and never tuned on (first and
        # only measurement: 0.968, math-verify 0.850)
        ("math_heldout.jsonl", 0.95),
        # the written-forms set: written after its rules were fixed and committed before it was scored
        # (first and only measurement: 0.972, 0 FP; math-verify 0.866, 4 FP)
        ("math_heldout_v2.jsonl", 0.95),
    ],
)
def test_labelled_sets(name: str, min_accuracy: float) -> None:
    rows = _load(name)
    false_pos, false_neg = [], []
    for r in rows:
        got = compute_score(r["response"], r["ground_truth"])["score"] == 1.0
        if got and not r["label"]:
            false_pos.append(r)
        elif r["label"] and not got:
            false_neg.append(r)
    accuracy = 1 - (len(false_pos) + len(false_neg)) / len(rows)
    # a reward for a wrong answer is what RL exploits: none is allowed
    assert not false_pos, [(r["ground_truth"], r["response"][-120:]) for r in false_pos]
    assert accuracy >= min_accuracy, [(r["ground_truth"], r["response"][-120:]) for r in false_neg]
