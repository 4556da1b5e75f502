"""Turns on a shared GPU (components/model/device_turn.py): a yielder waits while a holder in another
process computes, goes on once it stops or dies, and nothing happens where the variable is unset."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from components.model import device_turn


def _hold(path: str, ready, release) -> None:
    import os

    os.environ[device_turn.TURN_ENV] = f"hold:{path}"
    with device_turn.holding():
        ready.set()
        release.wait(30)


def _holder(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path / "turn"), ready, release))
    proc.start()
    assert ready.wait(60)
    return proc, release


def test_a_yielder_waits_while_a_holder_computes(tmp_path, monkeypatch):
    monkeypatch.setenv(device_turn.TURN_ENV, f"yield:{tmp_path / 'turn'}")
    wait = device_turn.waiter()
    assert wait is not None
    device_turn.take_waits()
    wait()  # no holder: at once, and no wait recorded
    assert device_turn.take_waits() == []
    proc, release = _holder(tmp_path)
    try:
        t0 = time.monotonic()
        threading_release_after(release, 0.5)
        wait()
        assert time.monotonic() - t0 >= 0.45  # waited for the holder's release
    finally:
        release.set()
        proc.join(30)
    ((start, end),) = device_turn.take_waits()  # the wait, for the evaluation's timeline
    assert end - start >= 0.4
    assert device_turn.take_waits() == []


def test_waits_are_cut_out_of_the_spans_they_fell_in():
    """An evaluation's waits become `turn` spans; the span around each keeps the rest of its
    time (hand-computed), and a wait outside every span is another step's."""
    from components.core.timing import Timeline
    from components.report.timeline import Step

    tl = Timeline("evaluate", 3)
    tl.add("load", 0.0, 2.0)
    tl.add("work", 2.0, 10.0)
    tl.add("commit", 10.0, 11.0)
    # inside one span; across two; overlapping an earlier wait; to a span's end; outside all
    tl.carve("turn", [(0.5, 1.0), (1.5, 2.5), (3.0, 4.0), (3.5, 4.5), (6.0, 10.0), (20.0, 21.0)])
    assert tl.spans == [
        ["load", 0.0, 0.5],
        ["turn", 0.5, 1.0],
        ["load", 1.0, 1.5],
        ["turn", 1.5, 2.0],
        ["turn", 2.0, 2.5],
        ["work", 2.5, 3.0],
        ["turn", 3.0, 4.0],
        ["turn", 4.0, 4.5],
        ["work", 4.5, 6.0],
        ["turn", 6.0, 10.0],
        ["commit", 10.0, 11.0],
    ]
    assert tl.seconds("load") == 1.0 and tl.seconds("work") == 2.0
    assert tl.seconds("turn") == 7.0
    step = Step("evaluate", "evaluate", 3, [tuple(x) for x in tl.spans])
    assert step.busy == 11.0 - 7.0  # waiting for a turn is not busy


def test_a_dead_holder_releases_its_turn(tmp_path, monkeypatch):
    monkeypatch.setenv(device_turn.TURN_ENV, f"yield:{tmp_path / 'turn'}")
    wait = device_turn.waiter()
    proc, _release = _holder(tmp_path)
    proc.kill()
    proc.join(30)
    t0 = time.monotonic()
    wait()
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("value", ["", "off", "hold:", "bogus:/tmp/x"])
def test_unset_or_other_values_do_nothing(value, monkeypatch):
    monkeypatch.setenv(device_turn.TURN_ENV, value)
    assert device_turn.waiter() is None
    with device_turn.holding():
        pass


def test_the_local_runner_gives_evaluation_the_yield_and_the_loop_the_hold():
    env = {t: device_turn.env_for(t, "/x") for t in ("generate", "train", "evaluate-1", "verify")}
    assert env["generate"] == env["train"] == {device_turn.TURN_ENV: "hold:/x"}
    assert env["evaluate-1"] == {device_turn.TURN_ENV: "yield:/x"}
    assert env["verify"] == {}


def threading_release_after(event, seconds: float) -> None:
    import threading

    threading.Timer(seconds, event.set).start()


def test_a_models_forwards_wait_their_turn_inside_the_block(tmp_path, monkeypatch):
    """lm-eval's adapter calls the model itself: its forwards wait through a pre-hook, which
    goes with the block."""
    import torch

    monkeypatch.setenv(device_turn.TURN_ENV, f"yield:{tmp_path / 'turn'}")
    model = torch.nn.Linear(2, 2)
    proc, release = _holder(tmp_path)
    try:
        threading_release_after(release, 0.5)
        with device_turn.yielding_forwards(model):
            t0 = time.monotonic()
            model(torch.zeros(1, 2))
            assert time.monotonic() - t0 >= 0.45  # waited for the holder
        assert not model._forward_pre_hooks  # removed with the block
    finally:
        release.set()
        proc.join(30)
    monkeypatch.delenv(device_turn.TURN_ENV)
    with device_turn.yielding_forwards(model):  # no turns: no hook
        assert not model._forward_pre_hooks
