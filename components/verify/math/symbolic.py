"""The symbolic fallback: LaTeX to sympy, within a budget, compared by numeric probing."""

from __future__ import annotations

import ast
import cmath
import math
import re
from functools import lru_cache
from typing import Any

from components.verify.math.latex import FUNCS, IDENT_RE, latex_to_plain
from components.verify.math.numbers import ABS_TOL, _close
from components.verify.math.structure import _matching_close

# Inputs longer than this never reach sympy (they are judged by the cheap stages only).
_MAX_SYMPY_LEN = 400


def _has_power_tower(plain: str) -> bool:
    """True for ``a**(b**c)`` or ``a**b**c``: an exponent that itself contains a power."""
    for m in re.finditer(r"\*\*\s*", plain):
        j = m.end()
        if j < len(plain) and plain[j] == "(":
            k = _matching_close(plain, j)
            if k < 0 or "**" in plain[j:k]:
                return True
            j = k + 1
        else:
            tok = re.match(r"[-+]?[\w.]*", plain[j:])
            j += tok.end() if tok else 0
        if plain[j:].lstrip().startswith("**"):
            return True
    return False


def _too_expensive(plain: str) -> bool:
    """Reject inputs that could make sympy evaluate something enormous."""
    if len(plain) > _MAX_SYMPY_LEN:
        return True
    # power towers and huge exponents / factorials
    if plain.count("**") > 12:
        return True
    for m in re.finditer(r"\*\*\s*\(?\s*(\d+)", plain):
        if int(m.group(1)) > 4096:
            return True
    if _has_power_tower(plain):
        return True
    for m in re.finditer(r"(\d+)\s*\)?\s*!", plain):
        if int(m.group(1)) > 500:
            return True
    if re.search(r"\d{60,}", plain):
        return True
    return False


_SYMPY: Any = None


def warm_up() -> None:
    """Import sympy and build the parser tables now rather than within the time of the
    first answer that needs the symbolic fallback. The executor calls this in the parent
    process so forked workers inherit it."""
    _sympy()


def _sympy() -> Any:
    global _SYMPY
    if _SYMPY is None:
        import sympy
        from sympy.parsing import sympy_parser as sp

        transformations = sp.standard_transformations + (
            sp.implicit_multiplication,
            sp.convert_xor,
        )
        names: dict[str, Any] = {}
        exec("from sympy import *", names)  # noqa: S102 - the standard parse_expr namespace
        _SYMPY = (sympy, sp, transformations, names)
    return _SYMPY


# The most digits any integer sympy is asked to build may have: a product or power of a few
# 50,000-digit integers, or factorial(5,000), is cheap to build; binomial(99999, 50000)
# (30,000 digits, but built through much larger intermediates) is at the edge of
# compute_score's time bound.
MAX_DIGITS = 50_000
_LOG10_2 = math.log10(2)


