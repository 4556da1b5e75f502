"""Tests for the code verifier and its sandbox.

The adversarial tests check one property each. Where this machine cannot build the
sandbox (not root, no namespaces), they assert the fail-closed behaviour instead: the
code is refused with ``SandboxUnavailable`` / a "sandbox unavailable" error, never run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest

from components import sandbox
from components.sandbox import (
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
    _child,
    _run,
    run_python,
)
from components.verify.code import (
    InvalidTestCases,
    TestCase,
    compute_score,
    extract_code,
    parse_test_cases,
    score_or_raise,
)
from components.verify.executor import ScoreItem, score_batch
from components.verify.rewards import get_verifier

CAPS = sandbox.capabilities()
ENFORCED = CAPS.available and CAPS.network_isolated


@pytest.fixture()
def fresh_caps() -> Iterator[None]:
    """Tests that fake a missing capability re-probe; restore the real result after."""
    sandbox.clear_capabilities_cache()
    yield
    sandbox.clear_capabilities_cache()


def run(code: str, stdin: str = "", **limits: object) -> RunResult | None:
    """Run in the sandbox; where it cannot be built, assert that the code is refused
    (fail closed) and return None."""
    config = SandboxConfig(**limits)  # type: ignore[arg-type]
    if not ENFORCED:
        with pytest.raises(SandboxUnavailable, match="sandbox unavailable"):
            run_python(code, stdin, config)
        return None
    return run_python(code, stdin, config)


def score(response: str, ground_truth: object, **kwargs: object) -> dict | None:
    """compute_score; where the sandbox is unavailable, assert the refusal instead."""
    out = compute_score(response, ground_truth, **kwargs)  # type: ignore[arg-type]
    if not ENFORCED:
        assert out["score"] == 0.0
        assert out["error"].startswith("sandbox unavailable")
        return None
    return out


def uid_processes(uid: int) -> list[str]:
    """Live (non-zombie) processes running as ``uid``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields["State"].startswith("Z"):
            found.append(pid)
    return found


def assert_all_gone(res: RunResult) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(res.pid, 0)
    assert uid_processes(res.uid) == []


