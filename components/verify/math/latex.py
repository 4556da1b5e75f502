"""LaTeX to plain sympy-parsable text: the first step of the symbolic fallback
(components/verify/math/symbolic.py). Commands become functions and constants, groups and scripts
become parenthesised arguments and powers, Greek letters become names; what cannot be read gives
None. Pure string work: no sympy here."""

from __future__ import annotations

import re

from components.verify.math.structure import _matching_close

FUNCS = {
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
GREEK = {
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
IDENT_RE = re.compile(r"[A-Za-z]+(?:_[A-Za-z0-9]+)?")


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
    plain = latex_to_plain(g[0])
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
    arg = latex_to_plain(arg_src)
    if arg is None or not arg.strip():
        return None
    text = f" {func}({arg})" if base is None else f" log({arg},{base})"
    if power is not None:
        text = f"(({text})**({power}))"
    return text, end


def _fraction(s: str, i: int, name: str) -> tuple[str, int] | None:
    """``\\frac`` or ``\\binom`` with its two groups starting at ``s[i]``."""
    a = _read_group(s, i)
    if a is None:
        return None
    b = _read_group(s, a[1])
    if b is None:
        return None
    pa, pb = latex_to_plain(a[0]), latex_to_plain(b[0])
    if pa is None or pb is None:
        return None
    return (f"(({pa})/({pb}))" if name == "frac" else f"binomial({pa},{pb})"), b[1]


def _root(s: str, i: int) -> tuple[str, int] | None:
    """``\\sqrt{x}`` or ``\\sqrt[n]{x}`` starting after the command name."""
    n = len(s)
    root = None
    if i < n and s[i] == "[":
        j = s.find("]", i)
        if j < 0:
            return None
        root = latex_to_plain(s[i + 1 : j])
        if root is None:
            return None
        i = j + 1
    a = _read_group(s, i)
    if a is None:
        return None
    pa = latex_to_plain(a[0])
    if pa is None:
        return None
    return (f"sqrt({pa})" if root is None else f"(({pa})**(1/({root})))"), a[1]


def _command(s: str, i: int) -> tuple[str, int] | None:
    """The command starting with the backslash at ``s[i]`` (and its arguments) as plain
    math, and where it ends; None for a command outside the supported subset."""
    n = len(s)
    m = re.match(r"\\([a-zA-Z]+)", s[i:])
    if not m:
        return None
    name = m.group(1)
    i += len(m.group(0))
    while i < n and s[i] == " ":
        i += 1
    if name == "frac" or name == "binom":
        return _fraction(s, i, name)
    if name == "sqrt":
        return _root(s, i)
    if name in _FUNC_CMDS:
        return _function_application(s, i, _FUNC_CMDS[name])
    if name in _CMD_MAP:
        return " " + _CMD_MAP[name] + " ", i
    if name in GREEK:
        return f" {name} ", i
    return None


def latex_to_plain(s: str) -> str | None:
    """Convert normalized LaTeX-ish math to a string for sympy's ``parse_expr``.

    Returns None when the input uses anything outside the supported, whitelisted subset.
    """
    out: list[str] = []
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            converted = _command(s, i)
            if converted is None:
                return None
            out.append(converted[0])
            i = converted[1]
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
    return _sympy_names("".join(out))


def _ident(m: re.Match[str]) -> str:
    word = m.group(0)
    if word in FUNCS or word in GREEK or "_" in word:
        return f" {word} "
    if len(word) == 1:
        return {"e": " E ", "i": " I "}.get(word, f" {word} ")
    # an unknown multi-letter word is a product of single-letter symbols
    return "(" + "*".join(word) + ")"


def _sympy_names(plain: str) -> str | None:
    """Check the converted text against the allowed characters and spell its names the way
    ``parse_expr`` reads them (``e`` and ``i`` as constants, ``xy`` as ``x*y``)."""
    if not _SYMPY_ALLOWED_RE.fullmatch(plain) or re.search(r"(?<![A-Za-z])_|__", plain):
        return None
    plain = IDENT_RE.sub(_ident, plain)
    # 2x, x2 -> implicit multiplication is left to parse_expr; x2 must not become a name
    plain = re.sub(r"(?<![A-Za-z_])([A-Za-z])\s*(\d)", r"\1*\2", plain)
    return plain