def _magnitude(node: ast.AST) -> float:
    """An upper bound on log10(|value| + 1) of a node of sympy's generated code (the output of
    ``stringify_expr``), without evaluating anything; ``inf`` for what could be too large to
    compute within the budget or for anything not understood."""
    if isinstance(node, ast.Expression):
        return _magnitude(node.body)
    if isinstance(node, ast.Name):  # a symbol or a constant (x, pi, E, I, oo)
        return 1.0
    if isinstance(node, ast.Constant):  # the literal inside Integer(...) / Float('...')
        try:
            return math.log10(abs(float(node.value)) + 1.0)
        except (TypeError, ValueError, OverflowError):
            return math.inf
    if isinstance(node, ast.UnaryOp):
        return _magnitude(node.operand)
    if isinstance(node, ast.BinOp):
        a, b = _magnitude(node.left), _magnitude(node.right)
        if isinstance(node.op, ast.Add | ast.Sub):
            return max(a, b) + _LOG10_2
        if isinstance(node.op, ast.Mult | ast.Div):
            return a + b
        if isinstance(node.op, ast.Pow):
            return a * (10.0**b) if b < 8 else math.inf  # digits(x^y) <= digits(x) * |y|
        return math.inf
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        # a tuple (``3*(x, y)`` would repeat it 3 times in Python), a subscript, anything else
        return math.inf
    name, args = node.func.id, node.args
    if name in ("Integer", "Float", "Rational", "Symbol"):
        if name == "Symbol":
            return 1.0
        values = [a.value for a in args if isinstance(a, ast.Constant)]
        if len(values) != len(args):
            return math.inf
        try:
            return sum(math.log10(abs(float(v)) + 1.0) for v in values)
        except (ValueError, OverflowError):
            return math.inf
    inner = [_magnitude(a) for a in args]
    if name in ("factorial", "binomial") and not all(_is_integer(a) for a in args):
        # of a symbol or a non-integer, sympy goes through gamma functions: only small values
        return max(inner, default=0.0) if max(inner, default=0.0) <= 4 else math.inf
    if name == "factorial" and len(inner) == 1:
        n = 10.0 ** inner[0] if inner[0] < 8 else math.inf
        return n * math.log10(n + 1.0) if n <= 20_000 else math.inf
    if name == "binomial" and len(inner) == 2:
        n, k = (10.0**m if m < 8 else math.inf for m in inner)
        terms = min(n, k)
        return terms * math.log10(n + 1.0) if terms <= 20_000 and n < 1e15 else math.inf
    if name == "exp" and len(inner) == 1:
        return 0.4343 * 10.0 ** inner[0] if inner[0] < 8 else math.inf
    # sqrt, log, trigonometric and hyperbolic functions, Abs: no larger than their argument
    return max(inner, default=0.0)


def _is_integer(node: ast.AST) -> bool:
    """Whether generated code is an integer built from integer literals (+, -, *, non-negative
    powers, factorials and binomials of such)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "Integer":
            return True
        if node.func.id in ("factorial", "binomial"):
            return all(_is_integer(a) for a in node.args)
        return False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _is_integer(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        return _is_integer(node.left) and _is_integer(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return (
            _is_integer(node.left)
            and _is_integer(node.right)
            and not (isinstance(node.right, ast.UnaryOp) and isinstance(node.right.op, ast.USub))
        )
    return False


def _within_budget(code: str) -> bool:
    """Whether evaluating sympy's generated code stays small enough to finish in time."""
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    stack = [tree]
    while stack:  # every subexpression, not just the whole, must stay within the budget
        node = stack.pop()
        if isinstance(node, ast.expr) and _magnitude(node) > MAX_DIGITS:
            return False
        stack.extend(ast.iter_child_nodes(node))
    return True


@lru_cache(maxsize=16384)
def _parse_sympy(s: str) -> Any:
    """Parse a normalized answer to a sympy expression (or ``("eq", lhs, rhs)``).

    Bounded: the text is first turned into sympy's Python code (tokens only, nothing is
    evaluated), the magnitude of every integer it would build is bounded from that code
    (`_magnitude`), and only then is it evaluated. Anything that could exceed `MAX_DIGITS`
    digits (a binomial of nine-digit numbers, (10^6)!, a power tower) is not evaluated: the
    comparison falls back to False, which is the right answer for a model that wrote it
    instead of a number."""
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        a, b = _parse_sympy(lhs), _parse_sympy(rhs)
        if a is None or b is None or isinstance(a, tuple) or isinstance(b, tuple):
            return None
        return ("eq", a, b)
    if any(ch in s for ch in "=<>≤≥≠"):
        return None
    plain = latex_to_plain(s)
    if plain is None or not plain.strip() or _too_expensive(plain):
        return None
    sympy, sp, transformations, names = _sympy()
    local: dict[str, Any] = {}
    for word in set(IDENT_RE.findall(plain)):
        if word not in FUNCS:
            local[word] = sympy.Symbol(word)
    try:
        code = sp.stringify_expr(plain, local, names, transformations)
        if not _within_budget(code):
            return None
        expr = sp.eval_expr(code, local, names)
    except Exception:
        return None
    if not isinstance(expr, sympy.Expr):
        return None
    return expr


