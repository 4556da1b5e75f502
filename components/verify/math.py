"""Math answer verifier: extract a final answer from a model response and judge it.

This is the reward function the verify stage uses for math data (MATH, GSM8K and
similar). It is importable on its own, e.g. from a notebook::

    from components.verify.math import compute_score
    compute_score("... so the answer is $\\boxed{\\frac{1}{2}}$", "0.5")
    # {"score": 1.0, "extracted_answer": "\\frac{1}{2}", "rule": "boxed"}

Pipeline (see docs/verifiers.md for the full rules):

1. ``extract_answer`` picks the answer out of the response: the last ``\\boxed{...}``,
   else the last ``\\fbox{...}``, else a "final answer is X" / "the answer is X" phrase,
   else GSM8K's ``#### X``.
2. Both sides are normalized (LaTeX spelling, units, percent, degrees, thousands
   separators, ...). The ground truth is read leniently, the response strictly.
3. Equivalence is decided cheapest-first: exact string, numbers (exact for integers and
   fractions, 1e-6 relative tolerance once a decimal is involved), tuples / intervals /
   sets element-wise, and finally a sympy comparison.

Time bounds: ``compute_score`` returns within about a second on any input, in-process, with no
deadline of its own (``signal.alarm`` does not work off the main thread, and verl and TRL call
reward functions in-process): responses and answers are length-capped, sympy's input is
screened (whitelisted identifiers only, and an upper bound on the size of every integer it
would build, from its generated code before anything is evaluated: `_within_budget`), and it
compares by numeric probing rather than ``simplify``. Inside the verify stage the executor's
per-sample deadline remains a second line of defence.
"""

from __future__ import annotations

import ast
import cmath
import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

__all__ = [
    "clear_caches",
    "compute_score",
    "extract_answer",
    "is_equivalent",
    "normalize_answer",
    "warm_up",
]

# Relative / absolute tolerance for numeric comparison once a decimal or an irrational
# value is involved.
REL_TOL = 1e-6
ABS_TOL = 1e-9

# Inputs longer than this never reach sympy (they are judged by the cheap stages only).
_MAX_SYMPY_LEN = 400
# Longer numbers are compared as strings only.
_MAX_NUMBER_LEN = 400
# Answers longer than this are compared by exact (stripped) string only: nothing real is
# that long, and it keeps the regex work bounded for degenerate outputs.
MAX_ANSWER_LEN = 2000

# --------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------

_PHRASE_RE = re.compile(
    r"(?:final\s+answer|the\s+answer)\s*(?:is\s*:?|:|=)[ \t]*\**[ \t]*",
    re.IGNORECASE,
)
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*)")
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)")
_TOKEN_RE = re.compile(r"[^\s$]+")


