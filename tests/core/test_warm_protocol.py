"""The warm-worker protocol (components/core/warm.py): waiting on commits, failure markers,
segments, the serve loop."""

from __future__ import annotations

import threading
import time

import pytest

from components.core.commit import OutputDir, shard_dir
from components.core.config import load_config
from components.core.errors import UserError
from components.core.lineages import policy_version
from components.core.store import LocalStore, join
from components.core.warm import (
    PeerFailed,
    RunStatus,
    Stage,
    Timeline,
    eval_checkpoints,
    process_start_time,
    segment,
    segment_eval_checkpoints,
    segments,
    serve,
    wait_committed,
)


def _commit(store, uri: str) -> None:
    out = OutputDir(store, uri, "test")
    out.begin(force=True)
    out.put_bytes(b"x", "f")
    out.commit({})


def test_wait_returns_once_every_input_is_committed(tmp_path):
    store, status = LocalStore(), RunStatus(LocalStore(), str(tmp_path))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _commit(store, a)
    # b is sharded: it counts only once both shards are committed.
    threading.Timer(0.15, _commit, (store, shard_dir(b, 0, 2))).start()
    threading.Timer(0.3, _commit, (store, shard_dir(b, 1, 2))).start()
    t0 = time.monotonic()
    waited = wait_committed(store, [a, b], status=status, task="t", timeout_s=10, poll_max_s=0.02)
    assert 0.28 < waited < 5 and time.monotonic() - t0 >= 0.28


def test_a_peer_failure_stops_the_wait_but_not_ones_own(tmp_path):
    store = LocalStore()
    status = RunStatus(store, str(tmp_path))
    status.mark_failed("me", "an old failure of my own")  # a retried task ignores its own
    threading.Timer(0.1, status.mark_failed, ("verify-worker", UserError("bad plugin"))).start()
    with pytest.raises(PeerFailed, match=r"task verify-worker of this run failed \(bad plugin\)"):
        wait_committed(store, [str(tmp_path / "never")], status=status, task="me", timeout_s=10)
    assert set(status.failures()) == {"me", "verify-worker"}
    status.clear("me")
    assert set(status.failures()) == {"verify-worker"}
    status.clear()
    assert status.failures() == {}


def test_wait_times_out_naming_the_missing_input(tmp_path):
    store = LocalStore()
    with pytest.raises(TimeoutError, match=r"waited 0 s .* for .*/missing to be committed"):
        wait_committed(
            store,
            [str(tmp_path / "missing")],
            status=RunStatus(store, str(tmp_path)),
            task="t",
            timeout_s=0.1,
            poll_max_s=0.02,
        )


class FakeStage(Stage):
    """Steps record what they saw; iteration `fail_at` raises."""

    task = "fake"

    def __init__(self, root: str, fail_at: int | None = None) -> None:
        self.root, self.fail_at, self.steps, self.closed = root, fail_at, [], False

    def needs(self, i: int) -> list[str]:
        return [join(self.root, f"in{i}")]

    def step(self, i: int, *, force: bool = False, timeline: Timeline) -> dict:
        if i == self.fail_at:
            raise UserError(f"iteration {i} is bad")
        self.steps.append((i, [s[0] for s in timeline.spans]))
        return {"skipped": False}

    def close(self) -> None:
        self.closed = True


def test_serve_steps_in_order_records_waits_and_marks_failures(tmp_path):
    store = LocalStore()
    status = RunStatus(store, str(tmp_path))
    for i in range(3):
        _commit(store, str(tmp_path / f"in{i}"))
    stage = FakeStage(str(tmp_path), fail_at=2)
    with pytest.raises(UserError, match="iteration 2 is bad"):
        serve(stage, range(3), status=status, store=store, timeout_s=5, poll_max_s=0.02)
    assert [i for i, _ in stage.steps] == [0, 1] and stage.closed
    assert stage.steps[1][1] == ["wait"]
    record = status.failures()["fake"]
    assert record["error"] == "iteration 2 is bad"  # bad input reads as its message
    assert record["iteration"] == 2 and record["user_error"] is True
    # A retry clears its own marker first and resumes.
    ok = FakeStage(str(tmp_path))
    serve(ok, range(3), status=status, store=store, timeout_s=5, poll_max_s=0.02)
    assert [i for i, _ in ok.steps] == [0, 1, 2] and status.failures() == {}


