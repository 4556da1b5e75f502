"""Golden compiled pipelines (pipelines/golden/) for review diffs: a change to the pipeline code or
the cluster example shows up as a diff of these files in review.

Regenerate after an intended change:  RLVR_UPDATE_GOLDEN=1 python -m pytest tests/pipelines/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.core.config import load_config
from pipelines.builders import build
from pipelines.cluster import compile_to

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "pipelines" / "golden"
CASES = {
    "train.yaml": dict(pipeline="train"),
    "eval.yaml": dict(pipeline="eval"),
    "stage-verify.yaml": dict(pipeline="stage", stage="verify", iteration=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_pipeline_matches_golden(name, tmp_path):
    cfg = load_config(ROOT / "examples" / "cluster" / "gsm8k.yaml")
    out = tmp_path / name
    compile_to(build(cfg, **CASES[name]), out)
    golden = GOLDEN / name
    if os.environ.get("RLVR_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out.read_text())
    assert golden.is_file(), f"{golden} is missing; run RLVR_UPDATE_GOLDEN=1 pytest {__file__}"
    assert out.read_text() == golden.read_text(), (
        f"the compiled {name} differs from {golden}; if the change is intended, regenerate with "
        f"RLVR_UPDATE_GOLDEN=1 python -m pytest tests/pipelines/test_golden.py and review the diff"
    )
