"""Structure: equations, inequalities, tuples, intervals, sets, unions and matrices."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from components.verify.math.numbers import _to_number

_SIMPLE_LHS_RE = re.compile(r"(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]+\}?)?(?:\([a-z]\))?")
_CHOICE_RE = re.compile(r"\(?([A-E])\)?")


def _split_top(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside of (), [], {} nesting."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "\\" and i + 1 < n and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _matching_close(s: str, i: int) -> int:
    """Index of the bracket closing the one opening at ``s[i]`` (any bracket kind)."""
    depth = 0
    j = i
    while j < len(s):
        ch = s[j]
        if ch == "\\" and j + 1 < len(s) and s[j + 1] in "{}":
            depth += 1 if s[j + 1] == "{" else -1
            if depth == 0:
                return j
            j += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return -1


def _strip_equation_lhs(s: str) -> str:
    """``x=3`` -> ``3`` (and ``x\\in[2,5]`` -> ``[2,5]``) when the left side is a single
    variable (``x``, ``\\theta``, ``a_1``); ``(x,y)=(3,2)`` -> ``x=3,y=2``."""
    if "\\in" in s and not s.startswith("\\in"):
        lhs, _, rhs = s.partition("\\in")
        if rhs and not rhs[0].isalpha() and _SIMPLE_LHS_RE.fullmatch(lhs):
            return rhs  # x \in [2,5] -> [2,5]
    if s.count("=") != 1:
        return s
    lhs, rhs = s.split("=")
    if rhs and _SIMPLE_LHS_RE.fullmatch(lhs) and lhs not in ("\\pi", "\\infty"):
        return rhs
    if _is_variable_tuple(lhs) and rhs[:1] in "([" and rhs[-1:] in ")]":
        names, values = _split_top(lhs[1:-1], ","), _split_top(rhs[1:-1], ",")
        if len(names) == len(values) and _matching_close(rhs, 0) == len(rhs) - 1:
            # (x,y)=(3,2) -> x=3,y=2: the values, by name (see `_assignments`)
            return ",".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
    return s


def _is_variable_tuple(s: str) -> bool:
    """``(x,y)``, ``(a,b,c)``: a tuple of distinct single variables."""
    if len(s) < 5 or s[0] != "(" or s[-1] != ")" or _matching_close(s, 0) != len(s) - 1:
        return False
    names = _split_top(s[1:-1], ",")
    return len(set(names)) == len(names) and all(_SIMPLE_LHS_RE.fullmatch(n) for n in names)


_CMD_NAME_RE = re.compile(r"\\[a-zA-Z]+")
_FUNC_OF_CONST_RE = re.compile(r"(?<![A-Za-z\\])[a-zA-Z]\([^A-Za-z()]*\)")  # f(2), P(-1)
_ABS_VAR_RE = re.compile(r"\|[a-zA-Z]\|")  # |z|
# commands that name a quantity: \angle A, \overline{AB}, \sin\theta, \log_2 8
_NAMING_CMD_RE = re.compile(
    r"\\(?:m?angle|measuredangle|triangle|overline|sin|cos|tan|cot|sec|csc|log|ln)(?![a-zA-Z])"
)


def _label_value(s: str) -> str:
    """The value a labelled ground truth states: ``|PQ|=4`` -> ``4``, ``\\frac{AM}{MB}=2`` ->
    ``2``, ``AB:CD=3:7`` -> ``3:7``, ``m\\angle ABC=30`` -> ``30``, ``f(2)=5`` -> ``5``.

    A label names a quantity: its letters are capitals (points, segments, events), or a
    function at a number, or the absolute value of a variable; the value is a constant (no
    letter outside a command). An equation in lower-case variables (``x^2+y^2=25``, ``x+y=5``)
    is an answer in itself and is left as it is."""
    if s.count("=") != 1 or any(op in s for op in "<>≤≥≈"):
        return s
    lhs, rhs = s.split("=")
    if not lhs or not rhs or re.search(r"[A-Za-z]", _CMD_NAME_RE.sub("", rhs)):
        return s
    name = lhs.replace("m\\angle", "\\angle")
    named = bool(
        _FUNC_OF_CONST_RE.search(name) or _ABS_VAR_RE.search(name) or _NAMING_CMD_RE.search(name)
    )
    name = _ABS_VAR_RE.sub("", _FUNC_OF_CONST_RE.sub("", name))
    letters = re.findall(r"[A-Za-z]", _CMD_NAME_RE.sub("", name))
    if (letters or named) and not any(ch.islower() for ch in letters):
        return rhs
    return s


# An assignment "var=value" (x=3, a_1=2, \theta=\frac{\pi}{2}).
Assignments = tuple[tuple[tuple[str, str], ...], ...]


def _assignments(s: str) -> Assignments | None:
    """``x=3,y=2`` -> ``(((x,3),(y,2)),)``; ``a=1,b=2;a=3,b=4`` (or ``..., a=3, b=4``) -> two
    groups, one per solution: a new group starts where a variable comes back. None unless
    every part is a single-variable assignment and there are at least two."""
    if s.count("=") < 2:
        return None
    parts = [p for chunk in _split_top(s, ";") for p in _split_top(chunk, ",")]
    pairs = []
    for part in parts:
        if part.count("=") != 1:
            return None
        var, value = part.split("=")
        if not value or not _SIMPLE_LHS_RE.fullmatch(var):
            return None
        pairs.append((var, value))
    groups: list[list[tuple[str, str]]] = [[]]
    for var, value in pairs:
        if any(v == var for v, _ in groups[-1]):
            groups.append([])
        groups[-1].append((var, value))
    names = [v for v, _ in groups[0]]
    if any([v for v, _ in g] != names for g in groups):
        return None  # x=1,y=2,x=3: not one solution per group
    return tuple(tuple(g) for g in groups)


def _assignment_struct(groups: Assignments) -> str:
    """The ground truth's assignments as the answer without the names: one solution of
    several variables is the tuple in the written order (``x=3,y=2`` is ``(3,2)``); several
    solutions are the set of them (``a=1,b=2;a=3,b=4`` is ``\\{(1,2),(3,4)\\}``, ``x=2,x=3`` is
    ``\\{2,3\\}``)."""
    tuples = [g[0][1] if len(g) == 1 else "(" + ",".join(v for _, v in g) + ")" for g in groups]
    if len(groups) == 1:
        return tuples[0]
    return "\\{" + ",".join(tuples) + "\\}"


def _assignments_equal(p: Assignments, g: Assignments, eq: Callable[[str, str], bool]) -> bool:
    """Both sides name their values: solutions in any order; within one, each variable's value
    (by name when both use the same names, else in the written order)."""

    def same(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
        if len(a) != len(b):
            return False
        names_a, names_b = {v for v, _ in a}, {v for v, _ in b}
        if names_a == names_b:
            values = dict(a)
            return all(eq(values[v], x) for v, x in b)
        if names_a & names_b:
            return False  # y=3,z=2 for x=3,y=2: y has another value; no order to fall back on
        return all(eq(x, y) for (_, x), (_, y) in zip(a, b, strict=True))

    return _match_unordered(p, g, same)


_INEQ_RE = re.compile(r"([a-zA-Z])([<>≤≥])(.+)")
_INEQ_REV_RE = re.compile(r"(.+?)([<>≤≥])([a-zA-Z])")
_INEQ_BOTH_RE = re.compile(r"(.+?)([<≤])([a-zA-Z])([<≤])(.+)")
_INEQ_DOWN_RE = re.compile(r"(.+?)([>≥])([a-zA-Z])([>≥])(.+)")
_NOT_EQUAL_RE = re.compile(r"([a-zA-Z])≠([^,<>≤≥=]+)")
# {x | x < 1}, {x : x > 0}, {x \in R \mid ...}: the condition
_SET_BUILDER_RE = re.compile(r"\\\{(?P<v>[a-zA-Z])(?:\\in[^|:]*?)?(?:\\mid ?|\||:)(?P<c>.+)\\\}")
_SETMINUS_RE = re.compile(r"(?P<iv>.+?)\\setminus ?\\\{(?P<pts>[^{}]+)\\\}")


def _one_sided(s: str) -> tuple[str, str, str] | None:
    """``x>3`` -> ``("x", ">", "3")`` and ``3>x`` -> ``("x", "<", "3")``: a variable bounded
    on one side by a value."""
    m = _INEQ_RE.fullmatch(s)
    if m:
        var, op, val = m.groups()
    else:
        m = _INEQ_REV_RE.fullmatch(s)
        if not m:
            return None
        val, op, var = m.group(1), {"<": ">", ">": "<", "≤": "≥", "≥": "≤"}[m.group(2)], m.group(3)
    if any(op2 in val for op2 in "<>≤≥"):
        return None
    return var, op, val


def _intersection(s: str) -> str | None:
    """``x>1 and x≤3`` -> ``(1,3]``: a lower and an upper bound of one variable (normalized, so
    ``x>1andx≤3``); None for anything else."""
    parts = s.split("and")
    if len(parts) != 2:
        return None
    a, b = _one_sided(parts[0]), _one_sided(parts[1])
    if a is None or b is None or a[0] != b[0]:
        return None
    lower, upper = (a, b) if a[1] in ">≥" else (b, a)
    if lower[1] not in ">≥" or upper[1] not in "<≤":
        return None
    lo = "[" if lower[1] == "≥" else "("
    hi = "]" if upper[1] == "≤" else ")"
    return f"{lo}{lower[2]},{upper[2]}{hi}"


def _inequality_to_interval(s: str) -> str:
    """``x>3`` -> ``(3,\\infty)``, ``1\\le x<2`` -> ``[1,2)``, ``x>1 and x<2`` -> ``(1,2)``;
    other strings unchanged."""
    if "and" in s:
        return _intersection(s) or s
    m = _SET_BUILDER_RE.fullmatch(s)
    if m and m.group("v") in m.group("c"):
        s = m.group("c")
    if "\\setminus" in s:
        return _remove_points(s) or s
    if "≠" in s:
        m = _NOT_EQUAL_RE.fullmatch(s)
        if m:  # x ≠ 1: every real but 1
            return f"(-\\infty,{m.group(2)})\\cup({m.group(2)},\\infty)"
        return s
    if not any(op in s for op in "<>≤≥"):
        return s
    m = _INEQ_BOTH_RE.fullmatch(s)
    if m:
        lo = "[" if m.group(2) == "≤" else "("
        hi = "]" if m.group(4) == "≤" else ")"
        return f"{lo}{m.group(1)},{m.group(5)}{hi}"
    m = _INEQ_DOWN_RE.fullmatch(s)
    if m:  # 3 > x > -2 is -2 < x < 3
        lo = "[" if m.group(4) == "≥" else "("
        hi = "]" if m.group(2) == "≥" else ")"
        return f"{lo}{m.group(5)},{m.group(1)}{hi}"
    m = _INEQ_RE.fullmatch(s)
    if m:
        op, val = m.group(2), m.group(3)
    else:
        m = _INEQ_REV_RE.fullmatch(s)
        if not m:
            return s
        flip = {"<": ">", ">": "<", "≤": "≥", "≥": "≤"}
        op, val = flip[m.group(2)], m.group(1)
    if any(op2 in val for op2 in "<>≤≥"):
        return s
    if op == ">":
        return f"({val},\\infty)"
    if op == "≥":
        return f"[{val},\\infty)"
    if op == "<":
        return f"(-\\infty,{val})"
    return f"(-\\infty,{val}]"


def _endpoint(s: str) -> Fraction | float | None:
    if s in ("\\infty", "+\\infty"):
        return math.inf
    if s == "-\\infty":
        return -math.inf
    n = _to_number(s)
    return None if n is None else n[0]


def _remove_points(s: str) -> str | None:
    """``[0,\\infty)\\setminus\\{1\\}`` -> ``[0,1)\\cup(1,\\infty)``: an interval without finitely
    many numeric points, as a union of intervals (None when not of that form)."""
    m = _SETMINUS_RE.fullmatch(s)
    if not m:
        return None
    iv = _parse_struct(m.group("iv"))
    if iv is None or iv[0] not in ("()", "[)", "(]", "[]") or len(iv[1]) != 2:
        return None
    (lo_s, hi_s), (lo_b, hi_b) = iv[1], iv[0]
    lo, hi = _endpoint(lo_s), _endpoint(hi_s)
    points = [(_endpoint(p), p) for p in _split_top(m.group("pts"), ",")]
    if lo is None or hi is None or any(v is None or abs(v) == math.inf for v, _ in points):
        return None
    pieces: list[str] = []
    for value, text in sorted(points, key=lambda vp: vp[0]):
        if value < lo or value > hi:
            continue
        if value == lo:
            lo_b = "("
            continue
        if value == hi:
            hi_b = ")"
            continue
        pieces.append(f"{lo_b}{lo_s},{text})")
        lo_s, lo, lo_b = text, value, "("
    pieces.append(f"{lo_b}{lo_s},{hi_s}{hi_b}")
    return "\\cup".join(pieces)


# A parsed structure: (kind, elements). kind is "set" (unordered), "list" (bare comma
# list, unordered), "union" (unordered intervals), "matrix", or an ordered bracket pair
# such as "()", "[)", "[]".
Struct = tuple[str, tuple[Any, ...]]


def _parse_struct(s: str) -> Struct | None:
    """Parse tuples, intervals, sets, unions, matrices, ``\\pm`` and bare comma lists."""
    if "\\begin{" in s and "matrix}" in s:
        m = re.fullmatch(r"\\begin\{([pbBvV]?matrix)\}(.*)\\end\{\1\}", s)
        if m:
            rows = [r for r in m.group(2).split("\\\\") if r != ""]
            return "matrix", tuple(tuple(c for c in r.split("&")) for r in rows)
        return None
    if "\\cup" in s:
        parts = _split_top(s, "\\cup")
        if len(parts) > 1:
            subs = [_parse_struct(p) for p in parts]
            if all(x is not None for x in subs):
                return "union", tuple(subs)
            return None
    if s.startswith("\\{") and s.endswith("\\}") and _matching_close(s, 0) == len(s) - 2:
        inner = s[2:-2]
        return "set", _expand_pm([e for e in _split_top(inner, ",") if e != ""]) if inner else ()
    if s and s[0] in "([" and s[-1] in ")]" and _matching_close(s, 0) == len(s) - 1:
        parts = _split_top(s[1:-1], ",")
        if len(parts) == 1:
            parts = _split_top(s[1:-1], ";")  # (1;2;3): semicolons where commas are decimal
        if len(parts) >= 2:
            return s[0] + s[-1], tuple(parts)
        return None
    parts = _split_top(s, ";")  # "(1,2);(3,4)": a list of answers that hold commas
    if len(parts) >= 2 and all(parts):
        return "list", tuple(parts)
    parts = _split_top(s, ",")
    if len(parts) >= 2 and all(parts):
        # "x<0, x>1" (from "x < 0 or x > 1"): the union of the intervals
        intervals = [_inequality_to_interval(p) for p in parts]
        if all(iv != p for iv, p in zip(intervals, parts, strict=True)):
            subs = [_parse_struct(iv) for iv in intervals]
            if all(x is not None for x in subs):
                return "union", tuple(subs)
        return "list", _expand_pm(parts)
    if len(_split_top(s, "\\pm")) == 2:
        pair = _expand_pm([s])
        return ("list", pair) if len(pair) == 2 else None
    return None


def _expand_pm(elements: list[str]) -> tuple[str, ...]:
    """Elements with ``\\pm`` as both of theirs: ``\\pm 1,\\pm 2i`` -> ``1,-1,2i,-2i``,
    ``a\\pm b`` -> ``a+b,a-b``."""
    out: list[str] = []
    for e in elements:
        pm = _split_top(e, "\\pm")
        if len(pm) != 2 or not pm[1]:
            out.append(e)
        elif pm[0]:
            out += [f"{pm[0]}+{pm[1]}", f"{pm[0]}-{pm[1]}"]
        else:
            out += [pm[1], f"-{pm[1]}"]
    return tuple(out)


def _match_unordered(pred: tuple[Any, ...], gt: tuple[Any, ...], eq: Any) -> bool:
    if len(pred) != len(gt):
        return False
    used = [False] * len(pred)
    for g in gt:
        for k, p in enumerate(pred):
            if not used[k] and eq(p, g):
                used[k] = True
                break
        else:
            return False
    return True


def _struct_equal(p: Struct, g: Struct, eq: Callable[[str, str], bool]) -> bool:
    """Equal structures: elements compared with `eq` (the equivalence of two answers)."""
    pk, pe = p
    gk, ge = g
    unordered = {"set", "list"}
    if pk in unordered and gk in unordered:
        return _match_unordered(pe, ge, eq)
    if pk == "list" and gk == "()":  # "1, 3" for the pair (1, 3): the truth fixes the shape
        return len(pe) == len(ge) and all(eq(a, b) for a, b in zip(pe, ge, strict=True))
    if pk != gk:
        return False
    if pk == "union":
        return _match_unordered(pe, ge, lambda a, b: _struct_equal(a, b, eq))
    if pk == "matrix":
        return len(pe) == len(ge) and all(
            len(pr) == len(gr) and all(eq(a, b) for a, b in zip(pr, gr, strict=True))
            for pr, gr in zip(pe, ge, strict=True)
        )
    return len(pe) == len(ge) and all(eq(a, b) for a, b in zip(pe, ge, strict=True))


def _equation_value(s: str) -> str:
    """The value an equation states, for a truth that is not an equation: the last side of a
    chain (``2^{10}=1024`` -> ``1024``, ``(x,y)=(1,3)`` -> ``(1,3)``, ``f'(x)=3x^2`` ->
    ``3x^2``), or the other side when the last one is a bare variable (``5=x``). Lists of
    equations (``x=2,x=3``) are left to the element comparison."""
    if "=" not in s or "≤" in s or "≥" in s:
        return _strip_equation_lhs(s)
    if len(_split_top(s, ",")) > 1:
        return s
    sides = _split_top(s, "=")
    if len(sides) < 2 or not all(sides):
        return s
    if len(sides) == 2 and _is_variable_tuple(sides[0]):
        return _strip_equation_lhs(s)  # (y,x)=(3,2) names its values: y=3,x=2, not (3,2)
    if _SIMPLE_LHS_RE.fullmatch(sides[-1]) and not _SIMPLE_LHS_RE.fullmatch(sides[0]):
        return sides[0]
    return sides[-1]