def test_segments_eval_checkpoints_and_policy_versions(workspace):
    cfg = load_config(
        workspace,
        [
            "run.iterations=7",
            "run.segment_iterations=3",
            "evaluate.every=2",
            "train.max_staleness=2",
        ],
    )
    assert [(s.start, s.stop) for s in segments(cfg)] == [(0, 3), (3, 6), (6, 7)]
    assert eval_checkpoints(cfg) == [0, 2, 4, 6, 7]
    # Each segment's evaluate worker takes the checkpoints its train worker writes (+ the base).
    assert [segment_eval_checkpoints(cfg, s) for s in segments(cfg)] == [[0, 2], [4, 6], [7]]
    assert [policy_version(cfg, i) for i in range(5)] == [0, 0, 0, 1, 2]
    with pytest.raises(UserError, match=r"segment 3 does not exist: .* makes 3 segment\(s\)"):
        segment(cfg, 3)


def test_timeline_record_and_process_start():
    tl = Timeline("generate", 4)
    with tl.span("work"):
        time.sleep(0.01)
    tl.add("wait", 1.0, 1.5)
    rec = tl.record()
    assert rec["task"] == "generate" and rec["iteration"] == 4
    assert [s[0] for s in rec["spans"]] == ["work", "wait"]
    assert rec["seconds"]["wait"] == pytest.approx(0.5) and rec["seconds"]["work"] >= 0.01
    # The process started before this test ran and after the machine booted.
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    assert boot <= process_start_time() <= time.time()


@pytest.mark.parametrize(
    ("end", "status", "said"),
    [
        ("served.set()", 0, "later handler ran"),  # done: quick exit, after every later handler
        ("served.set(); raise RuntimeError('after the work')", 1, "RuntimeError: after the work"),
        ("import sys; sys.exit(3)", 3, "later handler ran"),  # never served: an ordinary exit
        ("served.set(); import sys; sys.exit(3)", 3, "later handler ran"),  # failed after it
    ],
)
def test_a_served_worker_leaves_quickly_and_a_failure_keeps_its_status(end, status, said):
    """A worker in KFP's executor process skips the interpreter's teardown once its segment is
    served (quick_exit.quick_exit_after_success): its later atexit handlers, logs and output
    still come out, and anything that fails after the work keeps its traceback and status."""
    import subprocess
    import sys

    code = "\n".join(
        [
            "import atexit, logging, sys, types",
            # registered before it, like logging's own: stands for the teardown that is skipped
            "atexit.register(lambda: print('full teardown', flush=True))",
            "sys.modules['__main__'].__spec__ = types.SimpleNamespace(name='kfp.dsl.executor_main')",
            "from components.core.quick_exit import quick_exit_after_success",
            "served = quick_exit_after_success()",
            "atexit.register(lambda: print('later handler ran', flush=True))",
            "logging.basicConfig(level=logging.INFO); logging.info('a log line')",
            "print('buffered', end='')",
            end,
        ]
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == status, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert said in out and "a log line" in res.stderr and res.stdout.startswith("buffered")
    assert ("full teardown" in res.stdout) == (status != 0)


def test_a_worker_called_in_process_exits_as_usual():
    import atexit

    from components.core.quick_exit import quick_exit_after_success

    before = atexit._ncallbacks()
    quick_exit_after_success().set()
    assert atexit._ncallbacks() == before  # pytest's own exit status is never touched


def test_a_served_worker_ends_its_daemonic_children_before_leaving():
    """multiprocessing's own exit handler (registered before the quick exit, so it would be
    skipped) still ends a worker's daemonic children: none is left holding the task's output
    pipe, which the local runner reads to its end."""
    import subprocess
    import sys

    code = "\n".join(
        [
            "import multiprocessing as mp, sys, time, types",
            "sys.modules['__main__'].__spec__ = types.SimpleNamespace(name='kfp.dsl.executor_main')",
            "from components.core.quick_exit import quick_exit_after_success",
            "served = quick_exit_after_success()",
            "child = mp.get_context('fork').Process(target=time.sleep, args=(60,), daemon=True)",
            "child.start()",
            "print('child', child.pid, flush=True)",
            "served.set()",
        ]
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "child" in res.stdout, res.stderr[-2000:]
