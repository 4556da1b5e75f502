"""Where a run's time went (components/report/timeline.py), on manifests written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core.store import get_store, join
from components.report.timeline import format_summary, load_timeline, plot_timeline, summary

OUTPUT = {"generate": "rollouts", "verify": "scored"}


def _commit(root: Path, stage: str, i: int, spans: list, *, one_shot: bool = False) -> None:
    where = (
        f"checkpoints/{i + 1:05d}" if stage == "train" else f"iterations/{i:05d}/{OUTPUT[stage]}"
    )
    record = {"task": stage, "iteration": i, "pid": 7 if not one_shot else 99, "spans": spans}
    if one_shot:
        record["one_shot"] = True
    store = get_store(str(root))
    store.write_text(
        join(str(root), where, "_SUCCESS"), json.dumps({"stats": {"timeline": record}})
    )


def _warm_run(root: Path) -> None:
    """Three iterations served by warm workers from t = 1000 s: 1 s of work per step."""
    t = 1000.0
    for i in range(3):
        for stage in ("generate", "verify", "train"):
            spans = [["start", t - 1, t]] if i == 0 else []
            _commit(root, stage, i, [*spans, ["wait", t, t], ["work", t, t + 1.0]])
            t += 1.0


def test_a_stage_rerun_long_after_the_run_leaves_its_timing_alone(tmp_path: Path) -> None:
    _warm_run(tmp_path)
    before = summary(load_timeline(get_store(str(tmp_path)), str(tmp_path)))
    # `rlvr stage verify -i 1 --force` twenty minutes later
    _commit(
        tmp_path, "verify", 1, [["start", 2300.0, 2302.0], ["work", 2302.0, 2303.0]], one_shot=True
    )
    tl = load_timeline(get_store(str(tmp_path)), str(tmp_path))
    after = summary(tl)
    assert after["wall_s"] == pytest.approx(before["wall_s"])
    assert after["wall_s"] < 11 and after["fixed_share"] < 0.35  # 0.99 when counted
    assert after["reruns"] == ["verify 00001"]
    assert "not counted: 1 step(s) rerun alone since the run (verify 00001" in format_summary(after)
    plot_timeline(tl, tmp_path / "t.png")  # draws the run only


def test_a_run_made_stage_by_stage_is_its_own_timeline(tmp_path: Path) -> None:
    for i, stage in enumerate(("generate", "verify", "train")):
        _commit(
            tmp_path,
            stage,
            0,
            [["start", 10.0 * i, 10.0 * i + 2], ["work", 10.0 * i + 2, 10.0 * i + 3]],
            one_shot=True,
        )
    s = summary(load_timeline(get_store(str(tmp_path)), str(tmp_path)))
    assert s["steps"] == 3 and s["reruns"] == [] and s["wall_s"] == pytest.approx(23.0)


def test_the_policy_handoff_is_the_load_and_commit_inside_each_iteration(tmp_path: Path) -> None:
    """Per iteration: generate loads for 0.5 s, works 1 s; verify works 1 s; train works 2 s and
    commits for 1.5 s. An iteration (end of train i-1 to end of train i) is 6 s, of it 2 s the
    handoff (0.5 + 1.5): 1/3."""
    t = 0.0
    for i in range(3):
        _commit(tmp_path, "generate", i, [["load", t, t + 0.5], ["work", t + 0.5, t + 1.5]])
        _commit(tmp_path, "verify", i, [["work", t + 1.5, t + 2.5]])
        _commit(tmp_path, "train", i, [["work", t + 2.5, t + 4.5], ["commit", t + 4.5, t + 6.0]])
        t += 6.0
    s = summary(load_timeline(get_store(str(tmp_path)), str(tmp_path)))
    assert s["iteration_s"] == pytest.approx(6.0)
    assert s["handoff_s"] == pytest.approx(2.0)
    assert s["handoff_share"] == pytest.approx(1 / 3)
    assert "policy handoff, checkpoint commit and load, 2.00 s: 33%" in format_summary(s)


def test_the_handoff_counts_only_its_part_inside_an_iteration_and_the_slowest_shard():
    """Iteration i runs from t = 10i to 10i + 10 (train: work 4-8 s in, commit 8-10 s in). Two
    generate shards load: one from 1 s before the iteration (bounded staleness: it ran ahead)
    to 1 s in, one from 0 to 1.5 s in. The handoff is the commit (2 s) plus the slowest shard's
    load inside the interval (1.5 s, not the first shard's 2 s span): 3.5 s of 10."""
    from components.report.timeline import RunTimeline, Step, handoff_times

    steps = []
    for i in range(3):
        t = 10.0 * i
        steps.append(
            Step("train", "train", i, [("work", t + 4, t + 8), ("commit", t + 8, t + 10)], pid=7)
        )
        steps.append(
            Step(
                "generate-shard-00000-of-00002",
                "generate",
                i,
                [("load", t - 1, t + 1), ("work", t + 1, t + 3)],
            )
        )
        steps.append(
            Step(
                "generate-shard-00001-of-00002",
                "generate",
                i,
                [("load", t, t + 1.5), ("work", t + 1.5, t + 3)],
            )
        )
    got = handoff_times(RunTimeline(steps))
    assert [i for i, _, _ in got] == [1, 2]
    for _, handoff, period in got:
        assert handoff == pytest.approx(3.5) and period == pytest.approx(10.0)
