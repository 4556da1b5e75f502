"""A sandboxed program that talks to the caller over a message channel (``Process``): the
sandbox of ``run_python`` (``_run.py``), with a Unix socket in place of stdin and stdout."""

from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from typing import IO, Any

from components.sandbox._child import SetupError
from components.sandbox._run import _Dir, _reap, _stop, _wait_unreaped, check_available
from components.sandbox.config import SandboxConfig, SandboxUnavailable

# a channel frame: one byte of kind, four bytes of length (big-endian), the payload
_FRAME = struct.Struct(">cI")
MIN_MESSAGE_CAP = 16 << 20  # a Process message may be this large whatever max_output_bytes is


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
