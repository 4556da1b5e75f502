"""The floor plan (pyproject.toml, [tool.importlinter]; docs/design.md, "Layers"): import-linter
checks the layers and that no module is in an import cycle with its siblings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_import_keeps_the_layers_and_no_cycle():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout


def test_a_new_cycle_or_an_upward_import_breaks_the_build(tmp_path: Path):
    """The same contracts on a copy of the tree with one upward import (core -> generate), one
    import between siblings (generate -> train), torch in core, one cycle (verify.format <->
    verify.executor) and a planner that builds a stage: all five are reported."""
    for pkg in ("components", "pipelines", "examples"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "components/core/layout.py", "a") as f:
        f.write("\nfrom components.generate import rollouts  # noqa\n")
    with open(tmp_path / "components/generate/tools.py", "a") as f:
        f.write("\nfrom components.train import batching  # noqa\n")
    with open(tmp_path / "components/core/timing.py", "a") as f:
        f.write("\nimport torch  # noqa\n")
    with open(tmp_path / "components/verify/format.py", "a") as f:
        f.write("\nfrom components.verify import executor  # noqa\n")
    with open(tmp_path / "components/verify/executor.py", "a") as f:
        f.write("\nfrom components.verify import format  # noqa\n")
    with open(tmp_path / "pipelines/plan.py", "a") as f:
        f.write("\nfrom components.train.stage import TrainStage  # noqa\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0
    assert "pipelines.plan -> components.train.stage" in out.stdout
    assert "components.core.layout -> components.generate.rollouts" in out.stdout
    assert "components.generate.tools -> components.train.batching" in out.stdout
    assert "components.core.timing -> torch" in out.stdout
    assert "No cycles are allowed in components.verify" in out.stdout
