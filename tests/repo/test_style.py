"""The code is ruff-clean: lint and format (pyproject.toml [tool.ruff]), with no formatter escape
comments (the formatter's settings are the project's style; a line it would break is written its way)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ["components", "pipelines", "tests", "benchmarks", "examples"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([exe, *args, *TREES], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    out = _ruff("check", "--no-cache")
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_format_leaves_every_file_as_it_is():
    out = _ruff("format", "--check", "--no-cache")
    assert out.returncode == 0, out.stdout[-4000:] + "\nrun `ruff format` on these files"


def test_no_formatter_escapes():
    marked = [
        f"{p.relative_to(ROOT)}:{i}"
        for tree in TREES
        for p in sorted((ROOT / tree).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: " + "skip" in line or "fmt: " + "off" in line
    ]
    assert not marked, f"formatter escapes: {marked[:10]}"
