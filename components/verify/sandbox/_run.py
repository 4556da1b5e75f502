"""The parent side of a sandboxed run: start, feed, read, deadline, kill, reap; a
sandboxed process with a message channel (``Process``); and the probe that decides
whether this machine can sandbox at all."""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from components.verify.sandbox import _child
from components.verify.sandbox._child import LIBC, Mode, Plan, SetupError
from components.verify.sandbox.config import (
    Capabilities,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
)
from components.verify.sandbox.seccomp import build_filter

_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# a channel frame: one byte of kind, four bytes of length (big-endian), the payload
_FRAME = struct.Struct(">cI")
MIN_MESSAGE_CAP = 16 << 20  # a Process message may be this large whatever max_output_bytes is


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
        exe, prefix = _child.interpreter(config)
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
            self.plan: Plan = _child.make_plan(
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


class ChannelClosed(Exception):
    """The sandboxed process closed its channel (it exited or was killed)."""


class ChannelTimeout(Exception):
    """The deadline passed before a whole frame arrived."""


class ChannelOverflow(Exception):
    """The process announced a frame larger than the configured cap."""


def _ready(sel: selectors.BaseSelector, deadline: float) -> bool:
    """Whether the channel is ready before ``deadline``; ``ChannelTimeout`` once it passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ChannelTimeout("timeout")
    return bool(sel.select(remaining))


def _nonblocking(op: Callable[[Any], Any], arg: Any) -> Any:
    """``op(arg)`` on the non-blocking channel: None if it would block, ``ChannelClosed`` if
    the other end is gone."""
    try:
        return op(arg)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise ChannelClosed(str(exc)) from exc


class Process:
    """A sandboxed program that talks to the caller over a message channel.

    ``main.py`` runs with ``sys.argv[1]`` naming a file descriptor (a connected Unix
    stream socket) on which it reads and writes frames: one byte of kind, four bytes of
    big-endian length, the payload (at most ``max(max_output_bytes, 16 MiB)``). Its stdin
    and stdout are ``/dev/null``; its stderr goes to a file in the run's host directory
    (bounded by the file-size limit, removed with the directory) that the caller reads
    only to report a failed setup. Everything else is as for ``run_python``. Use as a context
    manager; ``close`` kills what is left, reaps it and removes the run's files.
    """

    def __init__(
        self, code: str, config: SandboxConfig, *, files: dict[str, str | bytes] | None = None
    ) -> None:
        caps = check_available(config)
        self.config = config
        # a message may be larger than what run_python lets a program print
        self.max_message_bytes = max(config.max_output_bytes, MIN_MESSAGE_CAP)
        self._dir = _Dir(code, config, caps.network_isolated, files)
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock = ours
            self._dir.argv.append(str(theirs.fileno()))
            self._stderr = open(os.path.join(self._dir.base, ".stderr"), "w+b")  # noqa: SIM115
            try:
                self._proc = self._dir.popen(
                    subprocess.DEVNULL, subprocess.DEVNULL, self._stderr, (theirs.fileno(),)
                )
            finally:
                theirs.close()
            ours.setblocking(False)
        except SetupError as exc:
            self.close()
            raise SandboxUnavailable(f"sandbox setup failed: {exc}; the code did not run") from exc
        except BaseException:
            self.close()
            raise
        self._buf = bytearray()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, kind: bytes, payload: bytes, deadline: float) -> None:
        """Write one frame; ``ChannelClosed`` if the process is gone, ``ChannelTimeout``
        if it does not read in time."""
        assert self._sock is not None
        data = memoryview(_FRAME.pack(kind, len(payload)) + payload)
        sent = 0
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_WRITE)
            while sent < len(data):
                if _ready(sel, deadline):
                    sent += _nonblocking(self._sock.send, data[sent:]) or 0

    def recv(self, deadline: float) -> tuple[bytes, bytes]:
        """Read one frame (kind, payload)."""
        assert self._sock is not None
        cap = self.max_message_bytes
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            while True:
                if len(self._buf) >= _FRAME.size:
                    kind, size = _FRAME.unpack_from(self._buf)
                    if size > cap:
                        raise ChannelOverflow(f"a message of {size} bytes (cap {cap})")
                    end = _FRAME.size + size
                    if len(self._buf) >= end:
                        payload = bytes(self._buf[_FRAME.size : end])
                        del self._buf[:end]
                        return kind, payload
                if not _ready(sel, deadline):
                    continue
                chunk = _nonblocking(self._sock.recv, 1 << 16)
                if chunk == b"":
                    raise ChannelClosed("the process closed its channel")
                self._buf += chunk or b""

    def close(self) -> int | None:
        """Stop the process (if still running), reap it, remove its files; its exit
        status. Raises ``SandboxUnavailable`` if the sandbox could not be built."""
        failed: SetupError | None = None
        try:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._proc is not None:
                # no grace period: the caller has what it needs, and an interpreter's
                # own shutdown costs more than killing its namespace
                if not _wait_unreaped(self._proc.pid, time.monotonic()):
                    _stop(self._proc)
                self.returncode = _reap(self._proc)
                self._proc = None
                if self._stderr is not None:
                    self._stderr.seek(0)
                    err = self._stderr.read(1 << 16).decode("utf-8", errors="replace")
                    failed = self._dir.setup_error(self.returncode, err)
        finally:
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            self._dir.remove()
        if failed is not None:
            raise SandboxUnavailable(f"sandbox setup failed: {failed}; the code did not run")
        return self.returncode


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
            "components.verify.sandbox pod-profile`; on Kubernetes apply "
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
