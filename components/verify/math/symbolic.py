"""The symbolic fallback: LaTeX to sympy, within a budget, compared by numeric probing."""

from __future__ import annotations

import ast
import cmath
import math
import re
from functools import lru_cache
from typing import Any

from components.verify.math.numbers import ABS_TOL, _close
from components.verify.math.structure import _matching_close

# Inputs longer than this never reach sympy (they are judged by the cheap stages only).
_MAX_SYMPY_LEN = 400


_FUNCS = {
    "sqrt",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "log",
    "exp",
    "Abs",
    "binomial",
    "factorial",
    "pi",
    "oo",
    "E",
    "I",
}
_GREEK = {
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "theta",
    "lambda",
    "mu",
    "phi",
    "omega",
    "sigma",
    "tau",
    "rho",
    "psi",
    "chi",
    "eta",
    "kappa",
    "nu",
    "xi",
    "zeta",
}
_CMD_MAP = {"pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/"}
_FUNC_CMDS = {
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "cot": "cot",
    "sec": "sec",
    "csc": "csc",
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "ln": "log",
    "log": "log",
    "exp": "exp",
}
_SYMPY_ALLOWED_RE = re.compile(r"[0-9a-zA-Z+\-*/().,!_ ]*")
_IDENT_RE = re.compile(r"[A-Za-z]+(?:_[A-Za-z0-9]+)?")


def _read_group(s: str, i: int) -> tuple[str, int] | None:
    """Read a ``{...}`` group or a single token starting at ``s[i]``; return (content, end)."""
    if i >= len(s):
        return None
    if s[i] == "{":
        j = _matching_close(s, i)
        if j < 0:
            return None
        return s[i + 1 : j], j + 1
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _read_script(s: str, i: int) -> tuple[str, int] | None:
    """A sub- or superscript group starting at ``s[i]`` as plain math, and where it ends."""
    g = _read_group(s, i)
    if g is None:
        return None
    plain = _latex_to_plain(g[0])
    return None if plain is None else (plain, g[1])


def _function_application(s: str, i: int, func: str) -> tuple[str, int] | None:
    """Convert ``\\sin^2 2x`` style application starting after the command name.

    ``\\sin 2x`` is ``sin(2x)`` and ``\\sin x \\cos x`` is ``sin(x)*cos(x)``: without
    parentheses the argument runs to the next operator or function command.
    """
    base = power = None
    if func == "log" and i < len(s) and s[i] == "_":
        script = _read_script(s, i + 1)
        if script is None:
            return None
        base, i = script
    if i < len(s) and s[i] == "^":
        script = _read_script(s, i + 1)
        if script is None:
            return None
        power, i = script
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] in "({":
        j = _matching_close(s, i)
        if j < 0:
            return None
        arg_src, end = s[i + 1 : j], j + 1
    else:
        j = i
        while j < len(s):
            if s[j] in "+-*/=,)":
                break
            m = re.match(r"\\([a-zA-Z]+)", s[j:])
            if m and (m.group(1) in _FUNC_CMDS or m.group(1) in ("cdot", "times", "div")):
                break
            if s[j] in "({":
                k = _matching_close(s, j)
                if k < 0:
                    return None
                j = k
            j += 1
        arg_src, end = s[i:j], j
    arg = _latex_to_plain(arg_src)
    if arg is None or not arg.strip():
        return None
    text = f" {func}({arg})" if base is None else f" log({arg},{base})"
    if power is not None:
        text = f"(({text})**({power}))"
    return text, end


def _latex_to_plain(s: str) -> str | None:
    """Convert normalized LaTeX-ish math to a string for sympy's ``parse_expr``.

    Returns None when the input uses anything outside the supported, whitelisted subset.
    """
    out: list[str] = []
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m:
                return None
            name = m.group(1)
            i += len(m.group(0))
            while i < n and s[i] == " ":
                i += 1
            if name == "frac" or name == "binom":
                a = _read_group(s, i)
                if a is None:
                    return None
                b = _read_group(s, a[1])
                if b is None:
                    return None
                pa, pb = _latex_to_plain(a[0]), _latex_to_plain(b[0])
                if pa is None or pb is None:
                    return None
                out.append(f"(({pa})/({pb}))" if name == "frac" else f"binomial({pa},{pb})")
                i = b[1]
            elif name == "sqrt":
                root = None
                if i < n and s[i] == "[":
                    j = s.find("]", i)
                    if j < 0:
                        return None
                    root = _latex_to_plain(s[i + 1 : j])
                    if root is None:
                        return None
                    i = j + 1
                a = _read_group(s, i)
                if a is None:
                    return None
                pa = _latex_to_plain(a[0])
                if pa is None:
                    return None
                out.append(f"sqrt({pa})" if root is None else f"(({pa})**(1/({root})))")
                i = a[1]
            elif name in _FUNC_CMDS:
                applied = _function_application(s, i, _FUNC_CMDS[name])
                if applied is None:
                    return None
                out.append(applied[0])
                i = applied[1]
            elif name in _CMD_MAP:
                out.append(" " + _CMD_MAP[name] + " ")
            elif name in _GREEK:
                out.append(f" {name} ")
            else:
                return None
            continue
        if ch == "{":
            out.append("(")
        elif ch == "}":
            out.append(")")
        elif ch == "^":
            out.append("**")
            if i + 1 < n and s[i + 1] not in "{(\\":
                # x^23 in LaTeX is x^{2}3
                out.append(f"({s[i + 1]})")
                i += 1
        elif ch == "_":
            g = _read_group(s, i + 1)
            if g is None or not g[0].isalnum() or not out or not out[-1][-1:].isalpha():
                return None
            out.append("_" + g[0] + " ")
            i = g[1]
            continue
        elif ch == "|":
            return None
        else:
            out.append(ch)
        i += 1
    plain = "".join(out)
    if not _SYMPY_ALLOWED_RE.fullmatch(plain) or re.search(r"(?<![A-Za-z])_|__", plain):
        return None

    def ident(m: re.Match[str]) -> str:
        word = m.group(0)
        if word in _FUNCS or word in _GREEK or "_" in word:
            return f" {word} "
        if len(word) == 1:
            return {"e": " E ", "i": " I "}.get(word, f" {word} ")
        # an unknown multi-letter word is a product of single-letter symbols
        return "(" + "*".join(word) + ")"

    plain = _IDENT_RE.sub(ident, plain)
    # 2x, x2 -> implicit multiplication is left to parse_expr; x2 must not become a name
    plain = re.sub(r"(?<![A-Za-z_])([A-Za-z])\s*(\d)", r"\1*\2", plain)
    return plain


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
    """Import sympy and build the parser tables now (about a second) rather than on the
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
# 50,000-digit integers, or factorial(5,000), costs milliseconds; binomial(99999, 50000)
# (30,000 digits, but built through much larger intermediates) costs about a second.
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
    plain = _latex_to_plain(s)
    if plain is None or not plain.strip() or _too_expensive(plain):
        return None
    sympy, sp, transformations, names = _sympy()
    local: dict[str, Any] = {}
    for word in set(_IDENT_RE.findall(plain)):
        if word not in _FUNCS:
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
