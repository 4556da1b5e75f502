"""The weight channel (components/model/channel.py) between two real processes over gloo on
loopback: what arrives is bit for bit what was sent, and a peer killed mid-transfer costs the
other end at most its timeout (5 s here), never a hang."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.model.channel import buckets
from components.model.weights import Entry

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tests" / "support" / "channel_peer.py"


def start(role: str, run: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(PEER), role, str(run), str(out), *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen, timeout: float = 60) -> int:
    _, err = p.communicate(timeout=timeout)
    assert p.returncode in (0, 3), err[-2000:]
    return p.returncode


def test_buckets_keep_order_and_size():
    es = [Entry(f"t{k}", torch.float32, (n,)) for k, n in enumerate([10, 10, 300, 10, 10])]
    assert buckets(es, 100) == [[0, 1], [2], [3, 4]]  # 40 + 40; 1200 alone; 40 + 40
    assert buckets(es, 10**6) == [[0, 1, 2, 3, 4]]


def test_two_processes_end_with_identical_weights(tmp_path):
    run = tmp_path / "run"
    sender = start("send", run, tmp_path / "sent.json")
    receiver = start("receive", run, tmp_path / "got.json")
    finish(sender), finish(receiver)
    sent = json.loads((tmp_path / "sent.json").read_text())
    got = json.loads((tmp_path / "got.json").read_text())
    assert sent["met"] and sent["delivered"], sent
    a = load_file(str(tmp_path / "sent.safetensors"))
    b = load_file(str(tmp_path / "got.safetensors"))
    assert a.keys() == b.keys() == set(got["names"])
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    import hashlib

    # the receiver hashed what it got as the sender's file lays it out: the same sha256
    digest = hashlib.sha256((tmp_path / "sent.safetensors").read_bytes()).hexdigest()
    assert sent["sha256"] == digest
    assert got["digests"] == {"weights.safetensors": digest}
    assert not (run / "status/channel/train.json").exists()  # withdrawn when the sender closed


@pytest.mark.parametrize("who", ["receiver", "sender"])
def test_a_peer_killed_mid_transfer_fails_the_other_within_its_timeout(tmp_path, who):
    """Killed after a bucket or two, with one still to go: the survivor reports the failure
    (the sender goes on without the channel; the receiver raises ChannelError, and its worker
    then loads the checkpoint from the store) within 5 s plus slack."""
    run = tmp_path / "run"
    die = ["--die-after", "1"]  # buckets: [ids] [big] [norm, embed, half]
    sender = start("send", run, tmp_path / "sent.json", *(die if who == "sender" else []))
    receiver = start("receive", run, tmp_path / "got.json", *(die if who == "receiver" else []))
    codes = finish(sender), finish(receiver)
    assert codes == ((3, 0) if who == "sender" else (0, 3))
    if who == "receiver":
        sent = json.loads((tmp_path / "sent.json").read_text())
        assert sent["met"] and not sent["delivered"]
        assert sent["seconds"] < 5 + 10
    else:
        got = json.loads((tmp_path / "got.json").read_text())
        assert "not received" in got["error"]
        assert got["seconds"] < 5 + 10


def test_a_receiver_that_never_comes_costs_the_sender_its_timeout(tmp_path):
    run = tmp_path / "run"
    sender = start("send", run, tmp_path / "sent.json", "--receivers", "1")
    finish(sender)
    sent = json.loads((tmp_path / "sent.json").read_text())
    assert not sent["met"] and not sent["delivered"]
    assert 4 <= sent["seconds"] < 5 + 10


@pytest.mark.slow
def test_a_run_over_the_channel_trains_and_samples_as_over_the_store(workspace):
    """`rlvr run` with train.handoff.channel: broadcast: generate takes policies 1.. from train
    over gloo (its manifests say so), checks each against the checkpoint train commits, and the
    run's rollouts and checkpoints are bit for bit the store path's."""
    base = [sys.executable, "-m", "pipelines.cli", "run", str(workspace), "--iterations", "3"]
    runs = workspace.parent / "runs"
    for run_id, extra in (
        ("store", []),
        ("channel", ["--set", "train.handoff.channel=broadcast", "--set", "train.handoff.port=0"]),
    ):
        cmd = [*base, "--run-id", run_id, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workspace.parent)
        assert proc.returncode == 0, proc.stderr[-3000:]
    loads = [
        json.loads((runs / f"channel/iterations/{i:05d}/rollouts/_SUCCESS").read_text())["stats"][
            "policy_load"
        ]
        for i in range(3)
    ]
    assert loads == ["load", "broadcast", "broadcast"]
    for rel in (
        "checkpoints/00003/model.safetensors",
        "train_state/00003/state-00000-of-00001.safetensors",
    ):
        assert (runs / "store" / rel).read_bytes() == (runs / "channel" / rel).read_bytes(), rel
    for i in range(3):
        a = load_rows(runs / f"store/iterations/{i:05d}/rollouts")
        b = load_rows(runs / f"channel/iterations/{i:05d}/rollouts")
        assert a == b, i
    train_log = (runs / "channel/logs/segment-00000/train.log").read_text()
    assert "not delivered" not in train_log


def load_rows(d: Path) -> list:
    import pyarrow.parquet as pq

    rows = []
    for part in sorted(d.glob("*.parquet")):
        t = pq.read_table(part)
        rows += list(
            zip(
                t.column("prompt_id").to_pylist(),
                t.column("response_token_ids").to_pylist(),
                strict=True,
            )
        )
    return sorted(rows)


def test_a_receiver_never_joins_a_foreign_or_withdrawn_sender(tmp_path):
    """An address whose nonce is not its TCPStore's (another run's sender, a restarted one on
    the same port) is not joined, nor tried twice; a withdrawn address offers nothing."""
    from components.core.layout import RunLayout
    from components.core.store import LocalStore
    from components.model.channel import Receiver, Sender, Settings

    store = LocalStore()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    at_a, at_b = Path(RunLayout(a).channel_address), Path(RunLayout(b).channel_address)
    sender = Sender(Settings(store, a, receivers=1, timeout_s=2))
    address = json.loads(at_a.read_text())
    at_b.parent.mkdir(parents=True)
    at_b.write_text(json.dumps({**address, "root": b, "nonce": "other"}))
    receiver = Receiver(Settings(store, b, receivers=1, timeout_s=2), rank=1)
    assert not receiver.offered(1) and receiver.unreachable is not None
    assert not receiver.offered(1)  # not retried until the address changes
    mine = Receiver(Settings(store, a, receivers=1, timeout_s=2), rank=1)
    assert not mine.offered(1)  # reachable, nothing offered yet
    assert mine.tcp is not None
    sender.close()
    assert not at_a.exists()


def test_a_sender_that_keeps_failing_stops_offering():
    """With nobody to receive, each version costs the timeout, three in a row at most; the
    fourth is not offered at all (the store path alone, at no cost)."""
    import time

    from components.core.store import LocalStore
    from components.model.channel import MAX_FAILURES, Sender, Settings

    run = tempfile.mkdtemp()
    sender = Sender(Settings(LocalStore(), run, receivers=1, timeout_s=1))
    entries = [Entry("w", torch.float32, (4,))]
    for v in range(1, MAX_FAILURES + 1):
        assert not sender.begin(v, entries, [("model.safetensors", 1)])
    t0 = time.monotonic()
    assert not sender.begin(MAX_FAILURES + 1, entries, [("model.safetensors", 1)])
    assert time.monotonic() - t0 < 0.5
    assert not sender.tcp.check([f"v{MAX_FAILURES + 1}/meta"])
    sender.close()
