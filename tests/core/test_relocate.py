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
