"""Numbers: exact for integers and fractions, a relative tolerance once a decimal is involved."""

from __future__ import annotations

import re
from fractions import Fraction

# Relative / absolute tolerance for numeric comparison once a decimal or an irrational
# value is involved.
REL_TOL = 1e-6
ABS_TOL = 1e-9
# Longer numbers are compared as strings only.
_MAX_NUMBER_LEN = 400


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
        _, _, exponent = s.lower().partition("e")
        if exponent and abs(int(exponent)) > _MAX_NUMBER_LEN:
            return None  # 1e99999999 would be built digit by digit: as long as a long number
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