def _balanced_group(text: str, open_idx: int, limit: int | None = None) -> str | None:
    """Return the content of the brace group opening at ``text[open_idx] == '{'``,
    if it closes before ``limit``."""
    depth = 0
    for j in range(open_idx, len(text) if limit is None else limit):
        ch = text[j]
        if ch == "\\":
            # an escaped brace (\{ or \}) does not count towards nesting
            continue
        if ch == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif ch == "}" and (j == 0 or text[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : j]
    return None


def _last_command_arg(text: str, command: str) -> str | None:
    """Content of the last ``\\command{...}`` with balanced braces (or ``\\boxed 5``)."""
    end = len(text)
    # Once the group of a later command fails to close, an earlier group can only be
    # balanced if it closes before that later command: scan up to ``limit`` (linear time).
    limit = len(text)
    while True:
        idx = text.rfind(command, 0, end)
        if idx < 0:
            return None
        j = idx + len(command)
        # skip whitespace between the command and its argument
        k = j
        while k < len(text) and text[k] in " \t":
            k += 1
        if k < len(text) and text[k] == "{":
            content = _balanced_group(text, k, limit)
            if content is not None:
                return content.strip()
            limit = idx
        elif k > j and k < len(text):
            # "\boxed 5": the argument is the next token ("\boxedx" / "\fboxsep" are
            # other commands and are skipped)
            m = _TOKEN_RE.match(text, k)
            if m:
                return m.group(0)
        end = idx


def _clean_phrase_answer(raw: str) -> str | None:
    """Trim a "the answer is ..." capture to the answer itself."""
    line = raw.strip().split("\n", 1)[0]
    m = _SENTENCE_END_RE.search(line)
    if m:
        line = line[: m.start()]
    line = line.strip().strip("*").strip()
    if line.startswith("$") and line.count("$") >= 2:
        line = line[1 : line.index("$", 1)]
    line = line.strip().rstrip(".").strip()
    return line or None


def extract_answer(text: str) -> tuple[str | None, str | None]:
    """Extract the final answer from a model response.

    Returns ``(answer, rule)`` where ``rule`` names the rule that fired: ``"boxed"``
    (last ``\\boxed{...}`` with balanced braces), ``"fbox"``, ``"answer_phrase"``
    ("final answer is X" / "the answer is X", last occurrence) or ``"gsm8k"``
    (``#### X``). ``(None, None)`` when nothing matches.
    """
    if not text:
        return None, None
    if "\\boxed" in text:
        ans = _last_command_arg(text, "\\boxed")
        if ans is not None:
            return ans, "boxed"
    if "\\fbox" in text:
        ans = _last_command_arg(text, "\\fbox")
        if ans is not None:
            return ans, "fbox"
    last = None
    for last in _PHRASE_RE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is not None:
        ans = _clean_phrase_answer(text[last.end() :])
        if ans is not None:
            return ans, "answer_phrase"
    if "####" in text:
        matches = _GSM8K_RE.findall(text)
        if matches:
            ans = matches[-1].strip().rstrip(".").strip()
            if ans:
                return ans, "gsm8k"
    return None, None


# --------------------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------------------

_SIMPLE_NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?")
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|textsf|texttt|mbox|hbox|mathrm|mathbf|"
    r"mathit|mathsf|mathtt|operatorname|bf|rm)\s*\{([^{}]*)\}"
)
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])")
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree(?![a-zA-Z])")
_THIN_THOUSANDS_RE = re.compile(r"(\d)\\[,;:! ](?=\d{3}(?!\d))")
_COMMA_BANG_RE = re.compile(r"(?<=\d),\s*\\!\s*(?=\d{3})")
_SPACING_RE = re.compile(r"(?<!\\)\\[,;: ]|\\q?quad(?![a-zA-Z])|~")
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SPACE_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_MIXED_SPACE_RE = re.compile(r"([-+]?\d+)\s+(\d+)\s*/\s*(\d+)")
_CMD_SPACE_RE = re.compile(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z0-9])")
_WS_RE = re.compile(r"\s+")
# relations are canonicalized to single characters
_LE_RE = re.compile(r"\\leq?(?:slant)?(?![a-zA-Z])|<=")
_GE_RE = re.compile(r"\\geq?(?:slant)?(?![a-zA-Z])|>=")
_NE_RE = re.compile(r"\\neq?(?![a-zA-Z])|!=")
_INFTY_RE = re.compile(
    r"\\infty|\\infinity(?![a-zA-Z])|(?<![a-zA-Z\\])(?:infinity|inf)(?![a-zA-Z])"
)
_EMPTYSET_RE = re.compile(r"\\(?:varnothing|emptyset)(?![a-zA-Z])|^\\\{\\\}$|^\{\}$")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_SHORT2_RE = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_FRAC_SHORT3_RE = re.compile(r"\\frac(\d)\{")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d|[a-zA-Z](?![a-zA-Z]))")

# A trailing unit: words after a value, optionally with a power (cm^2) or a rate (km/h).
_UNIT_WORD = r"[a-zA-Z]+\.?(?:\s*\^\s*\{?\d\}?)?"
_UNIT_TAIL_RE = re.compile(
    rf"^(?P<val>.*?(?:[\d}}\)]|\\[a-zA-Z]+))(?P<sep>\s*)"
    rf"(?P<unit>{_UNIT_WORD}(?:\s*(?:/|per\s)\s*{_UNIT_WORD}|\s+{_UNIT_WORD})*)$"
)
# Words that are never units (they carry meaning or are math).
_NOT_UNITS = frozenset(
    """or and to of is are not no nor but than then plus minus times over divided by
    equals equal with for in at the an if else where when so yes none undefined
    infinity inf pi sqrt sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log
    ln exp mod choose i e dne true false only each both all""".split()
)
# Units recognised even when written without a space ("5cm").
_KNOWN_UNITS = frozenset(
    """cm mm km m kg g mg lb lbs oz ft inch inches feet foot yd yard yards mi mile miles
    s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks
    month months year years yr yrs cent cents dollar dollars l ml liter liters litre litres
    mph kph kmh units unit sq square cubic degree degrees deg percent meters meter metres
    metre centimeters centimeter kilometers kilometer grams gram kilograms kilogram pounds
    pound ounces ounce gallons gallon quarts quart pints pint cups cup""".split()
)


