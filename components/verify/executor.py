"""Bounded-time batch scoring for the verify stage.

``score_batch`` runs a verifier (built-in name such as ``"math"`` / ``"exact"`` or a
plugin spec, see ``components.verify.rewards``) over many samples in a pebble process
pool with a per-sample deadline. A sample whose verifier raises, crashes its worker or
overruns the deadline gets reward 0.0 and an error string; the batch always completes and
results come back in input order.

How the deadline works with chunking: items go to the workers in chunks (to amortize
IPC), but each item keeps its own deadline. Every chunk owns two float64 slots (padded to
their own cache lines) in a small shared memory map in which the worker records which item
it is running and since when. The parent polls those slots; when an item has run longer than ``timeout_s`` the parent
cancels the chunk (pebble terminates that worker and starts a fresh one), records a
timeout for that item only and resubmits the chunk's other items. An item that finishes
but took longer than ``timeout_s`` is also reported as timed out, so the outcome does not
depend on how samples were grouped. As a backstop each chunk also carries a pebble timeout
of ``timeout_s * len(chunk) + grace``; a chunk that fails in a way that cannot be pinned
on one item is rerun one item per task.

IPC: with the ``fork`` start method (the Linux default up to Python 3.13) the workers are
forked after the batch and an anonymous shared memory map for the progress slots are stored
in module-level tables, so a chunk is sent as an index range and the samples themselves are
never pickled. Other start methods pickle them and share the slots through a file in
``/dev/shm``. Workers send a chunk's outcomes back as four columns (rewards, extracted
answers, errors, timed-out flags), and chunk sizes shrink towards the end of the batch so
the workers finish together; the parent's per-item work is a few slice assignments.

With ``num_workers=0`` everything runs inline in the calling process (handy under a
debugger): no pool and no timeout enforcement at all, so a hanging verifier hangs the
caller.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import mmap
import multiprocessing
import operator
import os
import queue
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, NamedTuple

from components.verify.rewards import canonical_spec, resolve_verifier

__all__ = ["ScoreItem", "ScoreResult", "score_batch"]


class ScoreItem(NamedTuple):
    """One sample to score.

    ``verifier`` is a built-in name (``"math"``, ``"exact"``) or a plugin spec
    (``"package.module:function"`` / ``"path/to/file.py:function"``).
    """

    verifier: str
    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict[str, Any] | None = None


class ScoreResult(NamedTuple):
    """Outcome of one sample: ``reward`` is 0.0 whenever ``error`` is set."""

    reward: float
    extracted_answer: str | None = None
    error: str | None = None
    timed_out: bool = False


_verifier_of = operator.attrgetter("verifier")

# ScoreResult from a 4-tuple without a Python-level __new__ call per item
_make_result = functools.partial(tuple.__new__, ScoreResult)

# (reward, extracted_answer, error, timed_out)
_Outcome = tuple[float, "str | None", "str | None", bool]

# Batches and their progress memory visible to forked workers, by batch id (parent side:
# filled before the pool forks; worker side: the copy inherited at fork time).
_FORK_BATCHES: dict[int, list[ScoreItem]] = {}
_FORK_PROGRESS: dict[int, mmap.mmap] = {}
_FORK_LOCK = threading.Lock()
_BATCH_IDS = itertools.count()

# Worker-side view of the progress memory: per chunk id, [start time | -1 | 0, position]
# at offset _SLOT * chunk id (in float64s). Two workers running chunks with neighbouring
# ids write their slots several times per item; a 128-byte stride keeps each slot on its
# own cache lines so that those writes do not bounce lines between the cores.
_PROGRESS: memoryview | None = None
_SLOT = 16


def _timeout_message(timeout_s: float) -> str:
    return f"timeout after {timeout_s}s"


def _error_message(exc: BaseException) -> str:
    text = str(exc)
    exitcode = getattr(exc, "exitcode", None)  # pebble.ProcessExpired
    if exitcode is not None:
        text = f"{text} (exit code {exitcode})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call_verifier(fn: Any, item: ScoreItem) -> _Outcome:
    try:
        out = fn(item.data_source, item.solution_str, item.ground_truth, item.extra_info)
        if not isinstance(out, dict) or "score" not in out:
            raise TypeError(f"verifier returned {type(out).__name__}, expected a dict with 'score'")
        reward = float(out["score"])
        if not math.isfinite(reward):
            raise ValueError(f"verifier returned a non-finite score {out['score']!r}")
        extracted = out.get("extracted_answer")
        return reward, None if extracted is None else str(extracted), None, False
    except (Exception, SystemExit) as exc:
        return 0.0, None, _error_message(exc), False


def _score_item(item: ScoreItem, timeout_s: float | None, progress: Any, slot: int) -> _Outcome:
    """Score one item; ``progress[slot]`` holds its start time while it runs."""
    try:
        fn = resolve_verifier(item.verifier)
    except (Exception, SystemExit) as exc:
        return 0.0, None, _error_message(exc), False
    start = time.monotonic()
    if progress is not None:
        progress[slot] = start
    outcome = _call_verifier(fn, item)
    if progress is not None:
        progress[slot] = -1.0
    if timeout_s is not None and time.monotonic() - start > timeout_s:
        return 0.0, None, _timeout_message(timeout_s), True
    return outcome


def _init_worker(batch_id: int | None, path: str | None, nbytes: int, warm_math: bool) -> None:
    global _PROGRESS
    # everything inherited from the parent is long-lived: keep the worker's garbage
    # collector from walking (and, under fork, copy-on-write faulting) all of it
    gc.freeze()
    if warm_math:
        # a no-op under fork (inherited); under spawn it keeps the sympy import out of the
        # first sample's deadline
        from components.verify.math import warm_up

        warm_up()
    _PROGRESS = None
    if batch_id is not None:  # fork: the parent's shared anonymous mapping, inherited
        mm = _FORK_PROGRESS.get(batch_id)
    else:
        try:
            fd = os.open(path, os.O_RDWR)  # type: ignore[arg-type]
        except FileNotFoundError:
            return  # a replacement worker started after its batch ended: nothing to do
        try:
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
    if mm is not None and not mm.closed:
        _PROGRESS = memoryview(mm).cast("d")


# A chunk's outcomes as columns (rewards, extracted answers, errors, timed-out flags):
# cheaper to pickle, send and store than one tuple per item.
_Columns = tuple[list[float], list["str | None"], list["str | None"], list[bool]]


def _run_chunk(
    chunk_id: int,
    batch_id: int | None,
    payload: range | list[int] | list[ScoreItem],
    timeout_s: float,
) -> _Columns:
    """Worker entry point: score a chunk, given as indices into an inherited batch
    (``batch_id`` set) or as the items themselves."""
    items: Sequence[ScoreItem]
    if batch_id is not None:
        batch = _FORK_BATCHES[batch_id]
        if isinstance(payload, range):
            items = batch[payload.start : payload.stop]
        else:
            items = [batch[i] for i in payload]  # type: ignore[index]
    else:
        items = payload  # type: ignore[assignment]
    progress = _PROGRESS
    base = _SLOT * chunk_id
    rewards: list[float] = []
    extracted: list[str | None] = []
    errors: list[str | None] = []
    timed: list[bool] = []
    fns: dict[str, Any] = {}
    clock = time.monotonic
    for pos, item in enumerate(items):
        spec = item.verifier
        fn = fns.get(spec)
        if fn is None:
            try:
                fn = fns[spec] = resolve_verifier(spec)
            except (Exception, SystemExit) as exc:
                outcome: _Outcome = (0.0, None, _error_message(exc), False)
                fn = None
        if fn is not None:
            if progress is not None:
                progress[base + 1] = pos
                start = progress[base] = clock()
                outcome = _call_verifier(fn, item)
                progress[base] = -1.0
            else:
                start = clock()
                outcome = _call_verifier(fn, item)
            if clock() - start > timeout_s:
                outcome = (0.0, None, _timeout_message(timeout_s), True)
        rewards.append(outcome[0])
        extracted.append(outcome[1])
        errors.append(outcome[2])
        timed.append(outcome[3])
    return rewards, extracted, errors, timed


@dataclass(slots=True)
class _Chunk:
    chunk_id: int
    indices: range | list[int]


# automatic chunking: at most this many items per chunk, to keep the resubmission cost of
# a killed chunk small ...
_MAX_CHUNK = 512
# ... and chunk sizes shrinking towards the end of the batch (each about 1 / (2 * workers)
# of what is left) so that the workers finish together; the smallest chunk is _MIN_CHUNK
# items, less for small batches (where samples are likely slow ones)
_MIN_CHUNK = 8


def _plan_chunks(n: int, num_workers: int, chunk_size: int | None) -> list[range]:
    if chunk_size is not None:
        return [range(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]
    smallest = max(1, min(_MIN_CHUNK, n // (8 * num_workers)))
    chunks: list[range] = []
    start = 0
    while start < n:
        size = max(smallest, min(_MAX_CHUNK, math.ceil((n - start) / (2 * num_workers))))
        stop = min(n, start + size)
        chunks.append(range(start, stop))
        start = stop
    return chunks


def _progress_dir() -> str | None:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


def score_batch(
    items: Sequence[ScoreItem],
    *,
    num_workers: int,
    timeout_s: float,
    chunk_size: int | None = None,
) -> list[ScoreResult]:
    """Score ``items`` with a per-sample deadline; results are in input order.

    Each distinct verifier spec is resolved in the calling process first, so a malformed
    spec or a plugin that cannot be imported raises ``UserError`` before any work starts.
    After that nothing raises: a verifier that raises gives ``reward=0.0`` and
    ``error="ValueError: ..."``, one that runs longer than ``timeout_s`` gives
    ``reward=0.0``, ``timed_out=True`` and ``error="timeout after 2.0s"``.

    ``num_workers=0`` runs inline without a pool and without enforcing ``timeout_s``.
    ``chunk_size`` (items per task sent to a worker) defaults to an automatic choice.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    items = list(items)
    if not items:
        return []
    specs: dict[str, str] = {}
    for spec in dict.fromkeys(map(_verifier_of, items)):  # distinct, in order of appearance
        canon = canonical_spec(spec)
        resolve_verifier(canon)  # raises UserError for a bad spec
        specs[spec] = canon
    batch = items
    if any(canon != spec for spec, canon in specs.items()):
        batch = [
            item
            if specs[item.verifier] == item.verifier
            else item._replace(verifier=specs[item.verifier])
            for item in items
        ]
    if num_workers == 0:
        return [ScoreResult(*_score_item(item, None, None, 0)) for item in batch]
    warm_math = "math" in specs.values()
    if warm_math:
        # import sympy once here so that forked workers inherit it instead of each importing
        # it within the deadline of their first symbolic comparison
        from components.verify.math import warm_up

        warm_up()
    return _score_pool(
        batch,
        num_workers=num_workers,
        timeout_s=timeout_s,
        chunks=_plan_chunks(len(batch), num_workers, chunk_size),
        warm_math=warm_math,
    )


