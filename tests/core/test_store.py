"""The object store on a local directory and on S3 (moto server, real HTTP); the commit
protocol on top of it is tests/core/test_commit.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.core.store import LocalStore, StoreError, get_store, join


def test_bytes_roundtrip_list_and_delete(store_root, tmp_path):
    store, root = store_root
    store.write_bytes(join(root, "a/b.txt"), b"hello")
    store.write_text(join(root, "a/c/d.json"), "{}")
    local = tmp_path / "up.bin"
    local.write_bytes(b"\x00\x01" * 1000)
    store.upload_file(local, join(root, "a/up.bin"))
    assert store.read_bytes(join(root, "a/b.txt")) == b"hello"
    assert store.list_files(join(root, "a")) == ["b.txt", "c/d.json", "up.bin"]
    assert store.list_dirs(join(root, "a")) == ["c"]
    assert store.exists(join(root, "a/b.txt")) and not store.exists(join(root, "a/zz"))
    down = tmp_path / "down.bin"
    store.download_file(join(root, "a/up.bin"), down)
    assert down.read_bytes() == local.read_bytes()
    store.delete_tree(join(root, "a"))
    assert store.list_files(join(root, "a")) == []


def test_missing_object_names_the_uri(store_root):
    store, root = store_root
    with pytest.raises(StoreError, match="nope"):
        store.read_bytes(join(root, "nope"))


def test_unsupported_scheme():
    with pytest.raises(StoreError, match="unsupported URI scheme"):
        get_store("gs://bucket/x")


def test_local_writes_get_the_ordinary_file_mode(tmp_path):
    """Committed files are as readable as any file the process writes (0o666 less the umask),
    not mkstemp's 0o600: a task running as another uid (a container, another user of a shared
    run directory) must be able to read the run."""
    import stat

    from components.core import store as store_mod

    store = LocalStore()
    store.write_bytes(str(tmp_path / "a" / "x.bin"), b"x")
    src = tmp_path / "src.bin"
    src.write_bytes(b"y")
    store.upload_file(src, str(tmp_path / "b" / "y.bin"))
    moved = tmp_path / "z.bin"
    moved.write_bytes(b"z")
    moved.chmod(0o600)  # what transformers 5's safetensors writer leaves
    store.move_file(moved, str(tmp_path / "c" / "z.bin"))
    want = 0o666 & ~store_mod._UMASK
    for path in (tmp_path / "a" / "x.bin", tmp_path / "b" / "y.bin", tmp_path / "c" / "z.bin"):
        assert stat.S_IMODE(path.stat().st_mode) == want, oct(path.stat().st_mode)

    import tempfile

    tree = Path(tempfile.mkdtemp(dir=tmp_path))  # 0o700
    (tree / "sub").mkdir(mode=0o700)
    (tree / "sub" / "f").write_bytes(b"f")
    (tree / "sub" / "f").chmod(0o600)
    (tree / "run.sh").write_bytes(b"#!/bin/sh\n")
    (tree / "run.sh").chmod(0o700)
    store_mod.ordinary_modes(tree)
    assert stat.S_IMODE(tree.stat().st_mode) == 0o777 & ~store_mod._UMASK
    assert stat.S_IMODE((tree / "sub").stat().st_mode) == 0o777 & ~store_mod._UMASK
    assert stat.S_IMODE((tree / "sub" / "f").stat().st_mode) == want
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o777 & ~store_mod._UMASK
