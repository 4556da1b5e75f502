"""The parent side of a sandboxed run: start, feed, read, deadline, kill, reap; and the probe
that decides whether this machine can sandbox at all. A sandboxed process that talks over a
message channel is ``_process.Process``."""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from components.sandbox import _child, _plan
from components.sandbox._child import LIBC, SetupError
from components.sandbox._plan import Mode, Plan
from components.sandbox.config import (
    Capabilities,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
)
from components.sandbox.seccomp import build_filter

_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def mode() -> Mode:
    """``root`` when running as root, else ``userns`` (see ``_child``)."""
    return "root" if os.geteuid() == 0 else "userns"


def _env(work: str) -> dict[str, str]:
    return {
        "PATH": _SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": work,
        "TMPDIR": work,
    }


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait (without reaping, so the process group id stays reserved) until ``pid``
    exits or the deadline passes; True if it exited."""
    delay = 0.0005
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 0.02)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run early: ask the waiter to kill the sandbox (which takes every process in
    its PID namespace along), then SIGKILL the whole process group as a backstop."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    _wait_unreaped(proc.pid, time.monotonic() + 2.0)
    _kill_group(proc.pid)


def _communicate(
    proc: subprocess.Popen[bytes], stdin: bytes, cap: int, deadline: float
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read stdout/stderr (each capped at ``cap`` bytes) until both close,
    the deadline passes or a cap is hit. Returns (out, err, timed_out, exceeded)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    timed_out = exceeded = False
    sel = selectors.DefaultSelector()
    try:
        view = memoryview(stdin)
        sent = 0
        if stdin:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _events in sel.select(remaining):
                fd = key.fd
                if fd in bufs:
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(fd)
                        continue
                    buf = bufs[fd]
                    room = cap - len(buf)
                    buf += data[:room]
                    if len(data) > room:
                        exceeded = True
                else:
                    try:
                        sent += os.write(fd, view[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        sent = len(view)
                    if sent >= len(view):
                        sel.unregister(fd)
                        proc.stdin.close()
            if exceeded:
                break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, exceeded


class _Dir:
    """The run's temp dir on the host: the program, its files, the plan and argv."""

    def __init__(
        self,
        code: str,
        config: SandboxConfig,
        netns: bool,
        files: dict[str, str | bytes] | None,
    ) -> None:
        exe, prefix = _plan.interpreter(config)
        self.base = os.path.realpath(tempfile.mkdtemp(prefix="rlvr-sandbox-"))
        try:
            os.chmod(self.base, 0o755)
            main = os.path.join(self.base, "main.py")
            for name, text in {"main.py": code, **(files or {})}.items():
                if os.sep in name or name in ("work", "newroot") or name.startswith("."):
                    raise ValueError(f"invalid sandbox file name {name!r}")
                path = os.path.join(self.base, name)
                if isinstance(text, bytes):
                    with open(path, "wb") as f:
                        f.write(text)
                else:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(text)
                os.chmod(path, 0o644)
            self.plan: Plan = _plan.make_plan(
                config, self.base, netns, prefix, mode(), build_filter()
            )
            os.mkdir(self.plan.work, 0o755)
            os.mkdir(self.plan.newroot, 0o700)
        except BaseException:
            self.remove()
            raise
        self.argv = [exe, "-I", "-S", "-B", "-X", "utf8", main]

    def popen(self, stdin: Any, stdout: Any, stderr: Any, pass_fds: tuple[int, ...] = ()):
        try:
            return subprocess.Popen(
                self.argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=self.plan.work,
                env=_env(self.plan.work),
                start_new_session=True,
                close_fds=True,
                pass_fds=pass_fds,
                preexec_fn=functools.partial(_child.preexec, self.plan),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SetupError("start", f"{type(exc).__name__}: {exc}") from exc

    def setup_error(self, rc: int, stderr: str) -> SetupError | None:
        """The child's own report that building the sandbox failed, if that is what
        ``rc``/``stderr`` say (the nonce keeps the program from faking it)."""
        marker = f"\n{self.plan.nonce}:"
        if rc == _child.SETUP_FAILED and marker in stderr:
            detail = stderr.split(marker, 1)[1].strip()
            return SetupError(detail.split(":", 1)[0], detail.split(":", 1)[-1].strip())
        return None

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """Kill whatever is left of the run's process group, reap the waiter, close the
    pipes; the exit status as ``128 + N`` for a signal ``N``."""
    _kill_group(proc.pid)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    rc = proc.returncode
    return 128 - rc if rc < 0 else rc


def _run(
    code: str,
    config: SandboxConfig,
    *,
    netns: bool,
    stdin: bytes = b"",
    files: dict[str, str] | None = None,
) -> RunResult:
    run_dir = _Dir(code, config, netns, files)
    try:
        start = time.monotonic()
        deadline = start + config.timeout_s
        pipe = subprocess.PIPE
        proc = run_dir.popen(pipe, pipe, pipe)
        try:
            out, err, timed_out, exceeded = _communicate(
                proc, stdin, config.max_output_bytes, deadline
            )
            if not (timed_out or exceeded) and not _wait_unreaped(proc.pid, deadline):
                timed_out = True
            if timed_out or exceeded:
                _stop(proc)
        finally:
            # the whole group, every time: stragglers that closed their pipes included
            rc = _reap(proc)
        duration = time.monotonic() - start
        stderr = err.decode("utf-8", errors="replace")
        failed = run_dir.setup_error(rc, stderr)
        if failed is not None:
            raise failed
        return RunResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=stderr,
            returncode=rc,
            timed_out=timed_out,
            output_exceeded=exceeded,
            duration_s=duration,
            pid=proc.pid,
            uid=run_dir.plan.uid,
            network_isolated=netns,
        )
    finally:
        run_dir.remove()