def py(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip() + "\n```"


# --------------------------------------------------------------------- capability / policy


def test_capabilities_are_reported() -> None:
    assert CAPS.available or CAPS.reason
    if CAPS.available and not CAPS.network_isolated:
        assert "network namespace" in (CAPS.reason or "")


def test_refuses_without_network_namespace(
    fresh_caps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an invalid unshare flag makes the network namespace fail, as on a kernel/container
    # that does not allow it
    monkeypatch.setattr(_child, "CLONE_NEWNET", 0x1)
    caps = sandbox.capabilities()
    assert not caps.network_isolated
    with pytest.raises(SandboxUnavailable, match="sandbox unavailable"):
        run_python("print('ran')")
    out = compute_score(py("print('ran')"), {"inputs": [""], "outputs": ["ran"]})
    assert out["score"] == 0.0 and out["error"].startswith("sandbox unavailable")
    with pytest.raises(SandboxUnavailable):
        get_verifier("code")(py("print('ran')"), '{"inputs": [""], "outputs": ["ran"]}')
    if caps.available:  # opting in runs the code, with the host's network
        res = run_python("print('ran')", config=SandboxConfig(allow_network_fallback=True))
        assert res.stdout == "ran\n" and not res.network_isolated


def test_refuses_when_user_namespaces_are_refused(
    fresh_caps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a non-root caller needs a user namespace; an invalid flag stands in for a kernel,
    # sysctl or container seccomp profile that refuses one: the code is refused, clearly
    monkeypatch.setattr(_run, "mode", lambda: "userns")
    monkeypatch.setattr(_child, "CLONE_NEWUSER", 0x1)
    caps = sandbox.capabilities()
    assert not caps.available and "unprivileged user namespaces" in (caps.reason or "")
    assert "manifests/overlays/code-sandbox" in (caps.reason or "")
    with pytest.raises(SandboxUnavailable, match="without root it needs"):
        run_python("print('ran')")


def test_refuses_when_setup_fails() -> None:
    config = SandboxConfig(python="/nonexistent/bin/python3")
    with pytest.raises(SandboxUnavailable, match="sandbox unavailable"):
        run_python("print('ran')", config=config)


# ---------------------------------------------------------------------------- adversarial


def test_infinite_loop_times_out_and_group_is_gone() -> None:
    res = run("while True:\n    pass\n", timeout_s=1.0)
    if res is None:
        return
    assert res.timed_out and res.returncode == 137
    assert res.duration_s < 3.0
    assert_all_gone(res)
    if ENFORCED:
        out = compute_score(py("while True: pass"), {"inputs": [""], "outputs": [""]}, timeout_s=1)
        assert out["score"] == 0.0 and out["error"] == "test 0: timeout"


def test_fork_bomb_is_contained() -> None:
    code = """
    import os, time
    root = os.getpid()
    forks = 0
    while True:
        try:
            if os.fork() == 0:
                forks = 0
                continue
            forks += 1
        except OSError:
            if os.getpid() == root:
                print("limited after", forks, flush=True)
            time.sleep(0.2)
    """
    start = time.monotonic()
    res = run(textwrap.dedent(code), timeout_s=2.0, max_processes=16)
    if res is None:
        return
    assert time.monotonic() - start < 8.0
    assert res.timed_out
    assert "limited after" in res.stdout
    assert int(res.stdout.split()[-1]) < 16
    assert_all_gone(res)
    # the machine is fine: processes can still be started
    ok = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert ok.stdout == "42\n"


def test_memory_bomb_is_contained() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    res = run(code, timeout_s=10.0, memory_mb=128)
    if res is None:
        return
    assert not res.timed_out
    assert res.returncode != 0 and "MemoryError" in res.stderr


def test_network_is_denied() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            print("connected")
        except OSError as exc:
            print("blocked", exc.errno)
        """
        res = run(textwrap.dedent(code))
        if res is None:
            return
        assert res.stdout.startswith("blocked"), res.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert res.network_isolated


def test_no_writes_outside_the_work_dir() -> None:
    outside = f"/tmp/outside-{uuid.uuid4().hex}"
    code = f"""
    import os
    open("inside.txt", "w").write("ok")
    print("cwd", os.getcwd(), os.listdir("."))
    for path in [{outside!r}, "/dev/shm/x-{uuid.uuid4().hex}", "../escape.txt"]:
        try:
            open(path, "w").write("x")
            print("WROTE", path)
        except OSError as exc:
            print("denied", path, exc.errno)
    """
    res = run(textwrap.dedent(code))
    assert not os.path.exists(outside)
    if res is None:
        return
    assert "WROTE" not in res.stdout
    assert "['inside.txt']" in res.stdout  # the work dir itself is writable
    cwd = res.stdout.split()[1]
    # the run's temp directory (and the work dir in it) is gone afterwards
    assert not os.path.exists(os.path.dirname(cwd))


def test_chroot_fallback_also_confines(monkeypatch: pytest.MonkeyPatch) -> None:
    # architectures without a known pivot_root number use MS_MOVE + chroot instead
    monkeypatch.setattr(_child, "_PIVOT_ROOT_NR", {})
    outside = f"/tmp/outside-{uuid.uuid4().hex}"
    code = f"import os\nprint(sorted(os.listdir('/')))\nopen({outside!r}, 'w')\n"
    res = run(code)
    assert not os.path.exists(outside)
    if res is None:
        return
    assert "Read-only file system" in res.stderr
    assert "'work'" not in res.stdout and "'root'" in res.stdout


def test_huge_stdout_is_capped() -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    res = run(code, timeout_s=10.0, max_output_bytes=256 << 10)
    if res is None:
        return
    assert res.output_exceeded and not res.timed_out
    assert len(res.stdout) == 256 << 10
    assert res.duration_s < 5.0
    assert_all_gone(res)


def test_sigterm_is_ignored_but_killed() -> None:
    code = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.setsid()  # leave the process group, too
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
    """
    res = run(textwrap.dedent(code), timeout_s=1.0)
    if res is None:
        return
    assert res.timed_out and "ready" in res.stdout
    assert res.duration_s < 4.0
    assert_all_gone(res)


def test_environment_secrets_are_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    code = """
    import glob, os
    print(sorted(os.environ))
    print(os.environ.get("AWS_SECRET_ACCESS_KEY"))
    for path in glob.glob("/proc/*/environ"):
        try:
            print(open(path, errors="replace").read())
        except OSError:
            pass
    """
    res = run(textwrap.dedent(code))
    if res is None:
        return
    assert secret not in res.stdout and secret not in res.stderr
    assert "AWS_SECRET_ACCESS_KEY" not in res.stdout.splitlines()[0]


# ------------------------------------------------------------------------ pure functions


def test_extract_code() -> None:
    text = "intro\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    # a tagged Python block beats a later untagged one
    assert extract_code("```python\nprint(1)\n```\n```\nout\n```") == "print(1)\n"
    assert extract_code("print(4)") == "print(4)"  # no fence: the whole response
    assert extract_code("```cpp\nint main() {}\n```") is None
    assert extract_code("```python\nprint(5)\n") is None  # truncated: never run
    assert extract_code("") is None


def test_parse_test_cases() -> None:
    cases = parse_test_cases('{"inputs": ["1\\n"], "outputs": [["1", "2"]]}')
    assert cases == [TestCase("stdio", input="1\n", expected="1\n2\n")]
    cases = parse_test_cases({"fn_name": "f", "inputs": [[1, 2], 3], "outputs": [3, 4]})
    assert [c.args for c in cases] == [(1, 2), (3,)]
    cases = parse_test_cases("", {"test_cases": {"asserts": ["assert f() == 1"]}})
    assert cases[0].kind == "assert"
    for bad in ["not json", '{"inputs": [1]}', '{"inputs": [1], "outputs": []}', "{}", "[]"]:
        with pytest.raises(InvalidTestCases):
            parse_test_cases(bad)


def test_invalid_test_cases_error_vs_raise() -> None:
    out = compute_score(py("print(1)"), "nope")
    assert out["score"] == 0.0 and out["error"].startswith("invalid test cases")
    with pytest.raises(InvalidTestCases):
        score_or_raise(py("print(1)"), "nope")
    with pytest.raises(ValueError):
        get_verifier("code")(py("print(1)"), "nope")


def test_no_code_block() -> None:
    out = compute_score("```cpp\nint main() {}\n```", {"inputs": [""], "outputs": [""]})
    assert out == {
        "score": 0.0,
        "extracted_answer": None,
        "passed": 0,
        "total": 1,
        "error": "no Python code block found in the response",
        "isolation": "separate",
    }


# ---------------------------------------------------------------------- scoring solutions

STDIO = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7", "0  \n\n"]})


def test_stdio_correct_and_incorrect() -> None:
    good = py("a, b = map(int, input().split())\nprint(a + b)   ")
    out = score(good, STDIO)
    if out is None:
        return
    assert out == {
        "score": 1.0,
        "extracted_answer": "a, b = map(int, input().split())\nprint(a + b)\n",
        "passed": 3,
        "total": 3,
        "error": None,
        "isolation": "separate",
    }
    bad = py("a, b = map(int, input().split())\nprint(a * b if a > 5 else a + b)")
    assert score(bad, STDIO)["score"] == 0.0
    frac = score(bad, STDIO, reward_mode="fraction")
    assert frac["passed"] == 2 and frac["score"] == pytest.approx(2 / 3)
    assert frac["error"] == "test 1: wrong answer"
    crash = score(py("raise SystemExit(3)"), STDIO)
    assert crash["score"] == 0.0 and crash["error"].startswith("test 0: exit code 3")


FN = {"fn_name": "add", "inputs": [[1, 2], [0.1, 0.2], [[1], [2]]], "outputs": [3, [0.3], [1, 2]]}


def test_fn_name_correct_and_incorrect() -> None:
    out = score(py("def add(a, b):\n    return a + b"), FN)
    if out is None:
        return
    assert (out["score"], out["passed"], out["total"]) == (1.0, 3, 3)
    method = py("class Solution:\n    def add(self, a, b):\n        return a + b")
    assert score(method, json.dumps(FN))["score"] == 1.0
    wrong = py("def add(a, b):\n    return a - b if isinstance(a, list) else a + b")
    res = score(wrong, FN, reward_mode="fraction")
    assert res["passed"] == 2 and res["score"] == pytest.approx(2 / 3)
    missing = score(py("def plus(a, b):\n    return a + b"), FN)
    assert missing["score"] == 0.0 and "not found" in missing["error"]


ASSERTS = {"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]}


def test_asserts_correct_and_incorrect() -> None:
    out = score(py("def add(a, b):\n    return a + b"), ASSERTS)
    if out is None:
        return
    assert (out["score"], out["passed"], out["error"]) == (1.0, 3, None)
    half = score(py("def add(a, b):\n    return 3"), ASSERTS, reward_mode="fraction")
    assert half["passed"] == 1 and half["score"] == pytest.approx(1 / 3)
    first_wrong = py("def add(a, b):\n    return 0 if a == 1 else a + b")
    assert score(first_wrong, ASSERTS, reward_mode="fraction")["passed"] == 2
    all_mode = score(first_wrong, ASSERTS)  # stops at the first failure
    assert (all_mode["score"], all_mode["passed"], all_mode["total"]) == (0.0, 0, 3)
    assert all_mode["error"].startswith("test 0: assertion failed")
    setup = {"setup": "import math", "asserts": ["assert root(16) == math.sqrt(16)"]}
    assert score(py("def root(x):\n    return x ** 0.5"), setup)["score"] == 1.0


def test_assert_reward_hacks_fail() -> None:
    always_equal = """
    class Anything:
        def __eq__(self, other):
            return True
    def add(a, b):
        return Anything()
    """
    out = score(py(always_equal), ASSERTS, reward_mode="fraction")
    if out is None:
        return
    assert out["passed"] == 0
    early_exit = "import os\ndef add(a, b):\n    return 0\nprint('{\"ok\": true}')\nos._exit(0)"
    assert score(py(early_exit), ASSERTS, reward_mode="fraction")["passed"] == 0


def test_code_verifier_in_score_batch() -> None:
    gt = json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})
    items = [
        ScoreItem("code", "codeds", py("print(int(input()) * 2)"), gt),
        ScoreItem("code", "codeds", py("print(5)"), gt),
    ]
    results = score_batch(items, num_workers=1, timeout_s=20)
    if ENFORCED:
        assert [r.reward for r in results] == [1.0, 0.0]
        assert all(r.error is None for r in results)
    else:  # refusals are verifier errors, so the stage can fail on them
        assert all(r.reward == 0.0 and "sandbox unavailable" in (r.error or "") for r in results)