def _open_progress(batch: list[ScoreItem], nbytes: int) -> tuple[int | None, str | None, mmap.mmap]:
    """The shared progress memory for one batch: ``(batch_id, path, mapping)``.

    Under ``fork`` the workers inherit the batch and an anonymous mapping (``batch_id`` set):
    nothing is pickled but the chunks' index ranges, and there is no file to clean up.
    Otherwise the mapping is backed by a temporary file (``path`` set) that workers open.
    """
    if multiprocessing.get_start_method() == "fork":
        batch_id = next(_BATCH_IDS)
        mm = mmap.mmap(-1, nbytes)
        with _FORK_LOCK:
            _FORK_BATCHES[batch_id] = batch
            _FORK_PROGRESS[batch_id] = mm
        return batch_id, None, mm
    fd, path = tempfile.mkstemp(prefix="rlvr-verify-", suffix=".progress", dir=_progress_dir())
    try:
        os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return None, path, mm


class _ResultColumns:
    """A batch's outcomes as columns, in input order; ``have`` marks the items that got one."""

    def __init__(self, n: int) -> None:
        self.rewards: list[float] = [0.0] * n
        self.extracted: list[str | None] = [None] * n
        self.errors: list[str | None] = [None] * n
        self.timed: list[bool] = [False] * n
        self.have = bytearray(n)

    def put(self, i: int, outcome: _Outcome) -> None:
        self.rewards[i], self.extracted[i], self.errors[i], self.timed[i] = outcome
        self.have[i] = 1

    def put_columns(self, indices: range | list[int], columns: _Columns) -> None:
        cr, ce, cerr, ct = columns
        if len(cr) != len(indices):  # pragma: no cover - a worker scores its whole chunk
            raise RuntimeError(f"internal error: {len(cr)} results for {len(indices)} items")
        if isinstance(indices, range):
            lo, hi = indices.start, indices.stop
            self.rewards[lo:hi] = cr
            self.extracted[lo:hi] = ce
            self.errors[lo:hi] = cerr
            self.timed[lo:hi] = ct
            self.have[lo:hi] = b"\x01" * (hi - lo)
        else:
            for k, i in enumerate(indices):
                self.put(i, (cr[k], ce[k], cerr[k], ct[k]))

    def to_results(self) -> list[ScoreResult]:
        if self.have.count(0):  # pragma: no cover - every path of _PoolRun fills its items
            missing = [i for i, h in enumerate(self.have) if not h]
            raise RuntimeError(f"internal error: no result for items {missing[:10]}")
        # one allocation burst of n small tuples: without the pause it would run dozens of
        # collections, each walking the parent's heap
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            columns = zip(self.rewards, self.extracted, self.errors, self.timed, strict=True)
            return list(map(_make_result, columns))
        finally:
            if gc_was_enabled:
                gc.enable()


