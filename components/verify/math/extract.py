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


_DISPLAY_OPENINGS = (("$$", "$$"), ("\\[", "\\]"))
# what makes a display block one of several candidates: "or" / "and", or another block
# (a line "and this completes the proof" is not one)
_NEXT_CANDIDATE_RE = re.compile(
    r"\s*(?:\$\$|\\\[|(?:\\text\{\s*)?(?:or|and)\s*\}?\s*(?:\$|\\\[|\\\(|[-+]?\d|$))",
    re.IGNORECASE,
)


def _display_block(text: str) -> str | None:
    """The display-math block ``text`` opens with (``$$...$$`` or ``\\[...\\]``, over one
    line or several), on one line; None when it opens with something else, or when its line
    goes on after it (``$$5$$ or $$7$$``, ``$$5$$ hmm, no: 7``) or the next line offers
    another candidate (`_display_hedge`): then the block is not all of the answer."""
    text = text.strip()
    for opening, closing in _DISPLAY_OPENINGS:
        if text.startswith(opening):
            end = text.find(closing, len(opening))
            if end < 0:
                return None
            after = text[end + len(closing) :].split("\n", 1)[0]
            if after.strip(" \t.,;!*") or _display_hedge(text):
                return None
            return " ".join(text[: end + len(closing)].split())
    return None


def _display_hedge(text: str) -> bool:
    """``text`` opens with a display block whose next line offers another candidate
    (``$$5$$`` / ``or`` / ``$$7$$``, ``$$5$$`` / ``$$7$$``): a hedge, not an answer."""
    text = text.strip()
    for opening, closing in _DISPLAY_OPENINGS:
        if text.startswith(opening):
            end = text.find(closing, len(opening))
            if end < 0:
                return False
            rest = text[end + len(closing) :].split("\n", 1)
            return len(rest) == 2 and bool(_NEXT_CANDIDATE_RE.match(rest[1]))
    return False


def _clean_phrase_answer(raw: str) -> str | None:
    """Trim a "the answer is ..." capture to the answer itself: a display block it opens with,
    or its first sentence, and when that is a sentence about the answer ("The volume of the box
    is 120", "the number of ways, which is 10"), the value after its last "is"."""
    block = _display_block(raw)
    if block is not None:
        return _strip_math_delims(block) or None
    if _display_hedge(raw):
        return None
    line = _strip_remark(raw.strip().split("\n", 1)[0])
    m = _SENTENCE_END_RE.search(line)
    if m:
        line = line[: m.start()]
    line = line.strip().strip("*").strip()
    m = re.search(r"\bis\s+(?P<x>[^\s].*)$", line)
    if m and re.search(r"[A-Za-z]{3,}", line[: m.start()]):
        line = m.group("x").strip()
    if line.startswith("$") and not line.startswith("$$") and line.count("$") >= 2:
        line = line[1 : line.index("$", 1)]
    line = _strip_math_delims(line)
    return line or None


# Chat-template and end-of-text markers: whatever follows one is not the response any more
# (a model that runs on into the next turn).
_DEBRIS_RE = re.compile(
    r"<\|(?:im_end|im_start|endoftext|eot_id|end_of_text|end|eos|start_header_id)\|>|</s>"
    r"|<end_of_turn>|<start_of_turn>"
)
# "Answer: X", "**Final answer:** X", "### Final Answer", "ANSWER - X" at the start of a line.
_LABEL_RE = re.compile(
    r"^[ \t>#*_]*(?:final\s+)?answer[ \t*_]*(?:[:：=\-][ \t*_]*|(?=\\\[|\$)|(?=[ \t*_]*$))"
    r"(?P<rest>[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
# The last line of a finished derivation: "Hence the remainder is 3." / "So x = 5."
_CONCLUSION_RE = re.compile(
    r"^\W*(?:hence|thus|therefore|so|finally)\b[^\n]*?(?:\bis|=|\bequals)\s+(?P<x>[^\n]+?)\s*\.?$",
    re.IGNORECASE,
)
# A line that is only a value: a number, or a short math expression without words.
_BARE_VALUE_RE = re.compile(r"[-+]?[\d.]+|[-+\w\\{}()^/.,\[\]:\s*!|='<>≤≥−√π∞∈∪×·%°$]{1,80}")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_MATH_WORDS = frozenset(
    "frac dfrac tfrac cfrac sqrt pi infty cdot times sin cos tan log ln exp pm mp le ge lt gt "
    "leq geq neq left right circ text mathrm boxed in cup infty approx mid emptyset "
    "varnothing colon oo or and to".split()
)


def _strip_math_delims(s: str) -> str:
    s = s.strip().strip("*").strip()
    for a, b in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b):
            s = s[len(a) : len(s) - len(b)].strip()
    return s.strip().rstrip(".").strip()


