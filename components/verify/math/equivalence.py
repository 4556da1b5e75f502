"""Equivalence of two normalized answers, cheapest test first; `compute_score`."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from components.verify.math.extract import extract_answer
from components.verify.math.latex import FUNCS, GREEK
from components.verify.math.normalize import normalize_answer
from components.verify.math.numbers import _DEC_RE, REL_TOL, _numbers_equal, _to_number
from components.verify.math.structure import (
    _CHOICE_RE,
    _SIMPLE_LHS_RE,
    _assignment_struct,
    _assignments,
    _assignments_equal,
    _equation_value,
    _inequality_to_interval,
    _label_value,
    _parse_struct,
    _split_top,
    _strip_equation_lhs,
    _struct_equal,
)
from components.verify.math.symbolic import (
    _eval_complex,
    _parse_sympy,
    _sympy_equal,
    linear_inequality_interval,
)

# Answers longer than this are compared by exact (stripped) string only: nothing real is
# that long, and it keeps the regex work bounded for degenerate outputs.
MAX_ANSWER_LEN = 2000


_WORD_RE = re.compile(r"[A-Za-z][A-Za-z ]*")
_APPROX_ASIDE_RE = re.compile(r"(.+)\(≈([^()]+)\)")


@lru_cache(maxsize=65536)
def _equivalent_normalized(pred: str, gt: str) -> bool:
    """Pure comparison of two normalized answers (memoized)."""
    if not pred or not gt:
        return False
    if pred == gt:
        return True
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
        if len(gt) >= 3 and gt not in FUNCS and gt not in GREEK:
            return False
    # numbers
    gn = _to_number(gt)
    pn = _to_number(pred)
    if gn is not None and pn is not None:
        return _numbers_equal(pn, gn)
    # inequalities become intervals (solved when linear in one variable: -x>-1 is x<1)
    pi_, gi = _to_interval(pred), _to_interval(gt)
    if pi_ != pred or gi != gt:
        # a range in the truth (0<y<1) is not two values (0,1 or "0 and 1") in the response
        bare = _parse_struct(pred) if gi != gt and pi_ == pred else None
        if bare is not None and bare[0] == "list":
            return False
        return _equivalent_normalized(pi_, gi)
    # named values: x=3,y=2 is the pair (3,2); a=1,b=2;a=3,b=4 the set of two solutions
    ga, pa = _assignments(gt), _assignments(pred)
    if ga is not None:
        if pa is not None:
            return _assignments_equal(pa, ga, _element_equal)
        return _equivalent_normalized(pred, _assignment_struct(ga))
    if pa is not None and len(pa) > 1:
        return _equivalent_normalized(_assignment_struct(pa), gt)
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
    if not gt.strip():
        return False  # an empty ground truth is no answer: nothing matches it
    if "####" in gt:
        ans, _ = extract_answer(gt)
        gt = ans if ans is not None else gt
    try:
        pred, gold = normalize_answer(response_answer), normalize_answer(gt)
        if not pred or not gold:
            return False
        # "7/4 ≈ 1.75" states 7/4 (a wrong approximation makes it wrong); "x ≈ 11" states 11
        pred, gold = _approx_value(pred, check=True), _approx_value(gold, check=False)
        if pred is None or gold is None:
            return False
        # "x = 3" counts as 3, unless the other side is an equation too: then the two
        # equations are compared as equations (y = 2x + 1 is 2x - y + 1 = 0). A ground
        # truth that labels its value (|PQ| = 4, (x, y) = (3, 2)) states the value.
        pred, gold = (
            pred if _is_equation(gold) else _renormalize(pred, _equation_value(pred)),
            gold
            if _is_equation(pred)
            else _renormalize(gold, _label_value(_strip_equation_lhs(gold))),
        )
        return _equivalent_normalized(pred, gold)
    except (RecursionError, OverflowError, ZeroDivisionError, ValueError):
        # pathological nesting or magnitudes: not a recognisable correct answer
        return False


def _renormalize(before: str, after: str) -> str:
    """A side of an equation, normalized as an answer of its own (``3:7`` is a ratio)."""
    return after if after == before else normalize_answer(after)


def _approx_value(s: str, check: bool) -> str | None:
    """What ``a ≈ b`` states: the exact value ``a`` (``\\frac{7}{4}≈1.75``; ``x=\\frac{7}{4}≈1.75``
    is ``x=\\frac{7}{4}``), or ``b`` when ``a`` is only a name (``x≈11``, ``≈11``). With
    ``check`` (a response), an approximation that is not its value rounded or truncated
    (``\\frac{7}{5}≈1.75``) makes the answer wrong: None."""
    if "≈" not in s:
        return s
    m = _APPROX_ASIDE_RE.fullmatch(s)
    if m:  # \frac{7}{4}(≈1.75): the approximation as an aside
        s = f"{m.group(1)}≈{m.group(2)}"
    items = _split_top(s, ",")
    if len(items) > 1:  # x≈1.2,x≈3.4: each element states its own value
        values = [_approx_value(item, check) for item in items]
        return None if None in values else ",".join(v for v in values if v is not None)
    parts = _split_top(s, "≈")
    head, tail = parts[0], parts[-1]
    if not head or (_SIMPLE_LHS_RE.fullmatch(head) and _numeric_value(head) is None):
        return tail or None  # a name (x, \\theta), not a constant (\\pi, e)
    if tail and _label_value(f"{head}={tail}") == tail and _numeric_value(head) is None:
        return tail  # a label (AB, |PQ|, P(A), \\angle A): its value, never the label itself
    if check:
        exact, approx = _numeric_value(_equation_value(head)), _numeric_value(tail)
        if exact is not None and approx is not None and abs(exact - approx) > _rounding(tail):
            return None
    return head


def _rounding(s: str) -> float:
    """How far a value written as ``s`` may be from what it approximates: one unit in its last
    decimal place (``1.75``: 0.01; ``3.1e8``: 1e7); a relative 1e-6 for other spellings."""
    m = _DEC_RE.fullmatch(s)
    if not m:
        value = _to_number(s)
        return REL_TOL * abs(float(value[0])) if value else REL_TOL
    mantissa, _, exponent = s.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)


def _numeric_value(s: str) -> complex | None:
    """The value of a constant answer (``\\frac{7}{4}``, ``\\sqrt{2}``, ``\\pi``), or None."""
    number = _to_number(s)
    if number is not None:
        return complex(float(number[0]))
    expr = _parse_sympy(s)
    if expr is None or isinstance(expr, tuple) or expr.free_symbols:
        return None
    return _eval_complex(expr, {})


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
    # a missing truth (None, or a NaN from a dataframe) is no answer, not the text "None"
    truths = [gt for gt in truths if gt is not None and not (isinstance(gt, float) and gt != gt)]
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
