"""Turns on the one device a local run's workers share: evaluation waits while generate or
train computes.

On a cluster each stage has its own GPUs. A local run puts its generate, train and evaluate
workers on one GPU, or on one CPU's cores, and an evaluation sampling at the same time slows the
training loop's sampling: on a GPU, which shares itself between processes by time slices, every
host sync of generate's waits for the evaluation's slice; on a CPU their threads outnumber the
cores (niced, an evaluation still left the SmolLM2 example's generate at 20-46 tokens/s in the
iterations it overlapped, against a median of 378 in the others, on 2 cores). Measured in
docs/benchmarks.md ("Device turns").

`RLVR_DEVICE_TURN` (set by the local runner) is `hold:PATH` or `yield:PATH`, PATH a lock file of
the run. A holder (generate, train) takes a shared `flock` on it while it computes (`holding`); a
yielder (evaluate) calls `waiter()`'s function before each forward of its sampling, which
returns once no holder holds the lock (lm-eval's adapter, which calls the model itself, through
a forward pre-hook: `yielding_forwards`). So an evaluation runs in the loop's gaps (verify, commits)
and after it, and never delays it; what it samples does not change (its draws are seeded per
sample). The kernel drops a dead holder's lock, so nothing waits on a worker that is gone. Unset
(a cluster pod, `rlvr stage`), both are no-ops.

A yielder's waits are kept (`take_waits`): the evaluation cuts them out of the spans they fell
in and records them as `turn` spans, so its timeline shows work as work and waits as waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

TURN_ENV = "RLVR_DEVICE_TURN"
POLL_S = 0.002
"""How often a waiting evaluation looks again: a decode step of the smallest model is ~10 ms."""

_waits: list[tuple[float, float]] = []
"""(start, end) of every wait of this process's waiters that found a holder computing."""


def take_waits() -> list[tuple[float, float]]:
    """The waits for a turn since the last call (epoch seconds), and forget them."""
    out = list(_waits)
    _waits.clear()
    return out


def _setting() -> tuple[str, str] | None:
    """(role, lock file) from the environment, or None when unset or malformed."""
    role, _, path = os.environ.get(TURN_ENV, "").partition(":")
    if role not in ("hold", "yield") or not path:
        return None
    return role, path


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Hold the GPU for the block (a holder's compute); a no-op for anyone else."""
    setting = _setting()
    if setting is None or setting[0] != "hold":
        yield
        return
    fd = os.open(setting[1], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def waiter() -> Callable[[], None] | None:
    """For a yielder: a function that returns once no holder computes; else None."""
    setting = _setting()
    if setting is None or setting[0] != "yield":
        return None
    return _Waiter(setting[1])


class _Waiter:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def __call__(self) -> None:
        started = None
        while True:
            try:  # an exclusive lock is granted only while no holder has its shared one
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                started = started or time.time()
                time.sleep(POLL_S)
                continue
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            if started is not None:
                _waits.append((started, time.time()))
            return

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@contextlib.contextmanager
def yielding_forwards(model) -> Iterator[None]:
    """For a yielder: every forward of `model` inside the block waits for its turn first (a
    forward pre-hook), for code that calls the model itself (lm-eval's adapter); else nothing."""
    wait = waiter()
    if wait is None:
        yield
        return
    handle = model.register_forward_pre_hook(lambda *_: wait())
    try:
        yield
    finally:
        handle.remove()


def lock_path() -> str:
    """The lock file of this process's local run (one `rlvr run`)."""
    import tempfile

    return str(Path(tempfile.gettempdir()) / f"rlvr-device-turn-{os.getuid()}-{os.getpid()}")


def env_for(task: str, path: str) -> dict[str, str]:
    """The variable a local task gets: evaluation yields, generate and train hold, the rest
    (verify, init, report: no model) neither."""
    if task.startswith("evaluate"):
        return {TURN_ENV: f"yield:{path}"}
    if task.startswith(("generate", "train")):
        return {TURN_ENV: f"hold:{path}"}
    return {}
