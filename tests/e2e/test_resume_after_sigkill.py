"""The demo through `rlvr run`, its train worker killed with SIGKILL between two full train
states, then `rlvr run` again: the run resumes by replaying the updates since the newest state
and ends with the very checkpoint and train state an uninterrupted run writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "arithmetic" / "config.yaml"
SHARD = "state-00000-of-00001.safetensors"


def command(store: Path, run_id: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        str(DEMO),
        "--run-id",
        run_id,
        "--iterations",
        "4",
        "--set",
        f"run.store={store}",
        "--set",
        "train.state_every=2",
        "--set",
        "data.eval=[]",  # no evaluation: the test is about train's state
    ]


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 600.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, f"rlvr run ended before {path} was committed"
        assert time.monotonic() - t0 < timeout_s, f"{path} never came"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_train_worker_killed_between_states_resumes_to_the_same_bytes(tmp_path):
    store = tmp_path / "runs"
    ref = subprocess.run(command(store, "ref"), capture_output=True, text=True, cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]

    # The same run, its train worker killed once checkpoint 3 is committed: state 2 is the
    # newest full state, iteration 3's update is still to come.
    lost = store / "lost"
    proc = subprocess.Popen(
        command(store, "lost"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(lost / "checkpoints/00003/_SUCCESS", proc)
        stats = json.loads((lost / "checkpoints/00003/_SUCCESS").read_text())["stats"]
        os.kill(stats["timeline"]["pid"], signal.SIGKILL)  # the train worker
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "task train failed" in err, err[-3000:]
    assert not (lost / "checkpoints/00004/_SUCCESS").exists()
    assert (lost / "train_state/00002/_SUCCESS").exists()
    assert not (lost / "train_state/00004").exists()

    again = subprocess.run(command(store, "lost"), capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((lost / "checkpoints/00004/_SUCCESS").read_text())
    assert manifest["stats"]["train/replayed"] == 1.0  # update 2, from state 2
    assert manifest["stats"]["train/replay_mismatches"] == 0.0  # checked against checkpoint 3
    for name in ("model.safetensors", "config.json"):
        a = (store / "ref/checkpoints/00004" / name).read_bytes()
        assert a == (lost / "checkpoints/00004" / name).read_bytes(), name
    a = (store / "ref/train_state/00004" / SHARD).read_bytes()
    assert a == (lost / "train_state/00004" / SHARD).read_bytes()
    # retention kept what it promises: the base, the newest two checkpoints, the newest state
    live = sorted(p.parent.name for p in (lost / "checkpoints").glob("*/model.safetensors"))
    assert live == ["00000", "00003", "00004"]
    assert sorted(p.parent.name for p in (lost / "train_state").glob(f"*/{SHARD}")) == ["00004"]
