"""Code verifier: run the Python in a model response against test cases, in a sandbox.

Why a separate module: unlike math answers, code rewards require *executing* what the
policy wrote. Every test case runs in its own fresh sandbox process
(``components.verify.sandbox``): no network, no writes outside a private work dir,
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

import json
import math
import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal

from components.verify.sandbox import (
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
    run_python,
)

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
# float tolerance for function-call results
REL_TOL = 1e-6
ABS_TOL = 1e-9

RewardMode = Literal["all", "fraction"]
_PY_TAGS = frozenset({"python", "py", "python3"})


class InvalidTestCases(ValueError):
    """The ground truth does not describe usable test cases (a data problem)."""


@dataclass(frozen=True)
class TestCase:
    """One test: ``kind`` is ``"stdio"`` (``input`` -> ``expected`` stdout), ``"fn"``
    (``args`` -> ``expected`` return value of ``fn_name``) or ``"assert"`` (``test``)."""

    __test__ = False  # not a pytest class

    kind: Literal["stdio", "fn", "assert"]
    input: str = ""
    expected: Any = None
    fn_name: str = ""
    args: tuple[Any, ...] = ()
    test: str = ""
    setup: str = ""


# ---------------------------------------------------------------------------- extraction


def extract_code(text: str) -> str | None:
    """The code to run: see the module docs. ``None`` when the response has fenced blocks
    but none that is Python (or untagged) and complete."""
    text = text or ""
    if "```" not in text:
        return text if text.strip() else None
    tagged: str | None = None
    untagged: str | None = None
    lang: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                info = stripped[3:].strip().split()
                lang = info[0].lower() if info else ""
                body = []
        elif stripped == "```":
            code = "\n".join(body) + "\n"
            if lang in _PY_TAGS:
                tagged = code
            elif lang == "":
                untagged = code
            lang = None
        else:
            body.append(line)
    return tagged if tagged is not None else untagged


# ---------------------------------------------------------------------------- test cases


def _as_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    return value if isinstance(value, str) else str(value)


def _load_spec(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidTestCases(f"test cases are not valid JSON: {exc}") from exc
    return value


def parse_test_cases(ground_truth: Any, extra_info: dict[str, Any] | None = None) -> list[TestCase]:
    """Test cases from ``ground_truth`` (JSON string or dict), else from
    ``extra_info["test_cases"]``. Raises ``InvalidTestCases`` when neither holds any."""
    spec = _load_spec(ground_truth)
    if not spec and extra_info:
        spec = _load_spec(extra_info.get("test_cases"))
    if not spec:
        raise InvalidTestCases(
            "no test cases: pass them as ground_truth (JSON) or extra_info['test_cases']"
        )
    if isinstance(spec, list) and all(isinstance(s, str) for s in spec):
        spec = {"asserts": spec}
    if not isinstance(spec, dict):
        raise InvalidTestCases(f"test cases must be a JSON object, got {type(spec).__name__}")
    if "asserts" in spec:
        asserts = spec["asserts"]
        setup = spec.get("setup") or ""
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise InvalidTestCases("'asserts' must be a list of strings")
        if not isinstance(setup, str):
            raise InvalidTestCases("'setup' must be a string")
        cases = [TestCase("assert", test=a, setup=setup) for a in asserts if a.strip()]
    else:
        inputs, outputs = spec.get("inputs"), spec.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise InvalidTestCases(
                "test cases need 'inputs' and 'outputs' lists (or an 'asserts' list); "
                f"got keys {sorted(spec)}"
            )
        if len(inputs) != len(outputs):
            raise InvalidTestCases(f"{len(inputs)} inputs but {len(outputs)} outputs")
        fn_name = spec.get("fn_name")
        if fn_name:
            if not isinstance(fn_name, str) or not fn_name.isidentifier():
                raise InvalidTestCases(f"'fn_name' must be an identifier, got {fn_name!r}")
            cases = [
                TestCase(
                    "fn",
                    fn_name=fn_name,
                    args=tuple(i) if isinstance(i, list) else (i,),
                    expected=o,
                )
                for i, o in zip(inputs, outputs, strict=True)
            ]
        else:
            cases = [
                TestCase("stdio", input=_as_text(i), expected=_as_text(o))
                for i, o in zip(inputs, outputs, strict=True)
            ]
    if not cases:
        raise InvalidTestCases("the test case list is empty")
    return cases


# ------------------------------------------------------------------------------- harness

# Runs inside the sandbox for "fn" and "assert" cases. The result line is prefixed by a
# random marker read from stdin before the solution runs, so the solution cannot print a
# fake result without digging the marker out of the harness's memory. For asserts of the
# form ``assert a == b`` the two sides are compared as plain data when both are built-in
# values, and a user-defined object never equals plain data, so a solution cannot pass by
# returning an object whose ``__eq__`` always says True.
_HARNESS = r"""
import json
import os
import sys


