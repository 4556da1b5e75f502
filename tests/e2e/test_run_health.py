"""A run with no learning signal, end to end through `rlvr run` on KFP's local runner: train
warns as the symptom appears, gives the verdict, and the run stops under health.stop_after
with its checkpoints, evaluations and report intact; a rerun finds it done; turning the rule
off lets it go on. (The verdicts' thresholds: tests/train/test_health.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import write_config

NO_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
)


def rlvr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )


def committed(run: Path, kind: str) -> list[int]:
    return sorted(int(p.parent.name) for p in (run / kind).glob("*/_SUCCESS"))


@pytest.mark.slow
def test_a_run_without_signal_stops_cleanly_and_says_why(tmp_path: Path, tiny_assets) -> None:
    plugin = tmp_path / "no_reward.py"
    plugin.write_text(NO_REWARD)
    config = write_config(
        tmp_path,
        tiny_assets,
        run={"iterations": 5},
        verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
        evaluate={"every": 1, "bootstrap_resamples": 20},
        health={"stop_after": 2},
    )
    run = tmp_path / "runs" / "t"

    first = rlvr("run", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout + first.stderr
    # warned as it appeared (train's log line, streamed), then stopped after 2 such iterations
    assert "health: iteration 0: no signal in 100% of groups (all wrong)" in out
    assert "the run stopped after iteration 1" in out
    record = json.loads((run / "status" / "stopped.json").read_text())
    assert record["after_iteration"] == 1 and record["verdict"] == "no_signal"
    assert committed(run, "checkpoints") == [0, 1, 2]  # iteration 1's update is kept
    assert committed(run, "evals") == [0, 1, 2]  # and evaluated
    assert not (run / "iterations" / "00002" / "rollouts" / "_SUCCESS").exists()
    report = (run / "report" / "report.md").read_text()
    assert "## Run health" in report and "**The run stopped after iteration 1**" in report
    assert "no signal since iteration 0 (none from the start)" in report
    assert 'id="run-health"' in (run / "report" / "index.html").read_text()
    manifest = json.loads((run / "checkpoints" / "00002" / "_SUCCESS").read_text())
    assert manifest["stats"]["health"]["stop"] and manifest["stats"]["health/stop"] == 1.0

    again = rlvr("run", str(config), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done, the run stopped after iteration 1" in again.stdout + again.stderr
    assert committed(run, "checkpoints") == [0, 1, 2]

    listed = rlvr("runs", "--store", str(tmp_path / "runs"), cwd=tmp_path)
    assert "no signal since iteration 0" in listed.stdout and "stopped after 1" in listed.stdout

    on = rlvr("run", str(config), "--set", "health.stop_after=0", cwd=tmp_path)
    assert on.returncode == 0, on.stderr[-3000:]
    assert committed(run, "checkpoints") == [0, 1, 2, 3, 4, 5]
    assert not (run / "status" / "stopped.json").exists()