class _PoolRun:
    """One batch scored in a pebble process pool, with a deadline per item.

    ``submit`` sends a chunk of item indices to the pool; ``run`` waits for the chunks,
    stores their outcomes and, every ``poll_s``, kills the chunks whose current item overran
    its deadline (``_watchdog``); ``close`` shuts the pool down and frees the progress memory.
    Progress slot ``_SLOT * chunk_id`` holds the running item's start time (``-1`` between
    items, ``0`` before the first) and the next slot its position in the chunk.
    """

    def __init__(
        self,
        batch: list[ScoreItem],
        *,
        num_workers: int,
        timeout_s: float,
        num_chunks: int,
        warm_math: bool,
    ) -> None:
        import pebble

        n = len(batch)
        # chunk ids: the first chunks, at most one resubmission per resolved failure, and at
        # most one single-item rerun per item
        max_ids = num_chunks + 2 * n + 1
        nbytes = 8 * _SLOT * max_ids
        self.batch = batch
        self.timeout_s = timeout_s
        self.batch_id, self.path, self.mm = _open_progress(batch, nbytes)
        self.progress = memoryview(self.mm).cast("d")
        self.results = _ResultColumns(n)
        self.ids = itertools.count()
        self.grace = max(1.0, timeout_s)
        self.poll_s = min(0.05, max(0.002, timeout_s / 10))
        self.timeout_outcome: _Outcome = (0.0, None, _timeout_message(timeout_s), True)
        self.pool = pebble.ProcessPool(
            max_workers=num_workers,
            initializer=_init_worker,
            initargs=(self.batch_id, self.path, nbytes, warm_math),
        )
        self.pending: dict[Any, _Chunk] = {}
        self.done_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def submit(self, indices: range | list[int]) -> None:
        cid = next(self.ids)
        self.progress[_SLOT * cid] = 0.0
        payload = indices if self.batch_id is not None else [self.batch[i] for i in indices]
        future = self.pool.schedule(
            _run_chunk,
            args=(cid, self.batch_id, payload, self.timeout_s),
            timeout=self.timeout_s * len(indices) + self.grace,
        )
        self.pending[future] = _Chunk(cid, indices)
        future.add_done_callback(self.done_queue.put)

    def run(self, chunks: list[range]) -> None:
        """Submit ``chunks`` and return once every item has an outcome."""
        for indices in chunks:
            self.submit(indices)
        last_scan = time.monotonic()
        while self.pending:
            try:
                future = self.done_queue.get(timeout=self.poll_s)
            except queue.Empty:
                future = None
            if future is not None:
                self._collect(future)
            now = time.monotonic()
            if now - last_scan < self.poll_s:
                continue
            last_scan = now
            self._watchdog(now)

    def _collect(self, future: Any) -> None:
        """Store the outcomes of a finished chunk, or handle its failure."""
        chunk = self.pending.pop(future, None)
        if chunk is None:
            return
        try:
            columns = future.result()
        except CancelledError:
            pass  # killed by the watchdog, already handled
        except FutureTimeoutError:
            self._fail_chunk(chunk, self.timeout_outcome)
        except Exception as exc:  # worker crash, pickling error, ...
            self._fail_chunk(chunk, (0.0, None, _error_message(exc), False))
        else:
            self.results.put_columns(chunk.indices, columns)

    def _watchdog(self, now: float) -> None:
        """Kill the chunks whose current item overran its deadline."""
        progress = self.progress
        for future, chunk in list(self.pending.items()):
            base = _SLOT * chunk.chunk_id
            start = progress[base]
            if start <= 0 or now - start <= self.timeout_s:
                continue
            pos = int(progress[base + 1])
            if progress[base] != start or not future.cancel():
                continue  # moved on meanwhile, or just finished
            del self.pending[future]
            self._drop_and_resubmit(chunk, pos, self.timeout_outcome)

    def _drop_and_resubmit(self, chunk: _Chunk, pos: int, outcome: _Outcome) -> None:
        """Give the item at ``pos`` its outcome and rerun the chunk's other items."""
        self.results.put(chunk.indices[pos], outcome)
        rest = [*chunk.indices[:pos], *chunk.indices[pos + 1 :]]
        if rest:
            self.submit(rest)

    def _fail_chunk(self, chunk: _Chunk, outcome: _Outcome) -> None:
        """A chunk failed as a whole: blame the running item if known, else split."""
        if len(chunk.indices) == 1:
            self.results.put(chunk.indices[0], outcome)
            return
        start = self.progress[_SLOT * chunk.chunk_id]
        if start > 0:
            pos = int(self.progress[_SLOT * chunk.chunk_id + 1])
            self._drop_and_resubmit(chunk, pos, outcome)
        else:
            for i in chunk.indices:
                self.submit([i])

    def close(self, clean: bool) -> None:
        """Shut the pool down (gracefully when ``clean``) and free the progress memory."""
        if self.batch_id is not None:
            with _FORK_LOCK:
                _FORK_BATCHES.pop(self.batch_id, None)
                _FORK_PROGRESS.pop(self.batch_id, None)
        if clean:
            # every task is done: let the pool wind down (pebble's join waits for its
            # management thread's next tick) off the caller's critical path
            self.pool.close()
            threading.Thread(
                target=self.pool.join, name="rlvr-verify-pool-join", daemon=True
            ).start()
        else:
            self.pool.stop()
            self.pool.join()
        self.progress.release()
        self.mm.close()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _score_pool(
    batch: list[ScoreItem],
    *,
    num_workers: int,
    timeout_s: float,
    chunks: list[range],
    warm_math: bool,
) -> list[ScoreResult]:
    run = _PoolRun(
        batch,
        num_workers=num_workers,
        timeout_s=timeout_s,
        num_chunks=len(chunks),
        warm_math=warm_math,
    )
    clean = False
    try:
        run.run(chunks)
        clean = True
    finally:
        run.close(clean)
    return run.results.to_results()
