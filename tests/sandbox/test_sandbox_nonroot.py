"""Code rewards as a user who is not root: the sandbox builds inside a user namespace of
its own. Run for real as uid 65534 (nobody) when the tests run as root (as in CI), or
directly when they already run as another user. The battery repeats the containment
checks that matter most without root (network, files, processes of the same host uid,
fork bombs, timeouts, privileges) and scores a code task end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

BATTERY = r"""
import json, os, subprocess, sys, time
from components import sandbox
from components.verify.code import compute_score

port = int(sys.argv[1])
out = {"euid": os.geteuid(), "mode": sandbox.mode()}
caps = sandbox.capabilities()
out["caps"] = [caps.available, caps.network_isolated, caps.reason]
cfg = sandbox.SandboxConfig(timeout_s=10)
res = sandbox.run_python(
    "import os\nst = open('/proc/self/status').read()\n"
    "print(os.getuid(), [l.split()[1] for l in st.splitlines()"
    " if l.startswith(('CapEff', 'NoNewPrivs', 'Seccomp:'))])", config=cfg)
out["inside"] = res.stdout.strip()
res = sandbox.run_python(
    "import socket\ns = socket.socket()\ns.settimeout(2)\n"
    f"print(s.connect_ex(('127.0.0.1', {port})))", config=cfg)
out["connect_host_port"] = res.stdout.strip()
outside = "/tmp/rlvr-nonroot-" + str(os.getpid())
res = sandbox.run_python(f"open({outside!r}, 'w').write('x')", config=cfg)
out["wrote_outside"] = os.path.exists(outside)
# a process of the same host uid (ours) survives kill(-1) from inside
sleeper = subprocess.Popen(["sleep", "60"])
res = sandbox.run_python("import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError as e:\n    print(e)\n", config=cfg)
time.sleep(0.2)
out["sleeper_alive"] = sleeper.poll() is None
sleeper.kill(); sleeper.wait()
res = sandbox.run_python(
    "import os, time\nn = 0\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\n    except OSError:\n        print(n)\n        break\n",
    config=sandbox.SandboxConfig(timeout_s=10, max_processes=16))
out["forks_before_limit"] = res.stdout.strip()
res = sandbox.run_python("while True: pass", config=sandbox.SandboxConfig(timeout_s=1))
out["loop"] = [res.timed_out, res.returncode]
try:
    os.killpg(res.pid, 0)
    out["loop_group_gone"] = False
except ProcessLookupError:
    out["loop_group_gone"] = True
py = lambda c: "```python\n" + c + "\n```"
tests = {"asserts": ["def check(candidate):\n    assert candidate(2, 3) == 5\ncheck(add)"]}
out["honest"] = compute_score(py("def add(a, b):\n    return a + b"), tests)["score"]
out["hack"] = compute_score(py("class A:\n    def __eq__(s, o): return True\ndef add(a, b):\n    return A()"), tests)["score"]
out["stdio"] = compute_score(py("print(int(input()) * 2)"), {"inputs": ["4\n"], "outputs": ["8\n"]})["score"]
print(json.dumps(out))
"""


# A container as Kubernetes runs it under PodSecurity restricted, emulated: non-root, no
# capabilities, no_new_privs, and a seccomp filter -- either the shipped pod profile
# (SANDBOX_BUILDER_NEEDS allowed) or one that refuses unshare and mount as the runtimes'
# default profiles do for a pod without CAP_SYS_ADMIN.
POD = r"""
import ctypes, json, sys
from components import sandbox
from components.verify.code import compute_score
from components.sandbox import _child, _plan, seccomp

allow = seccomp.SANDBOX_BUILDER_NEEDS if sys.argv[1] == "pod-profile" else ()
flt = _plan._Filter(seccomp.build_filter(allow=allow))
assert _child.LIBC.prctl(38, 1, 0, 0, 0) == 0
assert _child.LIBC.prctl(22, 2, ctypes.addressof(flt.prog), 0, 0) == 0
caps = sandbox.probe()
out = {"caps": [caps.available, caps.network_isolated, caps.reason]}
if caps.available:
    py = lambda c: "```python\n" + c + "\n```"
    tests = {"asserts": ["assert add(2, 3) == 5"]}
    out["honest"] = compute_score(py("def add(a, b):\n    return a + b"), tests)["score"]
    out["wrong"] = compute_score(py("def add(a, b):\n    return 0"), tests)["score"]
print(json.dumps(out))
"""


def _as_nobody() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def _interpreter_for_nobody() -> str | None:
    """An interpreter (3.11+) that uid 65534 can run and that can import the repo's
    sandbox (stdlib only); a virtualenv under /root is not readable to it."""
    for exe in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(exe):
            continue
        code = "import sys; import components.verify.code; print(sys.version_info >= (3, 11))"
        try:
            probe = subprocess.run(
                [exe, "-c", code],
                preexec_fn=_as_nobody,
                cwd=REPO,
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
            )
        except OSError:  # not executable for uid 65534
            continue
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return exe
    return None


def _run_as_non_root(code: str, *args: str) -> dict:
    if os.geteuid() == 0:
        exe = _interpreter_for_nobody()
        if exe is None:
            pytest.skip("no Python 3.11+ interpreter that uid 65534 can run with this repo")
        preexec = _as_nobody
    else:
        exe, preexec = sys.executable, None
    proc = subprocess.run(
        [exe, "-c", code, *args],
        preexec_fn=preexec,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_restricted_pod_with_the_shipped_profile_runs_code_rewards() -> None:
    out = _run_as_non_root(POD, "pod-profile")
    assert out["caps"][:2] == [True, True], out
    assert (out["honest"], out["wrong"]) == (1.0, 0.0)


def test_default_container_profile_is_refused_with_the_fix_named() -> None:
    out = _run_as_non_root(POD, "runtime-default")
    available, _net, reason = out["caps"]
    assert available is False
    assert "unshare(user namespace): Operation not permitted" in reason
    assert "pod-profile" in reason and "manifests/overlays/code-sandbox" in reason


@pytest.fixture(scope="module")
def battery() -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        return _run_as_non_root(BATTERY, str(port))
    finally:
        listener.close()


def test_runs_as_non_root_in_a_user_namespace(battery: dict) -> None:
    assert battery["euid"] != 0 and battery["mode"] == "userns"
    assert battery["caps"][:2] == [True, True], battery["caps"]
    uid, caps = battery["inside"].split(" ", 1)
    assert uid == "1000"
    assert json.loads(caps.replace("'", '"')) == ["0000000000000000", "1", "2"]


def test_non_root_containment(battery: dict) -> None:
    assert battery["connect_host_port"] not in ("0", "")  # no route to the host's loopback
    assert battery["wrote_outside"] is False
    assert battery["sleeper_alive"] is True
    assert 0 < int(battery["forks_before_limit"]) < 16
    assert battery["loop"] == [True, 137] and battery["loop_group_gone"] is True


def test_non_root_code_rewards(battery: dict) -> None:
    assert (battery["honest"], battery["hack"], battery["stdio"]) == (1.0, 0.0, 1.0)
