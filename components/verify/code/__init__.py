"""Code verifier: run the Python in a model response against test cases, in a sandbox.

Why a separate module: unlike math answers, code rewards require *executing* what the
policy wrote. Every test case runs in its own fresh sandbox process
(``components.sandbox``): no network, no writes outside a private work dir,
unprivileged uid, CPU / memory / process / file / output limits and a wall-clock kill.

Usage::

    from components.verify.code import compute_score
    compute_score(response, '{"inputs": ["1 2\\n"], "outputs": ["3\\n"]}')
    # {"score": 1.0, "extracted_answer": "a, b = ...", "passed": 1, "total": 1, "error": None}

Code extraction: the last fenced block tagged ``python`` / ``py`` / ``python3``; else
the last untagged fenced block; else, when the response has no ``` fence at all, the
whole response. Blocks tagged with another language and unterminated blocks (a truncated
response) are never run.

Test cases (``ground_truth`` as a JSON string or dict, else ``extra_info["test_cases"]``):

* stdin/stdout: ``{"inputs": [stdin, ...], "outputs": [stdout, ...]}``. The program runs
  as ``__main__``; stdout is compared with trailing whitespace stripped from each line and
  trailing blank lines dropped.
* function calls: ``{"fn_name": "f", "inputs": [[args], ...], "outputs": [ret, ...]}``.
  ``f`` is a top-level function or a method of a class ``Solution``. The return value is
  JSON-serialized *inside* the sandbox and compared in the verifier process (floats with
  a 1e-6 relative tolerance; an expected ``[x]`` also accepts ``x``, as in TACO/APPS).
* asserts: ``{"asserts": ["assert f(1) == 2", ...], "setup": "import math"}`` (``setup``
  optional). Each assert runs after the solution's definitions.

Reward: ``reward_mode="all"`` gives 1.0 only if every test passes (and stops at the first
failure); ``"fraction"`` gives passed / total.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from components.sandbox import SandboxConfig, SandboxUnavailable
from components.verify.code.cases import (
    InvalidTestCases,
    TestCase,
    extract_code,
    parse_test_cases,
)
from components.verify.code.run import run_case

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "InvalidTestCases",
    "TestCase",
    "compute_score",
    "extract_code",
    "parse_test_cases",
    "score_or_raise",
]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
# extracted_answer carries the code, truncated to this many characters
MAX_EXTRACTED_CHARS = 2000
RewardMode = Literal["all", "fraction"]


# ----------------------------------------------------------------------------------- API


def _truncate(code: str | None) -> str | None:
    if code is None or len(code) <= MAX_EXTRACTED_CHARS:
        return code
    return code[:MAX_EXTRACTED_CHARS] + "..."


def score_or_raise(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    reward_mode: RewardMode = "all",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    config: SandboxConfig | None = None,
) -> dict[str, Any]:
    """Like ``compute_score``, but problems that are not the response's fault raise:
    ``InvalidTestCases`` (a ``ValueError``) for unusable test cases and
    ``SandboxUnavailable`` when the sandbox cannot run code on this machine. This is the
    registry's ``"code"`` verifier, so such samples count as verifier errors in the
    verify stage instead of passing silently as zero rewards."""
    if reward_mode not in ("all", "fraction"):
        raise ValueError(f"reward_mode must be 'all' or 'fraction', got {reward_mode!r}")
    cases = parse_test_cases(ground_truth, extra_info)
    code = extract_code(solution_str)
    total = len(cases)
    isolation = "in_process" if any(c.in_process for c in cases) else "separate"
    if code is None:
        return {
            "score": 0.0,
            "extracted_answer": None,
            "passed": 0,
            "total": total,
            "error": "no Python code block found in the response",
            "isolation": isolation,
        }
    cfg = replace(config or SandboxConfig(), timeout_s=timeout_s, memory_mb=memory_mb)
    passed = 0
    first_error: str | None = None
    for i, case in enumerate(cases):
        reason = run_case(code, case, cfg)
        if reason is None:
            passed += 1
            continue
        if first_error is None:
            first_error = f"test {i}: {reason}"
        if reward_mode == "all":
            break
    if reward_mode == "all":
        score = 1.0 if passed == total else 0.0
    else:
        score = passed / total
    return {
        "score": score,
        "extracted_answer": _truncate(code),
        "passed": passed,
        "total": total,
        "error": first_error,
        "isolation": isolation,
    }


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    reward_mode: RewardMode = "all",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    config: SandboxConfig | None = None,
) -> dict[str, Any]:
    """Score a response by running its code against the test cases.

    Returns ``{"score", "extracted_answer", "passed", "total", "error"}``: ``score`` per
    ``reward_mode``; ``extracted_answer`` the code that ran (truncated); ``error`` None
    when every test passed, otherwise why the first failing test failed ("test 2: wrong
    answer", "test 0: timeout", ...) or why nothing ran ("no Python code block ...",
    "invalid test cases: ...", "sandbox unavailable: ..."). Never raises for those;
    ``score_or_raise`` is the strict variant. ``timeout_s`` and ``memory_mb`` apply per
    test; ``config`` sets the other sandbox limits and policy.
    """
    try:
        return score_or_raise(
            solution_str,
            ground_truth,
            extra_info,
            reward_mode=reward_mode,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            config=config,
        )
    except InvalidTestCases as exc:
        error = f"invalid test cases: {exc}"
    except SandboxUnavailable as exc:
        error = str(exc)
    code = extract_code(solution_str)
    return {
        "score": 0.0,
        "extracted_answer": _truncate(code),
        "passed": 0,
        "total": 0,
        "error": error,
        "isolation": None,
    }