def _main():
    marker = sys.stdin.readline().rstrip("\n")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "case.json"), encoding="utf-8") as f:
        case = json.load(f)
    with open(os.path.join(here, "solution.py"), encoding="utf-8") as f:
        source = f.read()
    dumps, write, flush = json.dumps, os.write, sys.stdout.flush
    plain_types = (type(None), bool, int, float, str, list, tuple, dict, set, frozenset)

    def plain(x, depth=0):
        t = type(x)
        if t not in plain_types or depth > 100:
            raise TypeError("not plain: " + t.__name__)
        if t in (list, tuple):
            return [plain(v, depth + 1) for v in x]
        if t in (set, frozenset):
            items = [plain(v, depth + 1) for v in x]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=repr)
        if t is dict:
            return {str(k): plain(v, depth + 1) for k, v in x.items()}
        return x

    def report(payload):
        flush()
        write(1, ("\n" + marker + dumps(payload) + "\n").encode("utf-8"))

    import ast

    scope = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "solution.py", "exec"), scope)
    except BaseException as exc:
        report({"error": "solution raised " + type(exc).__name__ + ": " + str(exc)[:300]})
        return
    if case["kind"] == "fn":
        name = case["fn_name"]
        fn = scope.get(name)
        if not callable(fn):
            cls = scope.get("Solution")
            fn = getattr(cls(), name, None) if isinstance(cls, type) else None
        if not callable(fn):
            report({"error": "function " + repr(name) + " not found"})
            return
        try:
            result = fn(*case["args"])
        except BaseException as exc:
            report({"error": type(exc).__name__ + ": " + str(exc)[:300]})
            return
        try:
            report({"result": plain(result)})
        except (TypeError, ValueError, RecursionError) as exc:
            report({"error": "result is not plain data (" + str(exc)[:100] + ")"})
        return
    try:
        if case.get("setup"):
            exec(compile(case["setup"], "<setup>", "exec"), scope)
        tree = ast.parse(case["test"], "<test>", "exec")
        for node in tree.body:
            test = node.test if isinstance(node, ast.Assert) else None
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
            ):
                left = eval(compile(ast.Expression(test.left), "<test>", "eval"), scope)
                right = eval(
                    compile(ast.Expression(test.comparators[0]), "<test>", "eval"), scope
                )
                try:
                    ok = plain(left) == plain(right)
                except (TypeError, RecursionError):
                    # user-defined values on both sides: their own __eq__ decides; plain
                    # data on one side only never equals a user-defined object
                    ok = (
                        type(left) not in plain_types
                        and type(right) not in plain_types
                        and (left == right) is True
                    )
                if not ok:
                    report({"ok": False, "error": "assertion failed: " + repr(left)[:200]})
                    return
            else:
                module = ast.Module(body=[node], type_ignores=[])
                exec(compile(module, "<test>", "exec"), scope)
    except AssertionError as exc:
        report({"ok": False, "error": "assertion failed " + str(exc)[:200]})
        return
    except BaseException as exc:
        report({"ok": False, "error": type(exc).__name__ + ": " + str(exc)[:300]})
        return
    report({"ok": True})


_main()
"""


# ----------------------------------------------------------------------------- comparing


def _normalize_stdout(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _values_equal(actual: Any, expected: Any) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        if isinstance(actual, int) and isinstance(expected, int):
            return actual == expected
        a, e = float(actual), float(expected)
        if math.isnan(a) or math.isnan(e):
            return math.isnan(a) and math.isnan(e)
        return math.isclose(a, e, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(actual, list) and isinstance(expected, list | tuple):
        return len(actual) == len(expected) and all(
            _values_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == {str(k) for k in expected} and all(
            _values_equal(actual[str(k)], v) for k, v in expected.items()
        )
    return actual == expected


def _fn_result_ok(actual: Any, expected: Any) -> bool:
    if _values_equal(actual, expected):
        return True
    # TACO / APPS wrap a single return value in a list
    return isinstance(expected, list) and len(expected) == 1 and _values_equal(actual, expected[0])


def _harness_payload(run: RunResult, marker: str) -> dict[str, Any] | None:
    idx = run.stdout.rfind(marker)
    if idx < 0:
        return None
    line = run.stdout[idx + len(marker) :].split("\n", 1)[0]
    try:
        payload = json.loads(line)
    except json.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _run_failure(run: RunResult) -> str | None:
    if run.timed_out:
        return "timeout"
    if run.output_exceeded:
        return "output limit exceeded"
    return None


def _run_case(code: str, case: TestCase, config: SandboxConfig) -> str | None:
    """None if the case passed, else a short reason."""
    if case.kind == "stdio":
        run = run_python(code, case.input, config)
        failure = _run_failure(run)
        if failure:
            return failure
        if run.returncode != 0:
            tail = run.stderr.strip().splitlines()[-1:] or [""]
            return f"exit code {run.returncode} {tail[0][:200]}".rstrip()
        if _normalize_stdout(run.stdout) != _normalize_stdout(case.expected):
            return "wrong answer"
        return None
    marker = "@@rlvr-result-" + secrets.token_hex(16) + "@@"
    if case.kind == "fn":
        spec: dict[str, Any] = {"kind": "fn", "fn_name": case.fn_name, "args": list(case.args)}
    else:
        spec = {"kind": "assert", "test": case.test, "setup": case.setup}
    files = {"solution.py": code, "case.json": json.dumps(spec)}
    run = run_python(_HARNESS, marker + "\n", config, files=files)
    failure = _run_failure(run)
    if failure:
        return failure
    payload = _harness_payload(run, marker)
    if payload is None:
        tail = run.stderr.strip().splitlines()[-1:] or [""]
        return f"no result (exit code {run.returncode}) {tail[0][:200]}".rstrip()
    if payload.get("error") and "ok" not in payload:
        return str(payload["error"])
    if case.kind == "fn":
        return None if _fn_result_ok(payload.get("result"), case.expected) else "wrong answer"
    return None if payload.get("ok") is True else str(payload.get("error") or "failed")


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
    if code is None:
        return {
            "score": 0.0,
            "extracted_answer": None,
            "passed": 0,
            "total": total,
            "error": "no Python code block found in the response",
        }
    cfg = replace(config or SandboxConfig(), timeout_s=timeout_s, memory_mb=memory_mb)
    passed = 0
    first_error: str | None = None
    for i, case in enumerate(cases):
        reason = _run_case(code, case, cfg)
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
    }