def _looks_like_a_value(s: str) -> bool:
    """A bare answer: no words other than LaTeX commands (``\\frac12``, ``(2, 3)``, ``64``)."""
    if not s or len(s) > 80 or not _BARE_VALUE_RE.fullmatch(s):
        return False
    words = [w for w in _WORD_RE.findall(s) if w.lower() not in _MATH_WORDS]
    return not words


def _label_answer(text: str) -> str | None:
    """The value after the last answer label ("Answer: X"), on its line or, when the label
    ends its line, on the next non-empty line(s) (a display-math block)."""
    last = None
    for last in _LABEL_RE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    rest = last.group("rest").strip()
    if not rest.strip("*$ "):
        # the value on the next line(s): a display block, over several lines or one
        after = text[last.end() :].strip()
        if _display_hedge(after):
            return None
        rest = _display_block(after) or after.split("\n", 1)[0]
    sentence = _clean_phrase_answer(rest)
    if sentence is None:
        return None
    value = _strip_math_delims(sentence)
    return value or None


_MATH_SPAN_RE = re.compile(
    r"\$\$(?P<a>.+?)\$\$|\\\[(?P<b>.+?)\\\]|\\\((?P<c>.+?)\\\)|\$(?P<d>[^$]+?)\$", re.DOTALL
)
# What may join the spans of a multi-part answer: "$x = 2$ or $x = 3$", "$1$, $4$ and $9$".
_JOINER_RE = re.compile(r"\s*(?:,\s*)?(?:(?:or|and)\s*)?|\s*,\s*", re.IGNORECASE)
# A statement of the value: the last "is" / "are" / "=" / "equals" / "be" / "at" of a sentence.
_CUE_RE = re.compile(r"(?:\b(?:is|are|was|were|equals?|be|at|gives|get|obtain)\b|=)\s+")
_HEDGE_RE = re.compile(
    r"^(?:about|approximately|exactly|precisely|just|only|simply|all|then|therefore|thus|"
    r"still|now|clearly|indeed|equal\s+to|given\s+by)\s+",
    re.IGNORECASE,
)
_REMARK_RE = re.compile(r"\s+\((?=[^()]*(?<![\\A-Za-z])[A-Za-z]{3})[^()]*\)[\s.!]*$")
_TRAILING_WORDS_RE = re.compile(r"(?:\s+[A-Za-z][A-Za-z.-]*){1,3}\s*$")


