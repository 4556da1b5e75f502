"""Retention (components/core/retention.py): which checkpoints and train states a run keeps, and
deleting the rest without pulling them from under a reader."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.core.commit import (
    OutputDir,
    RetiredError,
    content_digest,
    materialize,
    read_manifest,
)
from components.core.config import load_config
from components.core.layout import RunLayout, store_for
from components.core.retention import (
    Inventory,
    kept_checkpoints,
    reading,
    retire,
    sweep,
    to_retire,
)
from components.core.store import LocalStore, join
from tests.support.runs import write_config


def commit(store, uri: str, payload: bytes = b"weights") -> None:
    out = OutputDir(store, uri, "train")
    out.begin(force=True)
    out.put_bytes(payload, "model.safetensors")
    out.put_bytes(b"{}", "config.json")
    out.commit({"train/reward_mean": 0.5}, {"config": "x"})


def commit_state(store, layout, s: int) -> None:
    """A train state as train commits it: it records the checkpoint it belongs to."""
    out = OutputDir(store, layout.train_state(s), "train")
    out.begin(force=True)
    out.put_bytes(b"x", "state-00000-of-00001.safetensors")
    out.commit({"checkpoint_digest": content_digest(store, layout.checkpoint(s))})


@pytest.fixture
def run_cfg(tmp_path, tiny_assets):
    path = write_config(tmp_path, tiny_assets, evaluate={"every": 4})
    cfg = load_config(path)
    cfg.run.iterations = 12
    cfg.retention.keep_last = 2
    cfg.retention.milestone_every = 5
    cfg.train.max_staleness = 1
    return cfg


def test_the_policy_keeps_the_base_the_newest_milestones_and_what_stages_still_read(run_cfg):
    """Checkpoints 0..9 live (train of iteration 8 done), 0 and 4 evaluated, rollouts of
    iterations 0..9 committed. Kept: the base 0; the newest two, 8 and 9; the milestone 5;
    8, which evaluate has still to score (every 4th); 9, which generate of iteration 10 samples
    with (staleness 1). Everything else goes; of the states, the newest alone stays."""
    inv = Inventory(checkpoints=set(range(10)), evaluated={0, 4}, states={3, 6, 9})
    generated = set(range(10))
    assert kept_checkpoints(run_cfg, inv, generated) == {0, 5, 8, 9}
    assert to_retire(run_cfg, inv, generated) == ([1, 2, 3, 4, 6, 7], [3, 6])
    # generate of iteration 5 has not sampled yet: checkpoint 4 (5 - 1) stays for it
    assert 4 in kept_checkpoints(run_cfg, inv, set(range(5)))
    run_cfg.retention.milestone_every = 0
    run_cfg.retention.keep_states = 2
    assert to_retire(run_cfg, inv, generated) == ([1, 2, 3, 4, 5, 6, 7], [3])
    run_cfg.retention.enabled = False
    assert to_retire(run_cfg, inv, generated) == ([], [])


def test_a_retired_checkpoint_keeps_its_manifest_and_lineage_but_not_its_files(tmp_path):
    store = LocalStore()
    uri = str(tmp_path / "run" / "checkpoints" / "00003")
    commit(store, uri)
    digest = content_digest(store, uri)
    assert retire(store, uri, "test", lease_ttl_s=60) is True
    assert sorted(p.name for p in Path(uri).iterdir()) == ["_SUCCESS"]
    manifest = read_manifest(store, uri)
    assert manifest["retired"]["by"] == "test"
    assert manifest["stats"] == {"train/reward_mean": 0.5}  # reports read this
    assert content_digest(store, uri) == digest  # lineage of what trained from it holds
    with pytest.raises(RetiredError, match=r"--iteration 2 --force") as e:
        materialize(store, uri)
    assert "retention" in str(e.value) and uri in str(e.value)
    with pytest.raises(RetiredError), reading(store, uri, "generate"):
        pass
    assert retire(store, uri, "test", lease_ttl_s=60) is True  # again: nothing changes


def test_a_reader_holds_deletion_off_until_it_is_done(tmp_path):
    store = LocalStore()
    uri = str(tmp_path / "run" / "checkpoints" / "00001")
    commit(store, uri)
    with reading(store, uri, "generate") as manifest:
        assert manifest["files"]
        assert retire(store, uri, "train", lease_ttl_s=60) is False
        assert (Path(uri) / "model.safetensors").read_bytes() == b"weights"
    assert retire(store, uri, "train", lease_ttl_s=60) is True
    leases = tmp_path / "run" / "status" / "retention" / "leases"
    assert list(leases.iterdir()) == []  # the reader's lease went with it


def test_a_crashed_readers_lease_holds_nothing_off(tmp_path):
    """A lease of a process gone from this host, or older than the TTL, is ignored."""
    store = LocalStore()
    root = tmp_path / "run"
    uri = str(root / "checkpoints" / "00001")
    commit(store, uri)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    import socket

    lease = {
        "by": "generate",
        "host": socket.gethostname(),
        "pid": int(gone.stdout),
        "at": time.time(),
    }
    store.write_text(
        join(str(root), "status/retention/leases/checkpoints-00001.a.json"), json.dumps(lease)
    )
    old = {"by": "x", "host": "elsewhere", "pid": 1, "at": time.time() - 100}
    store.write_text(
        join(str(root), "status/retention/leases/checkpoints-00001.b.json"), json.dumps(old)
    )
    assert retire(store, uri, "train", lease_ttl_s=60) is True


def test_a_reader_waits_while_a_sweeper_decides_then_sees_the_outcome(tmp_path):
    """A reader that finds a retiring intent waits: if the sweeper backs off, it reads; if it
    retires, the reader gets RetiredError, never files that vanish under it."""
    store = LocalStore()
    root = tmp_path / "run"
    uri = str(root / "checkpoints" / "00002")
    commit(store, uri)
    intent = join(str(root), "status/retention/retiring/checkpoints-00002.s.json")
    import os
    import socket

    store.write_text(
        intent,
        json.dumps(
            {"by": "s", "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        ),
    )
    threading.Timer(0.4, lambda: store.delete(intent)).start()  # the sweeper backs off
    t0 = time.monotonic()
    with reading(store, uri, "generate") as manifest:
        assert manifest["files"]
    assert time.monotonic() - t0 >= 0.35

    store.write_text(
        intent,
        json.dumps(
            {"by": "s", "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        ),
    )

    def retire_then_clear() -> None:  # the sweeper retires (its own intent is another file)
        manifest = read_manifest(store, uri)
        manifest["retired"] = {"at": time.time(), "by": "s"}
        store.write_text(join(uri, "_SUCCESS"), json.dumps(manifest))
        store.delete(join(uri, "model.safetensors"))
        store.delete(intent)

    threading.Timer(0.3, retire_then_clear).start()
    with pytest.raises(RetiredError), reading(store, uri, "generate"):
        pass


def test_a_checkpoint_outside_a_run_is_read_without_markers(tmp_path):
    """`rlvr eval --checkpoint DIR` on a directory of one's own: nothing is written beside it."""
    store = LocalStore()
    uri = str(tmp_path / "models" / "mine")
    commit(store, uri)
    with reading(store, uri, "evaluate") as manifest:
        assert manifest["files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


def test_sweep_over_s3_deletes_what_the_policy_does_not_keep(run_cfg, s3_bucket):
    """A run's store on S3 (moto over real HTTP): the sweep lists it, retires checkpoints and
    states past the policy, and leaves the rest."""
    run_cfg.run.store = f"s3://{s3_bucket}/runs"
    store, layout = store_for(run_cfg), RunLayout.of(run_cfg)
    for c in range(6):
        commit(store, layout.checkpoint(c))
    for s in (3, 5):
        commit_state(store, layout, s)
    for c in (0, 4):
        out = OutputDir(store, layout.evals(c), "evaluate")
        out.begin(force=True)
        out.put_bytes(b"{}", "metrics.json")
        out.commit({})
    for i in range(6):
        out = OutputDir(store, layout.rollouts(i), "generate")
        out.begin(force=True)
        out.put_bytes(b"x", "part-00000.parquet")
        out.commit({})
    retired = sweep(run_cfg, "train")
    # kept: 0 (base), 4 and 5 (the newest two), 5 also the milestone and generate's next
    assert sorted(u.rsplit("/", 2)[-2] + "/" + u.rsplit("/", 1)[-1] for u in retired) == [
        "checkpoints/00001",
        "checkpoints/00002",
        "checkpoints/00003",
        "train_state/00003",
    ]
    inv = Inventory.of(store, layout.root)
    assert inv.checkpoints == {0, 4, 5} and inv.retired_checkpoints == {1, 2, 3}
    assert inv.states == {5} and inv.retired_states == {3}
    assert store.list_files(layout.checkpoint(2)) == ["_SUCCESS"]
    assert sweep(run_cfg, "train") == []  # nothing more to do


def test_rlvr_prune_applies_the_policy_to_a_run_kept_whole(run_cfg):
    """A run that kept everything (retention off, or an older rlvr): `rlvr prune` says what the
    policy would delete, then deletes it; manifests stay."""
    from click.testing import CliRunner

    from pipelines.cli import main

    store, layout = store_for(run_cfg), RunLayout.of(run_cfg)
    for c in range(13):
        commit(store, layout.checkpoint(c))
    for s in (10, 12):
        commit_state(store, layout, s)
    for i in range(12):
        out = OutputDir(store, layout.rollouts(i), "generate")
        out.begin(force=True)
        out.put_bytes(b"x", "part-00000.parquet")
        out.commit({})
    for c in (0, 4, 8, 12):
        out = OutputDir(store, layout.evals(c), "evaluate")
        out.begin(force=True)
        out.put_bytes(b"{}", "metrics.json")
        out.commit({})
    store.write_text(layout.run_yaml, run_cfg.to_yaml())
    dry = CliRunner().invoke(main, ["prune", layout.root, "--dry-run"], catch_exceptions=False)
    assert dry.exit_code == 0, dry.output
    # kept: 0, 11 and 12 (the newest two), 5 and 10 (milestones of 5); the newest state
    assert "checkpoints [1, 2, 3, 4, 6, 7, 8, 9]" in dry.output and "states [10]" in dry.output
    assert (Path(layout.checkpoint(1)) / "model.safetensors").exists()
    done = CliRunner().invoke(main, ["prune", layout.root], catch_exceptions=False)
    assert done.exit_code == 0 and "9 checkpoint(s) and state(s)" in done.output
    inv = Inventory.of(store, layout.root)
    assert inv.checkpoints == {0, 5, 10, 11, 12} and inv.states == {12}
    bad = CliRunner().invoke(main, ["prune", str(Path(layout.root).parent / "nope")])
    assert bad.exit_code == 2 and "has no run.yaml" in bad.output


def test_a_state_whose_checkpoint_was_redone_goes_first(run_cfg):
    """The newest state belongs to a checkpoint redone since: a resume cannot use it, so it is
    retired and the older, usable one is kept."""
    from components.core.retention import planned

    store, layout = store_for(run_cfg), RunLayout.of(run_cfg)
    for c in range(8):
        commit(store, layout.checkpoint(c), payload=f"w{c}".encode())
    for s in (4, 7):
        commit_state(store, layout, s)
    commit(store, layout.checkpoint(7), payload=b"redone")  # checkpoint 7 redone since
    assert planned(run_cfg)[1] == [7]


def test_evaluation_skips_a_retired_checkpoint(run_cfg):
    """An evaluation asked of a checkpoint whose files are gone (eval settings changed after
    the fact; `rlvr eval --watch` behind the run) is skipped with a warning and counts as done."""
    from components.core.timing import Timeline
    from components.evaluate.stage import EvaluateStage

    store, layout = store_for(run_cfg), RunLayout.of(run_cfg)
    commit(store, layout.checkpoint(3))
    retire(store, layout.checkpoint(3), "train", lease_ttl_s=60)
    stage = EvaluateStage(run_cfg)
    assert stage.up_to_date(3)
    result = stage.step(3, timeline=Timeline("evaluate", 3))
    assert result["skipped"] and result["retired"]
    assert not Path(layout.evals(3)).exists()
