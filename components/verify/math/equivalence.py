"""Equivalence of two normalized answers, cheapest test first; `compute_score`."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from components.verify.math.extract import extract_answer
from components.verify.math.normalize import normalize_answer
from components.verify.math.numbers import _numbers_equal, _to_number
from components.verify.math.structure import (
    _CHOICE_RE,
    _equation_value,
    _inequality_to_interval,
    _parse_struct,
    _strip_equation_lhs,
    _struct_equal,
)
from components.verify.math.symbolic import (
    _FUNCS,
    _GREEK,
    _parse_sympy,
    _sympy_equal,
    linear_inequality_interval,
)

# Answers longer than this are compared by exact (stripped) string only: nothing real is
# that long, and it keeps the regex work bounded for degenerate outputs.
MAX_ANSWER_LEN = 2000


_WORD_RE = re.compile(r"[A-Za-z][A-Za-z ]*")


@lru_cache(maxsize=65536)
def _equivalent_normalized(pred: str, gt: str) -> bool:
    """Pure comparison of two normalized answers (memoized)."""
    if pred == gt:
        return True
    if not pred or not gt:
        return False
    # multiple-choice letters: "(B)" == "B"
    mg = _CHOICE_RE.fullmatch(gt)
    if mg:
        mp = _CHOICE_RE.fullmatch(pred)
        if mp:
            return mp.group(1) == mg.group(1)
    # plain words ("Monday", "no solution"): case-insensitive; a real word never needs sympy
    if _WORD_RE.fullmatch(gt):
        if pred.lower() == gt.lower():
            return True
        if len(gt) >= 3 and gt not in _FUNCS and gt not in _GREEK:
            return False
    # numbers
    gn = _to_number(gt)
    pn = _to_number(pred)
    if gn is not None and pn is not None:
        return _numbers_equal(pn, gn)
    # inequalities become intervals (solved when linear in one variable: -x>-1 is x<1)
    pi_, gi = _to_interval(pred), _to_interval(gt)
    if pi_ != pred or gi != gt:
        return _equivalent_normalized(pi_, gi)
    # tuples, intervals, sets
    gs = _parse_struct(gt)
    ps = _parse_struct(pred)
    if gs is not None or ps is not None:
        if gs is not None and ps is not None:
            return _struct_equal(ps, gs, _element_equal)
        # a one-element set on either side against a scalar: {3} == 3
        if gs is not None and gs[0] == "set" and len(gs[1]) == 1:
            return _element_equal(pred, gs[1][0])
        if ps is not None and ps[0] == "set" and len(ps[1]) == 1:
            return _element_equal(ps[1][0], gt)
        return False
    return _sympy_equal(pred, gt)


def _to_interval(s: str) -> str:
    interval = _inequality_to_interval(s)
    if interval == s and any(op in s for op in "<>≤≥"):
        interval = linear_inequality_interval(s) or s
    return interval


def _is_equation(s: str) -> bool:
    return s.count("=") == 1 and "≤" not in s and "≥" not in s


def is_equivalent(response_answer: str, ground_truth: str) -> bool:
    """True when an extracted response answer is equivalent to the ground truth.

    The ground truth is read leniently (a ``\\boxed{}`` or GSM8K ``####`` wrapper is
    unwrapped, ``x=3`` counts as ``3``); the response answer strictly (``3, 4`` or
    ``3 or 4`` never equals ``3``), except that ``x = 3`` is accepted for ``3``.
    """
    if len(response_answer) > MAX_ANSWER_LEN or len(ground_truth) > MAX_ANSWER_LEN:
        return response_answer.strip() == ground_truth.strip()
    gt = ground_truth
    if "####" in gt:
        ans, _ = extract_answer(gt)
        gt = ans if ans is not None else gt
    try:
        pred, gold = normalize_answer(response_answer), normalize_answer(gt)
        # "x = 3" counts as 3, unless the other side is an equation too: then the two
        # equations are compared as equations (y = 2x + 1 is 2x - y + 1 = 0)
        pred, gold = (
            pred if _is_equation(gold) else _equation_value(pred),
            gold if _is_equation(pred) else _strip_equation_lhs(gold),
        )
        return _equivalent_normalized(pred, gold)
    except (RecursionError, OverflowError, ZeroDivisionError, ValueError):
        # pathological nesting or magnitudes: not a recognisable correct answer
        return False


def compute_score(
    solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Score one response against a ground truth (verl argument names).

    Returns ``{"score": 1.0 | 0.0, "extracted_answer": str | None, "rule": str | None}``.
    ``extra_info`` is accepted for signature compatibility and not used. A list/tuple
    ground truth counts as correct if any element matches.
    """
    answer, rule = extract_answer(solution_str or "")
    if answer is None:
        return {"score": 0.0, "extracted_answer": None, "rule": None}
    truths = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    ok = any(is_equivalent(answer, str(gt)) for gt in truths)
    return {"score": 1.0 if ok else 0.0, "extracted_answer": answer, "rule": rule}


def _element_equal(pred: str, gt: str) -> bool:
    return _equivalent_normalized(_strip_equation_lhs(pred), _strip_equation_lhs(gt))


def clear_caches() -> None:
    """Empty the memoization caches (for benchmarks and tests)."""
    normalize_answer.cache_clear()
    _equivalent_normalized.cache_clear()
    _parse_sympy.cache_clear()
    linear_inequality_interval.cache_clear()