def _final_sentence(text: str) -> str:
    """The last sentence of a response: its last line (or display block), cut after the last
    sentence end that is not inside math."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    last = lines[-1]
    if last in ("$$", "\\]") and len(lines) >= 3:  # a display block on its own lines
        opening = "$$" if last == "$$" else "\\["
        for k in range(len(lines) - 2, -1, -1):
            if lines[k] == opening:
                head = lines[k - 1] if k >= 1 and not lines[k - 1].endswith(".") else ""
                body = " ".join(lines[k + 1 : -1])
                last = f"{head} {opening}{body}{last}".strip()
                break
    # cut at the last ". " that is outside math spans
    masked = _MATH_SPAN_RE.sub(lambda m: "x" * len(m.group(0)), last)
    cut = 0
    for m in re.finditer(r"[.!?:]\s+(?=\S)", masked):
        cut = m.end()
    return last[cut:].strip()


def _strip_remark(s: str) -> str:
    """Drop a trailing parenthetical remark: "8 outcomes (out of the 36 possible)"."""
    return _REMARK_RE.sub("", s).strip()


def _span_answer(sentence: str) -> str | None:
    """The math span(s) a sentence ends with: the last span, or several joined by "or",
    "and" or commas ("$x = 2$ or $x = 3$"); a few trailing words (units) may follow."""
    spans = list(_MATH_SPAN_RE.finditer(sentence))
    if not spans:
        return None
    tail = _strip_remark(sentence[spans[-1].end() :]).strip(" .,;!*")
    if tail and (len(tail.split()) > 3 or re.search(r"[\d=$\\]", tail)):
        return None  # "... $x = 5$ into the equation and simplify": not a conclusion
    picked = [spans[-1]]
    for prev in reversed(spans[:-1]):
        gap = sentence[prev.end() : picked[0].start()]
        if not _JOINER_RE.fullmatch(gap) or not gap.strip():
            break
        picked.insert(0, prev)
    values = [_strip_math_delims(m.group(0)) for m in picked]
    return ", ".join(v for v in values if v) or None


def _stated_value(sentence: str) -> str | None:
    """The value a plain-text sentence states after its last cue word ("The minimum value is
    -7.", "So there are 10000 combinations.", "The possible values are 9, 4, and 1.")."""
    cues = list(_CUE_RE.finditer(sentence))
    if not cues:
        return None
    value = _strip_remark(sentence[cues[-1].end() :].strip().rstrip(".!").strip(" *"))
    value = _HEDGE_RE.sub("", value)
    value = re.sub(r",?\s+(?:and|or)\s+", ", ", value)  # "9, 4, and 1": a list
    if _looks_like_a_value(value):
        return value
    words = _TRAILING_WORDS_RE.search(value)
    if words and re.search(r"\d", value[: words.start()]):
        head = value[: words.start()].strip()
        if _looks_like_a_value(head):
            return value  # the unit words go in normalization
    return None


def _last_line_answer(text: str) -> tuple[str | None, str | None]:
    """A response that ends in a conclusion: a line that is only a value, a last sentence
    that ends in math ("So the lines meet at $(1, 3)$."), or one that states a value
    ("The minimum value is -7.")."""
    sentence = _final_sentence(text)
    if not sentence:
        return None, None
    value = _strip_math_delims(_strip_remark(sentence))
    if _looks_like_a_value(value):
        return value, "last_line"
    value = _span_answer(sentence)
    if value is not None:
        return value, "final_sentence"
    m = _CONCLUSION_RE.match(sentence)
    if m:
        value = _strip_math_delims(m.group("x"))
        if _looks_like_a_value(value):
            return value, "conclusion"
    value = _stated_value(sentence)
    if value is not None:
        return value, "final_sentence"
    return None, None


def extract_answer(text: str) -> tuple[str | None, str | None]:
    """Extract the final answer from a model response.

    Returns ``(answer, rule)`` where ``rule`` names the rule that fired, in this order:
    ``"boxed"`` (last ``\\boxed{...}`` with balanced braces), ``"fbox"``,
    ``"answer_phrase"`` ("final answer is X" / "the answer is X", last occurrence),
    ``"answer_label"`` ("Answer: X", "**Final answer:** X", "### Final Answer" over a display
    block), ``"gsm8k"`` (``#### X``), ``"conclusion"`` (a last line "Hence ... is X") and
    ``"last_line"`` (a last line that is only a value). Chat-template debris (``<|im_end|>``,
    ``<|im_start|>``, ``<|endoftext|>``, ...) ends the response. ``(None, None)`` when nothing
    matches.
    """
    if not text:
        return None, None
    m = _DEBRIS_RE.search(text)
    if m:
        text = text[: m.start()]
        if not text.strip():
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
    ans = _label_answer(text)
    if ans is not None:
        return ans, "answer_label"
    if "####" in text:
        matches = _GSM8K_RE.findall(text)
        if matches:
            ans = matches[-1].strip().rstrip(".").strip()
            if ans:
                return ans, "gsm8k"
    return _last_line_answer(text)
