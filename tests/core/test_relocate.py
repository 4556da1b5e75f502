"""Runs that can move: lineage keys inputs by run-relative path and content,
so a run copied to another store resumes with nothing recomputed, and a stale output says which
input changed."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from components.core.commit import stale_inputs
from pipelines.cli import main

STAGES = [("init", []), ("generate", []), ("verify", []), ("train", []), ("evaluate", [])]


def _manifests(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("_SUCCESS"))}


def _stages(config: Path, *extra: str) -> None:
    for name, args in STAGES:
        res = CliRunner().invoke(main, ["stage", name, str(config), *args, *extra])
        assert res.exit_code == 0, (name, res.output)


class _Lines(logging.Handler):
    """Records rlvr.commit's messages (the stage CLI reconfigures the root logger, which
    pytest's caplog lives on, so a handler on the logger itself)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def commit_log():
    logger, handler = logging.getLogger("rlvr.commit"), _Lines()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


@pytest.mark.slow
def test_a_moved_run_resumes_without_recomputing(workspace: Path, commit_log) -> None:
    _stages(workspace)
    first = workspace.parent / "runs"
    moved = workspace.parent / "elsewhere" / "store"
    shutil.copytree(first, moved)
    shutil.rmtree(first)  # nothing may be read from the old place
    before = _manifests(moved / "t")
    _stages(workspace, "--set", f"run.store={moved}")
    assert _manifests(moved / "t") == before  # every output found up to date
    assert "recomputing" not in commit_log.text

    # a changed input: regenerate iteration 0 differently; verify says why it recomputes
    res = CliRunner().invoke(
        main,
        [
            "stage",
            "generate",
            str(workspace),
            "--force",
            "--set",
            f"run.store={moved}",
            "--set",
            "generate.temperature=0.7",
        ],
    )
    assert res.exit_code == 0, res.output
    commit_log.lines.clear()
    res = CliRunner().invoke(
        main, ["stage", "verify", str(workspace), "--set", f"run.store={moved}"]
    )
    assert res.exit_code == 0, res.output
    assert "recomputing, input iterations/00000/rollouts changed" in commit_log.text


def test_stale_inputs_names_what_changed() -> None:
    stored = {"iterations/00001/rollouts": "a", "config": "c"}
    assert stale_inputs(stored, {"iterations/00001/rollouts": "a", "config": "c"}) == []
    assert stale_inputs(stored, {"iterations/00001/rollouts": "b", "config": "c"}) == [
        "input iterations/00001/rollouts changed (a -> b)"
    ]
    assert stale_inputs(stored, {"iterations/00001/rollouts": "a", "config": "d"}) == [
        "the stage's config changed (c -> d)"
    ]
    assert stale_inputs(stored, {"config": "c", "checkpoints/00001": "x"}) == [
        "input checkpoints/00001 is new",
        "input iterations/00001/rollouts is gone",
    ]
    # a manifest of an older rlvr keyed inputs by absolute URI: matched by suffix
    old = {"/old/place/runs/t/iterations/00001/rollouts": "a", "config": "c"}
    assert stale_inputs(old, {"iterations/00001/rollouts": "a", "config": "c"}) == []


def test_evaluations_of_an_older_version_stay_current(cfg) -> None:
    # schema-version-2 rlvr digested the eval sets' source paths into the config; that digest
    # is accepted, so upgrading does not re-evaluate a finished run
    import hashlib
    import json as _json

    from components.core import lineages
    from components.core.layout import RunLayout, store_for

    store, layout = store_for(cfg), RunLayout.of(cfg)
    from components.model import run_setup

    run_setup.run(cfg)
    now = lineages.evaluate(cfg, layout, 0).lineage(store, layout.root)
    from components.core.config import unused_keys

    unused = unused_keys(cfg)  # keys of features newer than that version, unused by this run
    old_config = {
        "eval": [e.model_dump(mode="json") for e in cfg.data.eval],
        "evaluate": cfg.evaluate.model_dump(mode="json", exclude={"every"}),
        "generate": cfg.generate.model_dump(
            mode="json", exclude={"num_shards", "batch_size"} | unused["generate"]
        ),
        "verify": cfg.verify.model_dump(
            mode="json", exclude={"num_shards", "num_workers"} | unused["verify"]
        ),
    }
    old_digest = hashlib.sha256(_json.dumps(old_config).encode()).hexdigest()[:16]
    assert now.alternatives == {"config": old_digest} and now["config"] != old_digest
    stored = {f"{layout.root}/{k}": v for k, v in now.items() if k != "config"}
    stored["config"] = old_digest  # as an older rlvr wrote it: absolute keys, old digest
    assert stale_inputs(stored, now, now.alternatives) == []
    assert stale_inputs(stored, now) == [
        f"the stage's config changed ({old_digest} -> {now['config']})"
    ]
