"""Extraction: the final answer of a model response (the first rule that finds one wins)."""

from __future__ import annotations

import re

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
