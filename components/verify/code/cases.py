"""Code extraction from a response, and test cases from a ground truth."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from components.core.errors import UserError

__all__ = ["InvalidTestCases", "TestCase", "extract_code", "parse_test_cases"]

_PY_TAGS = frozenset({"python", "py", "python3"})


class InvalidTestCases(UserError):
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
    in_process: bool = False


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
        isolation = spec.get("isolation", "separate")
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise InvalidTestCases("'asserts' must be a list of strings")
        if not isinstance(setup, str):
            raise InvalidTestCases("'setup' must be a string")
        if isolation not in ("separate", "in_process"):
            raise InvalidTestCases(
                f"'isolation' must be 'separate' (the default) or 'in_process', got {isolation!r}"
            )
        in_process = isolation == "in_process"
        cases = [
            TestCase("assert", test=a, setup=setup, in_process=in_process)
            for a in asserts
            if a.strip()
        ]
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
