"""One end of the weight channel, for tests/model/test_weight_channel.py (each end its own process).

    python tests/support/channel_peer.py send RUN_DIR OUT_JSON [--die-after N] [--receivers R]
    python tests/support/channel_peer.py receive RUN_DIR OUT_JSON [--die-after N]

The sender offers version 1: a fixed set of tensors of several dtypes and sizes (some larger
than a bucket), each also written to a safetensors file through the same writer a checkpoint
uses, and reports whether every receiver got everything. The receiver saves what it received
and the sha256s the sender reported. `--die-after N` ends the process abruptly after N tensors
(a peer killed mid-transfer). Timeouts are 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components.core.store import LocalStore  # noqa: E402
from components.model.channel import ChannelError, Receiver, Sender, Settings  # noqa: E402
from components.model.weights import Entry, FileWriter, ordered  # noqa: E402

TIMEOUT_S = 5.0


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(700, 512, generator=g).to(torch.bfloat16),  # 0.7 MB
        "big.weight": torch.randn(600, 1024, generator=g),  # 2.4 MB: over a bucket
        "norm.weight": torch.randn(512, generator=g),
        "ids": torch.arange(1000, dtype=torch.int64),
        "half": torch.randn(3, 5, generator=g).to(torch.float16),
    }


def send(run: Path, out: Path, die_after: int | None, receivers: int) -> None:
    ts = tensors()
    entries = ordered(Entry(k, v.dtype, tuple(v.shape)) for k, v in ts.items())
    sender = Sender(
        Settings(LocalStore(), str(run), receivers=receivers, bucket_mb=1, timeout_s=TIMEOUT_S)
    )
    t0 = time.monotonic()
    met = sender.begin(1, entries, [("weights.safetensors", len(entries))])
    for k, e in enumerate(entries):  # broadcast first, as train does, then write the file
        if die_after is not None and k == die_after:
            os._exit(3)
        sender.put(e.name, ts[e.name])
    with open(out.with_suffix(".safetensors"), "wb") as f:
        writer = FileWriter(f, entries)
        for e in entries:
            writer.put(e.name, ts[e.name])
        info = writer.close()
    delivered = sender.end()
    out.write_text(
        json.dumps(
            {
                "met": met,
                "delivered": delivered,
                "seconds": time.monotonic() - t0,
                "sha256": info.sha256,
            }
        )
    )
    sender.close()


class Collect:
    def __init__(self, die_after: int | None) -> None:
        self.got: dict[str, torch.Tensor] = {}
        self.die_after = die_after

    def start(self, names: list[str]) -> None:
        self.names = names

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if self.die_after is not None and len(self.got) == self.die_after:
            os._exit(3)
        self.got[name] = tensor.clone()


def receive(run: Path, out: Path, die_after: int | None) -> None:
    receiver = Receiver(
        Settings(LocalStore(), str(run), receivers=1, bucket_mb=1, timeout_s=TIMEOUT_S), rank=1
    )
    t0 = time.monotonic()
    while not receiver.offered(1):
        if time.monotonic() - t0 > 60:
            raise SystemExit("never offered")
        time.sleep(0.01)
    sink = Collect(die_after)
    t0 = time.monotonic()
    try:
        received = receiver.receive(1, sink)
        result = {"digests": received.digests(), "names": sink.names}
        save_file(sink.got, str(out.with_suffix(".safetensors")))
    except ChannelError as e:
        result = {"error": str(e)}
    result["seconds"] = time.monotonic() - t0
    out.write_text(json.dumps(result))
    receiver.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["send", "receive"])
    p.add_argument("run", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--die-after", type=int)
    p.add_argument("--receivers", type=int, default=1)
    a = p.parse_args()
    if a.role == "send":
        send(a.run, a.out, a.die_after, a.receivers)
    else:
        receive(a.run, a.out, a.die_after)
    os._exit(0)  # a process group's static destructors may abort the interpreter's exit
