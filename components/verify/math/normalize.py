"""Normalization: an extracted answer or a ground truth to one canonical string."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

from components.verify.math.extract import extract_answer

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
    r"\\infty|\\infinity(?![a-zA-Z])|(?<![a-zA-Z\\])(?:infinity|inf|oo)(?![a-zA-Z])"
)
_EMPTYSET_RE = re.compile(r"\\(?:varnothing|emptyset)(?![a-zA-Z])|^\\\{\\\}$|^\{\}$")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_SHORT2_RE = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_FRAC_SHORT3_RE = re.compile(r"\\frac(\d)\{")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d|[a-zA-Z](?![a-zA-Z]))")
_FRAC_VARIANT_RE = re.compile(r"\\[dtc]frac(?![a-zA-Z])")
_LT_RE = re.compile(r"\\lt(?![a-zA-Z])")
_GT_RE = re.compile(r"\\gt(?![a-zA-Z])")
_APPROX_RE = re.compile(r"\\approx(?![a-zA-Z])|≈")
# A matrix as an array between brackets (after \left / \right are gone), or a bare array.
_ARRAY_RE = re.compile(
    r"[\[(]?\s*\\begin\{array\}\s*\{[^{}]*\}(?P<body>.*?)\\end\{array\}\s*[\])]?", re.DOTALL
)
_RATIO_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?::|∶|\bto\b)\s*(-?\d+(?:\.\d+)?)")
# "2 or 5", "2 \\text{ and } 5", "1, 2, or 3": one list ("and" only between values: "x > 1 and
# x < 3" is an intersection, not a list)
# (?:\s*,)? and not \s*,?: the same strings, without cubic backtracking on a run of spaces
_OR_RE = re.compile(r"(?:\s*,)?\s+or\s+")
_AND_RE = re.compile(r"(?:\s*,)?\s+and\s+")
_RELATION_RE = re.compile(r"[<>≤≥]|\\[lg]eq?(?![a-zA-Z])|\\[lg]t(?![a-zA-Z])")
# 3.1 \times 10^{8}, 2\cdot 10^{-3}: scientific notation, as 3.1e8 (a decimal)
_SCI_RE = re.compile(
    r"(?P<m>-?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot)\s*10\s*\^\s*(?:\{\s*(?P<e>[-+]?\d+)\s*\}|(?P<d>\d))"
)
_PLUS_INFTY_RE = re.compile(r"(^|[,(\[])\+\\infty")
_FRENCH_INTERVAL_RE = re.compile(r"([\]\[])([^\[\]]*,[^\[\]]*)([\]\[])")
_COLON_RE = re.compile(r"\\colon(?![a-zA-Z])|∶")
_MULTI_RATIO_RE = re.compile(r"-?\d+(?:\.\d+)?(?:\s*:\s*-?\d+(?:\.\d+)?){2,}")
_REALS_RE = re.compile(r"\\mathbb\s*\{?\s*R\s*\}?|ℝ")
_ALL_REALS = frozenset(
    ("all real numbers", "all reals", "every real number", "real numbers", "all real x")
)
# Unicode math a model may write instead of LaTeX (each command gets a trailing space so that
# "πr" stays two symbols).
_UNICODE = {
    "−": "-",
    "√": "\\sqrt ",
    "π": "\\pi ",
    "∞": "\\infty ",
    "×": "\\times ",
    "·": "\\cdot ",
    "⋅": "\\cdot ",
    "÷": "\\div ",
    "∈": "\\in ",
    "∪": "\\cup ",
    "∩": "\\cap ",
    "∅": "\\emptyset ",
    "⩽": "≤",
    "⩾": "≥",
    "\u00a0": " ",
}
_UNICODE_TABLE = str.maketrans(_UNICODE)

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


def _reduced_ratio(s: str) -> str:
    """A ratio of three or more numbers in lowest integer terms."""
    parts = [Fraction(p.strip()) for p in s.split(":")]
    scale = math.lcm(*(p.denominator for p in parts))
    ints = [int(p * scale) for p in parts]
    g = math.gcd(*ints) or 1
    return ":".join(str(i // g) for i in ints)


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
    s = _strip_markup(_unwrap_boxed(s))
    s = _canonical_phrasing(s)
    s = _canonical_numbers(s)
    return _compact(s)


def _strip_markup(s: str) -> str:
    """Drop what only typesets: math delimiters, sizing and spacing commands, separators
    inside numbers, degree and percent signs, ``\\text{}`` wrappers, a trailing period."""
    if not s.isascii():
        s = s.translate(_UNICODE_TABLE)
    # math-mode delimiters and dollar signs
    s = s.replace("\\$", "").replace("$", "")
    for delim in ("\\(", "\\)", "\\[", "\\]"):
        s = s.replace(delim, " ")
    s = s.replace("\\displaystyle", " ")
    s = _FRAC_VARIANT_RE.sub(r"\\frac", s)
    s = _LT_RE.sub("<", _GT_RE.sub(">", s))
    s = _APPROX_RE.sub(" ≈ ", s)  # one spelling; what it states is equivalence's (`_approx_value`)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _ARRAY_RE.sub(lambda m: f"\\begin{{pmatrix}}{m.group('body')}\\end{{pmatrix}}", s)
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
    return s.rstrip(".").strip()


def _canonical_phrasing(s: str) -> str:
    """One spelling for what can be said in words: all reals, ratios, lists joined by "or" /
    "and"; trailing units dropped."""
    if s.lower() in _ALL_REALS:
        s = "(-\\infty,\\infty)"
    s = _REALS_RE.sub(lambda _: "(-\\infty,\\infty)", s)
    s = _COLON_RE.sub(":", s)
    if _MULTI_RATIO_RE.fullmatch(s):  # "2:4:6" is "1:2:3"
        s = _reduced_ratio(s)
    m = _RATIO_RE.fullmatch(s)
    if m:  # "3:4", "3 to 4": the ratio's value (4:3 stays different)
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    s = _OR_RE.sub(",", s)  # "x = 2 or x = 3": the list of both (never one of them)
    if " and " in s and not _RELATION_RE.search(s):
        s = _AND_RE.sub(",", s)
    s = _strip_units(s)
    return s.rstrip(".").strip()


def _canonical_numbers(s: str) -> str:
    """Scientific notation, thousands separators and mixed numbers as plain numbers;
    infinity and the relations as one symbol each."""
    m = _SCI_RE.fullmatch(s)
    if m:  # an integer stays exact (2 \\times 10^3 is 2000); a decimal mantissa is rounded
        mantissa, exponent = m.group("m"), int(m.group("e") or m.group("d"))
        if "." not in mantissa and 0 <= exponent <= 50:
            s = str(int(mantissa) * 10**exponent)
        else:
            s = f"{mantissa}e{exponent}"
    if _THOUSANDS_RE.fullmatch(s) or _SPACE_THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "").replace(" ", "")
    m = _MIXED_SPACE_RE.fullmatch(s)
    if m:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    s = _INFTY_RE.sub(r"\\infty", s)
    s = _LE_RE.sub("≤", s)
    s = _GE_RE.sub("≥", s)
    return _NE_RE.sub("≠", s)


def _compact(s: str) -> str:
    """Remove whitespace, then brace the short forms (``\\frac12``, ``\\sqrt2``) and spell
    empty sets and intervals one way; no leading plus sign or trailing period."""
    # remove whitespace, keeping a separator between a command and a following letter
    s = _CMD_SPACE_RE.sub(lambda mm: mm.group(1) + "\x00", s)
    s = _WS_RE.sub("", s).replace("\x00", " ")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT2_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT3_RE.sub(r"\\frac{\1}{", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = _EMPTYSET_RE.sub(r"\\emptyset", s)
    s = _PLUS_INFTY_RE.sub(r"\1\\infty", s)
    m = _FRENCH_INTERVAL_RE.fullmatch(s)
    if m:  # ]1,2] is (1,2]; [1,2[ is [1,2)
        s = ("(" if m.group(1) == "]" else "[") + m.group(2) + (")" if m.group(3) == "[" else "]")
    if s.startswith("+"):
        s = s[1:]
    return s.rstrip(".")
