"""Format reward and DAPO's soft overlong penalty.

Why: R1-style training often adds a small reward for following the output format
(reasoning in ``<think>...</think>``, then a clearly marked answer), and DAPO
(arXiv 2503.14476, "Overlong Reward Shaping") penalizes responses that run into the
length limit with a linear ramp instead of a cliff. Both are cheap, pure functions.

``format_score`` is registered as the ``"format"`` verifier; ``soft_overlong_penalty``
needs the response length in tokens, which the verifier signature does not carry, so the
verify stage adds it to the reward itself (``verify.overlong_penalty``, the reward
component ``overlong``; see components/verify/scoring.py).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from components.verify.math import extract_answer

__all__ = ["format_score", "soft_overlong_penalty"]

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def _default_format(text: str) -> tuple[bool, str | None]:
    """``<think>...</think>`` first, exactly once, then an answer: one non-empty
    ``<answer>...</answer>`` or a ``\\boxed{...}`` with balanced braces."""
    if not text.startswith(_THINK_OPEN):
        return False, None
    if text.count(_THINK_OPEN) != 1 or text.count(_THINK_CLOSE) != 1:
        return False, None
    tail = text[text.index(_THINK_CLOSE) + len(_THINK_CLOSE) :]
    if "<answer>" in tail or "</answer>" in tail:
        answers = _ANSWER_RE.findall(tail)
        if (
            len(answers) != 1
            or tail.count("<answer>") != 1
            or tail.count("</answer>") != 1
            or not answers[0].strip()
        ):
            return False, None
        return True, answers[0].strip()
    answer, rule = extract_answer(tail)
    if rule == "boxed" and answer:
        return True, answer
    return False, None


def format_score(
    solution_str: str,
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    *,
    pattern: str | None = None,
) -> dict[str, Any]:
    """1.0 if the response follows the format, else 0.0.

    Default format (checked on the response with surrounding whitespace stripped): it
    starts with ``<think>``, contains exactly one ``<think>`` and one ``</think>``, and
    after ``</think>`` comes either exactly one non-empty ``<answer>...</answer>`` or a
    ``\\boxed{...}`` with balanced braces. ``extracted_answer`` is that answer.

    ``pattern`` (or ``extra_info["format_pattern"]`` when ``pattern`` is None) replaces
    the default: a regular expression that must match the whole stripped response
    (``re.fullmatch`` with ``re.DOTALL``); ``extracted_answer`` is then its first group,
    if it has one. ``ground_truth`` is ignored: the format reward does not judge
    correctness.
    """
    text = (solution_str or "").strip()
    if pattern is None and extra_info:
        pattern = extra_info.get("format_pattern")
    if pattern is not None:
        m = _compile(pattern).fullmatch(text)
        extracted = m.group(1) if m and m.re.groups else None
        return {"score": 1.0 if m else 0.0, "extracted_answer": extracted}
    ok, answer = _default_format(text)
    return {"score": 1.0 if ok else 0.0, "extracted_answer": answer}


def soft_overlong_penalty(
    response_length: int, *, max_length: int, buffer: int, penalty: float = 1.0
) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), scaled by ``penalty``.

    With ``L = response_length``, ``L_max = max_length`` and ``L_cache = buffer``:
    ``0`` when ``L <= L_max - L_cache``; ``-penalty * (L - (L_max - L_cache)) / L_cache``
    while ``L_max - L_cache < L <= L_max`` (reaching ``-penalty`` at ``L_max``);
    ``-penalty`` when ``L > L_max``. ``buffer=0`` makes it a step at ``max_length``.
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    if not 0 <= buffer <= max_length:
        raise ValueError(f"buffer must be in [0, max_length={max_length}], got {buffer}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")
    if response_length < 0:
        raise ValueError(f"response_length must be >= 0, got {response_length}")
    start = max_length - buffer
    if response_length <= start:
        return 0.0
    if response_length > max_length:
        return -float(penalty)
    return -float(penalty) * (response_length - start) / buffer
