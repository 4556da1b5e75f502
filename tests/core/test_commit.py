"""The _SUCCESS commit protocol (components/core/commit.py) that makes outputs atomic, on a
local directory and on S3 (moto server, real HTTP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.core.commit import (
    SUCCESS,
    NotCommittedError,
    OutputDir,
    committed_files,
    materialize,
    read_manifest,
)
from components.core.store import LocalStore, StoreError, join


def test_commit_protocol(store_root, tmp_path):
    store, root = store_root
    uri = join(root, "out")
    out = OutputDir(store, uri, "test")
    assert out.begin() is True
    out.put_bytes(b"x" * 10, "one.bin")
    with pytest.raises(NotCommittedError, match="not committed"):
        read_manifest(store, uri)  # written but not committed: readers refuse it
    manifest = out.commit({"rows": 3})
    assert manifest["files"] == [
        {"path": "one.bin", "bytes": 10, "sha256": manifest["files"][0]["sha256"]}
    ]
    assert read_manifest(store, uri)["stats"] == {"rows": 3}
    assert committed_files(store, uri, ".bin") == [join(uri, "one.bin")]
    # Idempotent: a committed directory is not redone without force.
    assert OutputDir(store, uri, "test").begin() is False
    # Force clears everything, _SUCCESS first.
    again = OutputDir(store, uri, "test")
    assert again.begin(force=True) is True
    assert store.list_files(uri) == []


def test_materialize_checks_the_manifest(store_root, tmp_path):
    store, root = store_root
    uri = join(root, "ckpt")
    out = OutputDir(store, uri, "test")
    out.begin()
    out.put_bytes(b"weights", "w.bin")
    out.commit()
    local = materialize(store, uri, cache_root=tmp_path / "cache")
    assert (local / "w.bin").read_bytes() == b"weights"
    # Tamper with the object behind the manifest's back: readers notice.
    store.write_bytes(join(uri, "w.bin"), b"tampered!")
    with pytest.raises(StoreError, match="manifest"):
        materialize(store, uri, cache_root=tmp_path / "cache2")


@pytest.mark.slow
def test_killed_stage_leaves_nothing_trusted(workspace, cfg):
    """A generate stage SIGKILLed after its first part leaves no _SUCCESS; a rerun replaces it."""
    from components.core.layout import RunLayout
    from components.core.store import LocalStore
    from components.model import run_setup

    run_setup.run(cfg)
    layout = RunLayout.of(cfg)
    rollouts = Path(layout.rollouts(0))
    args = [
        sys.executable,
        "-m",
        "components.generate",
        str(workspace),
        "-i",
        "0",
        "--set",
        "generate.rows_per_part=4",
        "--set",
        "generate.transformers.batch_size=4",
        "--set",
        "generate.max_new_tokens=64",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(rollouts.glob("part-*.parquet")):
            assert proc.poll() is None, "stage ended before it could be killed"
            time.sleep(0.05)
        assert list(rollouts.glob("part-*.parquet")), "no part was written in time"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    store = LocalStore()
    assert not (rollouts / SUCCESS).exists()
    with pytest.raises(NotCommittedError):
        committed_files(store, str(rollouts), ".parquet")
    # The next stage refuses the partial output, with a message that says what to run.
    from components.verify.stage import run as verify

    with pytest.raises(NotCommittedError, match="run that stage first"):
        verify(cfg, 0)
    # A rerun replaces the partial output and commits.
    from components.generate.stage import run as generate

    result = generate(cfg, 0)
    manifest = json.loads((rollouts / SUCCESS).read_text())
    listed = sorted(f["path"] for f in manifest["files"])
    assert listed == sorted(p.name for p in rollouts.glob("part-*.parquet"))
    assert result["stats"]["samples"] == cfg.data.prompts_per_iteration * cfg.generate.n


def test_begin_uncommits_before_clearing(store_root):
    """The _SUCCESS marker itself goes first (a single-object delete, also on S3)."""
    store, root = store_root
    uri = join(root, "out")
    out = OutputDir(store, uri, "test")
    out.begin()
    out.put_bytes(b"data", "a.bin")
    out.commit()
    store.delete(join(uri, SUCCESS))
    assert not store.exists(join(uri, SUCCESS)) and store.exists(join(uri, "a.bin"))
    store.delete(join(uri, "missing"))  # no error for an absent object


def test_local_put_tree_moves_by_rename_and_records_hashes(tmp_path):
    """A checkpoint is written once: built in a scratch directory beside the output and renamed
    into it (same inode), with every file's size and sha256 in the manifest."""
    import hashlib

    from components.core.commit import OutputDir, read_manifest

    out = OutputDir(LocalStore(), str(tmp_path / "runs" / "ckpt"), "train")
    out.begin(force=True)
    scratch = out.scratch_dir()
    assert scratch.parent == tmp_path / "runs" and scratch.name.startswith(".ckpt.")
    (scratch / "sub").mkdir()
    (scratch / "sub" / "w.bin").write_bytes(b"weights" * 1000)
    inode = (scratch / "sub" / "w.bin").stat().st_ino
    out.put_tree(scratch, move=True)
    out.commit({})
    moved = tmp_path / "runs" / "ckpt" / "sub" / "w.bin"
    assert moved.stat().st_ino == inode and not (scratch / "sub" / "w.bin").exists()
    (entry,) = read_manifest(LocalStore(), str(tmp_path / "runs" / "ckpt"))["files"]
    assert entry == {
        "path": "sub/w.bin",
        "bytes": 7000,
        "sha256": hashlib.sha256(b"weights" * 1000).hexdigest(),
    }


@pytest.mark.parametrize(
    "old_key",
    ["/runs/r/iterations/00000/scored", "s3://b/r/iterations/00000/scored", "train_state/"],
)
def test_an_output_of_an_older_lineage_is_refused_not_recomputed(tmp_path, old_key):
    """Input keys only an rlvr before this lineage wrote (absolute URIs, the train state as an
    input): a clear error naming the output and the way out, never a silent recompute."""
    from components.core.errors import UserError

    store, uri = LocalStore(), str(tmp_path / "runs" / "r" / "checkpoints" / "00001")
    out = OutputDir(store, uri, "train")
    out.begin()
    out.put_bytes(b"w", "model.safetensors")
    out.commit({}, {old_key: "abc", "config": "def"})
    now = {"iterations/00000/scored": "abc", "config": "def"}
    with pytest.raises(UserError, match=r"00001 was committed by an rlvr older.*run.run_id"):
        OutputDir(store, uri, "train").up_to_date(now)
    out.begin(force=True)  # an input outside the run keeps its URI: that is this lineage's own
    out.commit({}, {"s3://b/base": "abc", "config": "def"})
    assert not OutputDir(store, uri, "train").up_to_date({"s3://b/base": "abd", "config": "def"})