_PROBES = (0.731, 1.379, 2.113, 0.417, 1.853, 2.671)


def _eval_complex(expr: Any, subs: dict[Any, float]) -> complex | None:
    try:
        val = complex(expr.evalf(30, subs=subs))
    except Exception:
        return None
    if cmath.isnan(val) or cmath.isinf(val):
        return None
    return val


def _sympy_equal(pred: str, gt: str) -> bool:
    a = _parse_sympy(pred)
    if a is None:
        return False
    b = _parse_sympy(gt)
    if b is None:
        return False
    if isinstance(a, tuple) != isinstance(b, tuple):
        return False
    if isinstance(a, tuple):
        # equations: equivalent when (lhs - rhs) agree up to a nonzero constant factor
        da, db = a[1] - a[2], b[1] - b[2]
        if da.free_symbols != db.free_symbols:
            return False
        syms = sorted(da.free_symbols, key=str)
        ratios = []
        for k in range(len(_PROBES)):
            subs = {s: _PROBES[(k + j) % len(_PROBES)] for j, s in enumerate(syms)}
            va, vb = _eval_complex(da, subs), _eval_complex(db, subs)
            if va is None or vb is None or abs(vb) < ABS_TOL:
                continue
            ratios.append(va / vb)
        return (
            len(ratios) >= 3
            and abs(ratios[0]) > ABS_TOL
            and all(_close(r, ratios[0]) for r in ratios)
        )
    if a.free_symbols != b.free_symbols:
        return False
    if not a.free_symbols:
        if a.is_Rational and b.is_Rational:
            return bool(a == b)
        va, vb = _eval_complex(a, {}), _eval_complex(b, {})
        return va is not None and vb is not None and _close(va, vb)
    if a == b:
        return True
    syms = sorted(a.free_symbols, key=str)
    checked = 0
    for k in range(len(_PROBES)):
        subs = {s: _PROBES[(k + j) % len(_PROBES)] for j, s in enumerate(syms)}
        va, vb = _eval_complex(a, subs), _eval_complex(b, subs)
        if va is None or vb is None:
            continue
        if not _close(va, vb):
            return False
        checked += 1
    return checked >= 3


_RELATIONS = {"<": "<", ">": ">", "≤": "≤", "≥": "≥"}
_FLIP = {"<": ">", ">": "<", "≤": "≥", "≥": "≤"}


@lru_cache(maxsize=16384)
def linear_inequality_interval(s: str) -> str | None:
    """``-x>-1`` -> ``(-\\infty,1)``, ``-2x≤-6`` -> ``[3,\\infty)``: a single inequality that is
    linear in one variable, solved (dividing by a negative coefficient flips it); None for
    anything else."""
    ops = [ch for ch in s if ch in _RELATIONS]
    if len(ops) != 1 or "=" in s:
        return None
    lhs, rhs = s.split(ops[0])
    a, b = _parse_sympy(lhs), _parse_sympy(rhs)
    if a is None or b is None or isinstance(a, tuple) or isinstance(b, tuple):
        return None
    sympy = _sympy()[0]
    diff = sympy.expand(a - b)
    if len(diff.free_symbols) != 1:
        return None
    (x,) = diff.free_symbols
    try:
        poly = sympy.Poly(diff, x)
    except Exception:
        return None
    if poly.degree() != 1 or not all(c.is_number and c.is_real for c in poly.all_coeffs()):
        return None
    coef, const = poly.all_coeffs()
    if coef == 0:
        return None
    op = ops[0] if coef > 0 else _FLIP[ops[0]]
    bound = sympy.nsimplify(-const / coef)
    text = str(bound).replace("**", "^")
    return {
        ">": f"({text},\\infty)",
        "≥": f"[{text},\\infty)",
        "<": f"(-\\infty,{text})",
        "≤": f"(-\\infty,{text}]",
    }[op]
