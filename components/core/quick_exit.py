"""Leaving a process without the interpreter's teardown, where nothing is left to do.

A process that has loaded torch, transformers and DeepSpeed spends about 1 s of CPU (2 cores)
freeing them at exit, after its work is done and its output written: the `rlvr` program after a
run, and each worker of a local run, the last of which the run waits for. Both leave through
os._exit here, after what an exit owes: the atexit handlers, the logs, the streams (Python's and
C's), and the exit status, which a failure keeps.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush Python's streams and C's stdio buffers (native code's output), then os._exit. Output
    that cannot be written fails a successful exit with status 120, as Python's own exit does."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):  # as Python: nothing to flush
            continue
        try:
            stream.flush()
        except Exception as e:  # noqa: BLE001 - a closed pipe, a full disk: the status says so
            if code == 0:
                with contextlib.suppress(Exception):
                    print(f"Exception ignored while flushing {stream!r}: {e!r}", file=sys.stderr)
                code = 120
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(code)


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """A program's `main`, then its exit as the interpreter would make it (threads shut down as
    its own shutdown does: non-daemon threads joined, concurrent.futures' idle workers woken;
    atexit handlers run; the status of a SystemExit kept, a string one printed as status 1),
    without the teardown. An exception other than SystemExit propagates: the ordinary exit,
    with its traceback. Not CPython (no atexit._run_exitfuncs): sys.exit."""
    import atexit

    try:
        main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    shutdown = getattr(threading, "_shutdown", None)
    if run_exitfuncs is None or shutdown is None:
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    shutdown()
    run_exitfuncs()
    exit_now(int(code))


#: The module KFP runs a component's body with (`python3 -m kfp.dsl.executor_main`).
KFP_EXECUTOR = "kfp.dsl.executor_main"


def quick_exit_after_success() -> threading.Event:
    """A worker's process, once its segment is served, leaves without the interpreter's
    teardown (freeing torch, transformers and DeepSpeed took about 0.7 s of the train worker's
    exit, the last thing a local run waits for): set the returned event when the work is done.

    The exit handler is registered here, before the stage imports anything, so it runs after
    every handler registered later (atexit is last in, first out: temporary directories,
    torch's own); it flushes the logs and the streams, then os._exit(0). It does nothing, and
    the process ends as usual, unless the event is set and no exception reached the top after
    that (KFP's executor writes its output file after the function returns: a failure there
    keeps its traceback and its exit status). Only in KFP's executor process (KFP_EXECUTOR is
    `__main__`): a test or a notebook that calls a worker exits as usual. A sys.exit with a
    failing status after the work counts as an exception does (a bare `raise SystemExit(n)`
    there would not: nothing after the work raises one today, KFP's executor included)."""
    served, failed = threading.Event(), threading.Event()
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main, "name", None) != KFP_EXECUTOR:  # a test, a notebook: an ordinary exit
        return served
    import atexit
    import multiprocessing.util as mp_util
    import weakref

    previous = sys.excepthook

    def hook(*exc_info) -> None:
        failed.set()
        previous(*exc_info)

    real_exit = sys.exit

    @functools.wraps(real_exit)
    def exit_with(status: object = None) -> NoReturn:
        if served.is_set() and status not in (None, 0):  # after the work: a failure
            failed.set()
        real_exit(status)

    def leave() -> None:
        if not served.is_set() or failed.is_set():
            return
        # what was registered before this handler, and would run after it: temporary
        # directories' finalizers, multiprocessing's (its daemonic children, its temp dir),
        # logging's flush
        for name, owner in (("_exitfunc", weakref.finalize), ("_exit_function", mp_util)):
            with contextlib.suppress(Exception):
                getattr(owner, name)()
        logging.shutdown()
        exit_now(0)

    sys.excepthook = hook
    sys.exit = exit_with
    atexit.register(leave)
    return served
