"""Running one test case in the sandbox, and judging it.

* ``stdio``: the program runs once as ``__main__`` with the case's stdin; its stdout is
  compared here, in the verifier's process.
* ``fn``: the solution's process (``harness/server.py``) loads the solution and answers
  one call; the returned value arrives as plain data and is compared here.
* ``assert``: two sandboxes per case. The solution's process answers queries; the tests'
  process (``harness/runner.py``) runs the test code with stand-ins for the solution's
  names and sends the verdict. This process relays queries one way and answers the
  other, strictly in turn, and takes the verdict from the tests' process only.
* ``assert`` with ``"isolation": "in_process"``: the solution and the tests in one
  interpreter (``harness/in_process.py``), marked as such in the result.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from components.sandbox import (
    ChannelClosed,
    ChannelOverflow,
    ChannelTimeout,
    Process,
    RunResult,
    SandboxConfig,
    run_python,
)
from components.verify.code import harness
from components.verify.code.cases import TestCase
from components.verify.code.harness import wire

# float tolerance for function-call results
REL_TOL = 1e-6
ABS_TOL = 1e-9


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
        try:
            a, e = float(actual), float(expected)
        except OverflowError:  # an int beyond float range is not close to a float
            return False
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


def _as_json_data(value: Any, depth: int = 0) -> Any:
    """A decoded return value in the JSON shapes the expected outputs use: tuples as
    lists, sets as sorted lists, dict keys as strings. Raises ``TypeError`` for values
    that have no JSON shape (objects left in the solution's process, bytes)."""
    if depth > wire.MAX_DEPTH:
        raise TypeError("value nested too deeply")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) in (list, tuple):
        return [_as_json_data(v, depth + 1) for v in value]
    if type(value) in (set, frozenset):
        items = [_as_json_data(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if type(value) is dict:
        return {str(k): _as_json_data(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"a {type(value).__name__} is not plain data")


def _refuse_ref(ref: dict[str, Any]) -> Any:
    raise TypeError(f"the solution returned a {ref.get('type', 'module')} object")


def _run_failure(run: RunResult) -> str | None:
    if run.timed_out:
        return "timeout"
    if run.output_exceeded:
        return "output limit exceeded"
    return None


def _stdio(code: str, case: TestCase, config: SandboxConfig) -> str | None:
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


def _frame(kind: bytes, obj: Any) -> tuple[bytes, bytes]:
    return kind, json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _loads(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise wire.WireError(f"unreadable message ({str(exc)[:80]})") from exc


def _solution_error(answer: Any) -> str | None:
    if not isinstance(answer, dict):
        return "protocol error"
    if "error" in answer:
        return str(answer["error"])[:400]
    if "missing" in answer:
        return str(answer["missing"])[:400]
    error = answer.get("raise")
    if isinstance(error, dict):
        return f"{error.get('type')}: {str(error.get('message', ''))[:300]}"
    return None


def _closed(proc: Process, who: str) -> str:
    rc = proc.close()
    return f"{who} exited (exit code {rc})"


def _fn(code: str, case: TestCase, config: SandboxConfig) -> str | None:
    deadline = time.monotonic() + config.timeout_s
    with Process(
        harness.SERVER_MAIN, config, files=harness.server_files(code, config.python is None)
    ) as sol:
        try:
            kind, payload = sol.recv(deadline)
            ready = _loads(payload)
            if kind != b"R" or _solution_error(ready) or "names" not in ready:
                return _solution_error(ready) or "protocol error"
            args = wire.encode(list(case.args), _refuse_ref)
            sol.send(*_frame(b"Q", {"op": "fn", "name": case.fn_name, "args": args}), deadline)
            kind, payload = sol.recv(deadline)
            answer = _loads(payload)
            if kind != b"R" or _solution_error(answer):
                return _solution_error(answer) or "protocol error"
            actual = _as_json_data(wire.decode(answer.get("value"), _refuse_ref))
        except ChannelTimeout:
            return "timeout"
        except ChannelOverflow:
            return "output limit exceeded"
        except ChannelClosed:
            return _closed(sol, "the solution's process")
        except (wire.WireError, TypeError, ValueError, ArithmeticError, RecursionError) as exc:
            return f"result is not plain data ({str(exc)[:120]})"
    try:
        return None if _fn_result_ok(actual, case.expected) else "wrong answer"
    except (ArithmeticError, RecursionError, TypeError, ValueError):
        return "wrong answer"  # e.g. an int too large for a float next to a float


_STARTERS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_STARTERS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # a verifier worker forked while another thread held the lock must not inherit it held
    global _STARTERS_LOCK
    _STARTERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _starter() -> concurrent.futures.ThreadPoolExecutor:
    """A thread that lives as long as this process (one per process, so a forked verifier
    worker makes its own). Long-lived on purpose: a sandbox dies with the thread that
    started it (``PR_SET_PDEATHSIG`` follows the thread), so a short-lived pool would
    take its sandboxes down when it exits."""
    pid = os.getpid()
    with _STARTERS_LOCK:
        if pid not in _STARTERS:
            _STARTERS[pid] = concurrent.futures.ThreadPoolExecutor(1, "rlvr-sandbox-start")
        return _STARTERS[pid]


@contextlib.contextmanager
def _both(
    first: tuple[str, dict[str, str]], second: tuple[str, dict[str, str]], config: SandboxConfig
) -> Iterator[tuple[Process, Process]]:
    """Start two sandboxed processes at once (building a sandbox is mostly waiting on
    the kernel, so the second one's set-up overlaps the first's); close both after."""
    later = _starter().submit(Process, second[0], config, files=second[1])
    try:
        proc_a = Process(first[0], config, files=first[1])
    except BaseException:
        with contextlib.suppress(BaseException):
            later.result().close()
        raise
    try:
        proc_b = later.result()
    except BaseException:
        proc_a.close()
        raise
    with proc_a, proc_b:
        yield proc_a, proc_b


def _asserts(code: str, case: TestCase, config: SandboxConfig) -> str | None:
    deadline = time.monotonic() + config.timeout_s
    tests = json.dumps({"test": case.test, "setup": case.setup})
    with _both(
        (harness.SERVER_MAIN, harness.server_files(code, config.python is None)),
        (harness.RUNNER_MAIN, harness.runner_files(tests, config.python is None)),
        config,
    ) as (sol, tst):
        side = "the solution's process"
        try:
            kind, ready = sol.recv(deadline)
            error = _solution_error(_loads(ready))
            if kind != b"R" or error:
                return error or "protocol error"
            side = "the test process"
            tst.send(b"R", ready, deadline)
            while True:
                side = "the test process"
                kind, payload = tst.recv(deadline)
                if kind == b"V":
                    verdict = _loads(payload)
                    if isinstance(verdict, dict) and verdict.get("ok") is True:
                        return None
                    return str(verdict.get("error") if isinstance(verdict, dict) else "failed")
                if kind != b"Q":
                    return "protocol error (test process)"
                side = "the solution's process"
                sol.send(b"Q", payload, deadline)
                kind, answer = sol.recv(deadline)
                if kind != b"R":
                    return "protocol error (solution's process)"
                side = "the test process"
                tst.send(b"R", answer, deadline)
        except ChannelTimeout:
            return "timeout"
        except ChannelOverflow:
            return "output limit exceeded"
        except ChannelClosed:
            return _closed(sol if side.startswith("the solution") else tst, side)
        except wire.WireError as exc:
            return f"protocol error ({exc})"


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


def _in_process(code: str, case: TestCase, config: SandboxConfig) -> str | None:
    marker = "@@rlvr-result-" + secrets.token_hex(16) + "@@"
    spec = {"test": case.test, "setup": case.setup}
    files = {"solution.py": code, "case.json": json.dumps(spec)}
    run = run_python(harness.IN_PROCESS, marker + "\n", config, files=files)
    failure = _run_failure(run)
    if failure:
        return failure
    payload = _harness_payload(run, marker)
    if payload is None:
        tail = run.stderr.strip().splitlines()[-1:] or [""]
        return f"no result (exit code {run.returncode}) {tail[0][:200]}".rstrip()
    if payload.get("error") and "ok" not in payload:
        return str(payload["error"])
    return None if payload.get("ok") is True else str(payload.get("error") or "failed")


def run_case(code: str, case: TestCase, config: SandboxConfig) -> str | None:
    """None if the case passed, else a short reason."""
    if case.kind == "stdio":
        return _stdio(code, case, config)
    if case.kind == "fn":
        return _fn(code, case, config)
    if case.in_process:
        return _in_process(code, case, config)
    return _asserts(code, case, config)