# ---------------------------------------------------------------------- probe and public

_PROBE_CODE = "import os, socket\nsocket.socket().close()\nprint('ok', os.getuid())\n"


def probe(config: SandboxConfig | None = None) -> Capabilities:
    """Try to build the sandbox on this machine (twice at most: with and without a
    network namespace) and report what works. Not cached; see ``capabilities``."""
    cfg = config or SandboxConfig()
    if LIBC is None:
        return Capabilities(False, False, f"the code sandbox needs Linux (this is {sys.platform})")
    try:
        build_filter()
    except ValueError as exc:
        return Capabilities(False, False, f"cannot build the syscall filter: {exc}")
    probe_cfg = SandboxConfig(
        timeout_s=max(cfg.timeout_s, 10.0),
        memory_mb=max(cfg.memory_mb, 256),
        uid=cfg.uid,
        python=cfg.python,
        extra_ro_paths=cfg.extra_ro_paths,
    )

    def attempt(netns: bool) -> str | None:
        try:
            res = _run(_PROBE_CODE, probe_cfg, netns=netns)
        except (SetupError, OSError, ValueError) as exc:
            return str(exc)
        if res.returncode != 0 or not res.stdout.startswith("ok "):
            return (
                f"probe program failed (exit {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-500:]}"
            )
        return None

    err_net = attempt(True)
    if err_net is None:
        return Capabilities(True, True)
    err = attempt(False)
    if err is None:
        return Capabilities(True, False, f"cannot create a network namespace ({err_net})")
    if mode() == "userns":
        return Capabilities(
            False,
            False,
            f"cannot build the sandbox as uid {os.geteuid()} ({err}): without root it needs "
            "unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on Debian "
            "kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ an AppArmor profile that "
            "allows them). In a container, the runtime's default seccomp profile refuses "
            "unshare and mount: run it with the profile from `python -m "
            "components.sandbox pod-profile`; on Kubernetes apply "
            "manifests/overlays/code-sandbox (docs/verifiers.md, 'Running code rewards on "
            "a cluster')",
        )
    return Capabilities(False, False, f"cannot build the sandbox ({err})")


@functools.lru_cache(maxsize=8)
def _cached_capabilities(
    uid: int | None, python: str | None, extra: tuple[str, ...]
) -> Capabilities:
    return probe(SandboxConfig(uid=uid, python=python, extra_ro_paths=extra))


def capabilities(config: SandboxConfig | None = None) -> Capabilities:
    """``probe`` once per process (and per uid / interpreter / extra paths)."""
    cfg = config or SandboxConfig()
    return _cached_capabilities(cfg.uid, cfg.python, cfg.extra_ro_paths)


def clear_capabilities_cache() -> None:
    """Forget probe results (tests; or after the machine's permissions changed)."""
    _cached_capabilities.cache_clear()


def check_available(config: SandboxConfig | None = None) -> Capabilities:
    """Return the capabilities if code may run under ``config``; otherwise raise
    ``SandboxUnavailable`` saying what is missing (fail closed)."""
    cfg = config or SandboxConfig()
    caps = capabilities(cfg)
    if not caps.available:
        raise SandboxUnavailable(f"sandbox unavailable: {caps.reason}; refusing to run code")
    if not caps.network_isolated and not cfg.allow_network_fallback:
        raise SandboxUnavailable(
            f"sandbox unavailable: {caps.reason}; refusing to run code with network access "
            "(set allow_network_fallback=True only where the network is blocked by other "
            "means, e.g. a Kubernetes NetworkPolicy)"
        )
    return caps


def run_python(
    code: str,
    stdin: str | bytes = b"",
    config: SandboxConfig | None = None,
    *,
    files: dict[str, str] | None = None,
) -> RunResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox and return what happened.

    ``stdin`` is fed to the program; ``files`` (name -> text) are placed read-only next
    to ``main.py`` (the program finds them via ``__file__``). The program's cwd is the
    empty, writable work directory. Raises ``SandboxUnavailable`` when the sandbox
    cannot be built (nothing ran); anything the program does is reported in the result.
    """
    cfg = config or SandboxConfig()
    caps = check_available(cfg)
    data = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    try:
        return _run(code, cfg, netns=caps.network_isolated, stdin=data, files=files)
    except SetupError as exc:
        raise SandboxUnavailable(f"sandbox setup failed: {exc}; the code did not run") from exc