def _strip_units(s: str) -> str:
    """Drop trailing unit words (``5 cm``, ``12 square feet``, ``10 km/h``)."""
    for _ in range(3):
        m = _UNIT_TAIL_RE.match(s)
        if not m:
            break
        words = re.findall(r"[a-zA-Z]+", m.group("unit"))
        if not words or any(w.lower() in _NOT_UNITS for w in words):
            break
        if m.group("sep"):
            # "5 cm": any word of two or more letters, plus a few one-letter units
            if not all(len(w) > 1 or w in {"m", "g", "s", "h", "L", "l"} for w in words):
                break
        elif not all(w.lower() in _KNOWN_UNITS for w in words):
            break  # "2ab" is a product, "5cm" a length
        val = m.group("val").rstrip()
        if not val or not re.search(r"\d", val):
            break
        s = val
    return s


def _unwrap_boxed(s: str) -> str:
    if "\\boxed" in s or "\\fbox" in s:
        ans, _ = extract_answer(s)
        if ans is not None:
            return ans
    return s


@lru_cache(maxsize=65536)
def normalize_answer(s: str) -> str:
    """Normalize an extracted answer (or a ground truth) to a canonical string.

    Handles ``\\dfrac``/``\\tfrac``, ``\\left``/``\\right``, spacing commands and
    whitespace, thousands separators (``1,000`` but not ``(1,2)``), trailing units
    (``5 cm``, ``\\text{ cm}``), degrees, percent signs, ``\\text{}`` wrappers, dollar
    signs and a trailing period.
    """
    s = s.strip()
    if _SIMPLE_NUMBER_RE.fullmatch(s):
        return s[1:] if s.startswith("+") else s
    s = _unwrap_boxed(s)
    # math-mode delimiters and dollar signs
    s = s.replace("\\$", "").replace("$", "")
    for delim in ("\\(", "\\)", "\\[", "\\]"):
        s = s.replace(delim, " ")
    s = s.replace("\\displaystyle", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _COMMA_BANG_RE.sub(",", s.replace("{,}", ","))  # MATH writes 11,\! 111
    s = _THIN_THOUSANDS_RE.sub(r"\1", s)
    s = s.replace("\\!", "")
    s = _SPACING_RE.sub(" ", s)
    s = _DEGREE_RE.sub(" ", s)
    s = s.replace("\\%", " ").replace("%", " ")
    for _ in range(3):
        new = _TEXT_CMD_RE.sub(r" \1 ", s)
        if new == s:
            break
        s = new
    s = s.strip()
    s = s.strip("*").strip()
    s = s.rstrip(".").strip()
    s = _strip_units(s)
    s = s.rstrip(".").strip()
    if _THOUSANDS_RE.fullmatch(s) or _SPACE_THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "").replace(" ", "")
    m = _MIXED_SPACE_RE.fullmatch(s)
    if m:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    s = _INFTY_RE.sub(r"\\infty", s)
    s = _LE_RE.sub("≤", s)
    s = _GE_RE.sub("≥", s)
    s = _NE_RE.sub("≠", s)
    # remove whitespace, keeping a separator between a command and a following letter
    s = _CMD_SPACE_RE.sub(lambda mm: mm.group(1) + "\x00", s)
    s = _WS_RE.sub("", s).replace("\x00", " ")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT2_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT3_RE.sub(r"\\frac{\1}{", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = _EMPTYSET_RE.sub(r"\\emptyset", s)
    if s.startswith("+"):
        s = s[1:]
    return s.rstrip(".")


# --------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d*)?|\.\d+"
_INT_RE = re.compile(r"-?\d+")
_DEC_RE = re.compile(rf"-?(?:{_NUM})(?:[eE][-+]?\d+)?")
_SLASH_FRAC_RE = re.compile(rf"(-?)\(?(-?(?:{_NUM}))\)?/\(?(-?(?:{_NUM}))\)?")
_TEX_FRAC_RE = re.compile(rf"(-?)\\frac\{{(-?(?:{_NUM}))\}}\{{(-?(?:{_NUM}))\}}")
_MIXED_RE = re.compile(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_REPEATING_RE = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")


def _to_number(s: str) -> tuple[Fraction, bool] | None:
    """Parse a normalized plain number. Returns (value, exact) or None.

    ``exact`` is False when a decimal point / exponent was involved (the value may be a
    rounded representation, so it is compared with a tolerance).
    """
    if len(s) > _MAX_NUMBER_LEN:
        return None
    if _INT_RE.fullmatch(s):
        return Fraction(int(s)), True
    if _DEC_RE.fullmatch(s):
        return Fraction(s), False
    m = _TEX_FRAC_RE.fullmatch(s) or _SLASH_FRAC_RE.fullmatch(s)
    if m:
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        if den == 0:
            return None
        val = num / den
        exact = "." not in m.group(2) and "." not in m.group(3)
        return (-val if m.group(1) else val), exact
    m = _REPEATING_RE.fullmatch(s)
    if m:
        # 0.1\overline{6} = 0.1666...
        whole, fixed, rep = m.group(2) or "0", m.group(3), m.group(4)
        val = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
        val += Fraction(int(rep), (10 ** len(rep) - 1) * 10 ** len(fixed))
        return (-val if m.group(1) else val), True
    m = _MIXED_RE.fullmatch(s)
    if m:
        den = int(m.group(4))
        if den == 0:
            return None
        val = int(m.group(2)) + Fraction(int(m.group(3)), den)
        return (-val if m.group(1) else val), True
    return None


def _close(a: complex | float, b: complex | float) -> bool:
    diff = abs(a - b)
    return diff <= ABS_TOL or diff <= REL_TOL * max(abs(a), abs(b))


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    if a[0] == b[0]:
        return True
    if a[1] and b[1]:
        return False  # integers and fractions are compared exactly
    return _close(float(a[0]), float(b[0]))


# --------------------------------------------------------------------------------------
# Structure: equations, inequalities, tuples, intervals, sets, matrices
# --------------------------------------------------------------------------------------

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
    variable (``x``, ``\\theta``, ``a_1``)."""
    if "\\in" in s and not s.startswith("\\in"):
        lhs, _, rhs = s.partition("\\in")
        if rhs and not rhs[0].isalpha() and _SIMPLE_LHS_RE.fullmatch(lhs):
            return rhs  # x \in [2,5] -> [2,5]
    if s.count("=") != 1:
        return s
    lhs, rhs = s.split("=")
    if rhs and _SIMPLE_LHS_RE.fullmatch(lhs) and lhs not in ("\\pi", "\\infty"):
        return rhs
    return s


_INEQ_RE = re.compile(r"([a-zA-Z])([<>≤≥])(.+)")
_INEQ_REV_RE = re.compile(r"(.+?)([<>≤≥])([a-zA-Z])")
_INEQ_BOTH_RE = re.compile(r"(.+?)([<≤])([a-zA-Z])([<≤])(.+)")


def _inequality_to_interval(s: str) -> str:
    """``x>3`` -> ``(3,\\infty)``, ``1\\le x<2`` -> ``[1,2)``; other strings unchanged."""
    if not any(op in s for op in "<>≤≥"):
        return s
    m = _INEQ_BOTH_RE.fullmatch(s)
    if m:
        lo = "[" if m.group(2) == "≤" else "("
        hi = "]" if m.group(4) == "≤" else ")"
        return f"{lo}{m.group(1)},{m.group(5)}{hi}"
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
        return "set", tuple(e for e in _split_top(inner, ",") if e != "") if inner else ()
    if s and s[0] in "([" and s[-1] in ")]" and _matching_close(s, 0) == len(s) - 1:
        parts = _split_top(s[1:-1], ",")
        if len(parts) >= 2:
            return s[0] + s[-1], tuple(parts)
        return None
    parts = _split_top(s, ",")
    if len(parts) >= 2 and all(parts):
        return "list", tuple(parts)
    pm = _split_top(s, "\\pm")
    if len(pm) == 2 and pm[1]:
        a, b = pm
        if a:
            return "list", (f"{a}+{b}", f"{a}-{b}")
        return "list", (b, f"-{b}")
    return None


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


def _struct_equal(p: Struct, g: Struct) -> bool:
    pk, pe = p
    gk, ge = g
    unordered = {"set", "list"}
    if pk in unordered and gk in unordered:
        return _match_unordered(pe, ge, _element_equal)
    if pk != gk:
        return False
    if pk == "union":
        return _match_unordered(pe, ge, _struct_equal)
    if pk == "matrix":
        return len(pe) == len(ge) and all(
            len(pr) == len(gr) and all(_element_equal(a, b) for a, b in zip(pr, gr, strict=True))
            for pr, gr in zip(pe, ge, strict=True)
        )
    return len(pe) == len(ge) and all(_element_equal(a, b) for a, b in zip(pe, ge, strict=True))


def _element_equal(pred: str, gt: str) -> bool:
    return _equivalent_normalized(_strip_equation_lhs(pred), _strip_equation_lhs(gt))


# --------------------------------------------------------------------------------------
# Sympy fallback
# --------------------------------------------------------------------------------------

_FUNCS = {
    "sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "log", "exp", "Abs", "binomial", "factorial", "pi", "oo", "E", "I",
}  # fmt: skip
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "theta", "lambda", "mu", "phi", "omega",
    "sigma", "tau", "rho", "psi", "chi", "eta", "kappa", "nu", "xi", "zeta",
}  # fmt: skip
_CMD_MAP = {"pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/"}
_FUNC_CMDS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "ln": "log", "log": "log", "exp": "exp",
}  # fmt: skip
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


def _function_application(s: str, i: int, func: str) -> tuple[str, int] | None:
    """Convert ``\\sin^2 2x`` style application starting after the command name.

    ``\\sin 2x`` is ``sin(2x)`` and ``\\sin x \\cos x`` is ``sin(x)*cos(x)``: without
    parentheses the argument runs to the next operator or function command.
    """
    base = None
    if func == "log" and i < len(s) and s[i] == "_":
        g = _read_group(s, i + 1)
        if g is None:
            return None
        base = _latex_to_plain(g[0])
        if base is None:
            return None
        i = g[1]
    power = None
    if i < len(s) and s[i] == "^":
        g = _read_group(s, i + 1)
        if g is None:
            return None
        power = _latex_to_plain(g[0])
        if power is None:
            return None
        i = g[1]
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


def clear_caches() -> None:
    """Empty the memoization caches (for benchmarks and tests)."""
    normalize_answer.cache_clear()
    _equivalent_normalized.cache_clear()
    _parse_sympy.cache_clear()


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


# --------------------------------------------------------------------------------------
# Equivalence
# --------------------------------------------------------------------------------------

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
    # inequalities become intervals
    pi_, gi = _inequality_to_interval(pred), _inequality_to_interval(gt)
    if pi_ != pred or gi != gt:
        return _equivalent_normalized(pi_, gi)
    # tuples, intervals, sets
    gs = _parse_struct(gt)
    ps = _parse_struct(pred)
    if gs is not None or ps is not None:
        if gs is not None and ps is not None:
            return _struct_equal(ps, gs)
        # a one-element set on either side against a scalar: {3} == 3
        if gs is not None and gs[0] == "set" and len(gs[1]) == 1:
            return _element_equal(pred, gs[1][0])
        if ps is not None and ps[0] == "set" and len(ps[1]) == 1:
            return _element_equal(ps[1][0], gt)
        return False
    return _sympy_equal(pred, gt)


def _prepare(answer: str) -> str:
    return _strip_equation_lhs(normalize_answer(answer))


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
        pred = _prepare(response_answer)
        gold = _prepare(gt)
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
