"""A direct weight channel: train's rank 0 broadcasts each new policy to the generate workers
(`train.handoff.channel: broadcast`), gloo on CPU and NCCL on GPU, bucket by bucket.

The store path stays the record: train still commits every checkpoint to the store, and
generate commits its rollouts only once the checkpoint it sampled with is committed there and
its files' sha256s equal those of the weights it received. The channel only lets generate start
sampling without waiting for that commit (an S3 upload of a 7B policy's 14 GB takes longer than
a broadcast over InfiniBand by an order of magnitude; docs/design.md, "The policy handoff").

Meeting through the store. Train's rank 0 runs a TCPStore (the rendezvous torch.distributed
uses) on `train.handoff.port` and publishes its address in the run: `<run>/status/channel/
train.json` (on a cluster the pod's IP, `POD_IP` from the downward API). Nothing else is
shared: a worker that cannot reach it, or finds no address, uses the store path.

Per version v (checkpoint v), the sender writes `v<v>/meta` into the TCPStore: the tensors in
order (names, dtypes, shapes), their buckets, and the group's epoch. Every receiver of the epoch
then joins a process group of its own (rank 0 the sender, ranks 1.. the receivers; independent of
the train ranks' DeepSpeed group: a `ProcessGroupGloo`/`ProcessGroupNCCL` on a prefix of the
TCPStore), and each bucket is broadcast from rank 0 into a buffer of `bucket_mb` on every
receiver, which copies its tensors out and starts sampling. Only then does the sender write the
checkpoint's files; `v<v>/done` carries their sha256s, which a receiver needs only when it
commits.

Every wait has `timeout_s`. A receiver missing or killed makes the sender's group or broadcast
fail within it: the sender drops the channel for that version (its store write goes on) and
forms a new group, epoch + 1, for the next. A sender gone makes the receivers' waits fail: they
load the checkpoint from the store. Nothing hangs.

Receivers must all wait for the same version at the same time, which on-policy runs do; `rlvr
check` refuses the broadcast channel with `train.max_staleness > 0`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from components.core.errors import UserError
from components.core.store import Store, StoreError, join
from components.core.weights import DTYPE_CODES, Entry, raw_bytes

log = logging.getLogger("rlvr.channel")

ADDRESS = "status/channel/train.json"
"""Where the sender publishes its address, relative to the run."""

#: The dtypes a handoff holds, by the name `meta` gives them.
DTYPES = {str(d).removeprefix("torch."): d for d in DTYPE_CODES}


class ChannelError(UserError):
    """The channel failed for this version (a peer gone, a timeout): use the store path."""


def ranks_per_worker(backend: str, tensor_parallel_size: int) -> int:
    """The channel ranks one generate worker takes: one per vLLM tensor-parallel worker
    process (each loads its own shard of what it receives), else one."""
    return tensor_parallel_size if backend == "vllm" else 1


def buckets(entries: list[Entry], bucket_bytes: int) -> list[list[int]]:
    """Consecutive runs of entry indices of at most `bucket_bytes` (a larger tensor alone)."""
    out: list[list[int]] = [[]]
    size = 0
    for k, e in enumerate(entries):
        if out[-1] and size + e.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(k)
        size += e.nbytes
    return [b for b in out if b]


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _group(store, epoch: int, rank: int, size: int, device: str, timeout_s: float):
    """A process group of its own for one epoch of the channel (rank 0 the sender)."""
    prefix = torch.distributed.PrefixStore(f"e{epoch}", store)
    if device.startswith("cuda"):
        options = torch.distributed.ProcessGroupNCCL.Options()
        options._timeout = _timeout(timeout_s)
        return torch.distributed.ProcessGroupNCCL(prefix, rank, size, options)
    return torch.distributed.ProcessGroupGloo(prefix, rank, size, _timeout(timeout_s))


def _broadcast(group, tensor: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def _drop(group) -> None:
    """Let a group go without waiting on a peer that may be gone."""
    abort = getattr(group, "abort", None)
    if callable(abort):
        try:
            abort()
        except Exception:  # noqa: BLE001 - it is being dropped either way
            pass


def advertised_host() -> str:
    """The address receivers reach this process at: the pod's IP on a cluster (POD_IP, from
    the downward API), else this host's name resolved, else loopback."""
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass
class Settings:
    """`train.handoff` as the channel needs it, and the run it serves."""

    store: Store
    root: str
    receivers: int
    port: int = 0
    bucket_mb: int = 256
    timeout_s: float = 60.0
    device: str = "cpu"


class Sender:
    """Train's rank 0: the TCPStore, the address in the run, one group per epoch. Per version:
    `begin` (the plan), `put` every tensor in the plan's order (a bucket goes out as soon as it
    is full), `end` (the files' sha256s). A failure at any point drops the channel for that
    version only: `put` goes on accepting tensors (the caller writes them to the store too)."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.tcp = torch.distributed.TCPStore(
            "0.0.0.0",
            s.port,
            is_master=True,
            wait_for_workers=False,
            timeout=_timeout(s.timeout_s),
        )
        self.epoch = 0
        self.group = None
        self.live = False
        self._version = -1
        self._plan: list[list[int]] = []
        self._entries: list[Entry] = []
        self._bucket = 0
        self._chunk: list[torch.Tensor] = []
        address = {
            "host": advertised_host(),
            "port": self.tcp.port,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "at": time.time(),
        }
        s.store.write_text(join(s.root, ADDRESS), json.dumps(address))

    def begin(self, version: int, entries: list[Entry]) -> bool:
        """Offer `version` (its tensors in this order) and meet the receivers; False when they
        are not all there within the timeout (the version then goes by the store alone)."""
        self._version, self._entries = version, list(entries)
        self._plan = buckets(self._entries, self.s.bucket_mb << 20)
        self._bucket, self._chunk = 0, []
        meta = {
            "version": version,
            "epoch": self.epoch,
            "size": self.s.receivers + 1,
            "entries": [
                [e.name, str(e.dtype).removeprefix("torch."), list(e.shape)] for e in entries
            ],
            "buckets": self._plan,
        }
        self.tcp.set(f"v{version}/meta", json.dumps(meta))
        self.live = True
        if self.group is None:
            try:
                self.group = _group(
                    self.tcp, self.epoch, 0, meta["size"], self.s.device, self.s.timeout_s
                )
            except Exception as e:  # noqa: BLE001 - a receiver missing: the store carries it
                self._broken(e)
        return self.live

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """The next tensor of the plan; its bucket is broadcast once complete."""
        if not self.live:
            return
        bucket = self._plan[self._bucket]
        expected = self._entries[bucket[len(self._chunk)]]
        if name != expected.name:
            raise ValueError(f"weight channel: expected {expected.name!r} next, got {name!r}")
        self._chunk.append(tensor)
        if len(self._chunk) == len(bucket):
            self._send(bucket, self._chunk)
            self._bucket += 1
            self._chunk = []

    def _send(self, bucket: list[int], chunk: list[torch.Tensor]) -> None:
        try:
            size = sum(self._entries[k].nbytes for k in bucket)
            buf = torch.empty(size, dtype=torch.uint8, device=self.s.device)
            at = 0
            for t, k in zip(chunk, bucket, strict=True):
                n = self._entries[k].nbytes
                buf[at : at + n].copy_(_as_bytes(t, self.s.device))
                at += n
            _broadcast(self.group, buf)
        except Exception as e:  # noqa: BLE001 - a receiver gone mid-transfer
            self._broken(e)

    def end(self, digests: dict[str, str]) -> bool:
        """The files' sha256s, for the receivers to check against the store's commit; True
        when every receiver got every bucket."""
        delivered = self.live and self._bucket == len(self._plan)
        if self.live:
            self.tcp.set(f"v{self._version}/done", json.dumps(digests))
        self.live = False
        return delivered

    def _broken(self, error: BaseException) -> None:
        log.warning(
            "weight channel: version %d not delivered (%s); generate loads it from the store",
            self._version,
            str(error).splitlines()[0][:200] if str(error) else type(error).__name__,
        )
        if self.group is not None:
            _drop(self.group)
        self.group = None
        self.live = False
        self.epoch += 1

    def close(self) -> None:
        if self.group is not None:
            _drop(self.group)
            self.group = None


def _as_bytes(t: torch.Tensor, device: str) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor on `device`."""
    if device == "cpu":
        return (
            torch.frombuffer(raw_bytes(t), dtype=torch.uint8)
            if t.numel()
            else torch.empty(0, dtype=torch.uint8)
        )
    return t.detach().to(device).contiguous().reshape(-1).view(torch.uint8)


class Sink(Protocol):
    """Where received tensors go (a loaded model's parameters)."""

    def start(self, names: list[str]) -> None: ...

    def put(self, name: str, tensor: torch.Tensor) -> None: ...


class Receiver:
    """A generate worker's end: rank `rank` (1..) of the channel's groups."""

    def __init__(self, s: Settings, rank: int) -> None:
        self.s, self.rank = s, rank
        self.last_bytes = 0
        self.tcp = None
        self.address: dict[str, Any] | None = None
        self.group = None
        self.epoch: int | None = None

    def _store(self):
        """The sender's TCPStore, connected once (None: no sender has published an address)."""
        try:
            address = json.loads(self.s.store.read_text(join(self.s.root, ADDRESS)))
        except (StoreError, ValueError):
            return None
        if self.tcp is not None and address == self.address:
            return self.tcp
        self._reset()
        try:
            self.tcp = torch.distributed.TCPStore(
                address["host"],
                int(address["port"]),
                is_master=False,
                timeout=_timeout(self.s.timeout_s),
            )
            self.address = address
        except Exception as e:  # noqa: BLE001 - an old address, a sender gone
            log.info(
                "weight channel: %s:%s unreachable (%s)",
                address.get("host"),
                address.get("port"),
                e,
            )
            self.tcp = None
        return self.tcp

    def offered(self, version: int) -> bool:
        """Whether the sender has begun sending `version` (cheap: one key check)."""
        tcp = self._store()
        if tcp is None:
            return False
        try:
            return bool(tcp.check([f"v{version}/meta"]))
        except Exception:  # noqa: BLE001 - the sender went away: the store path
            self._reset()
            return False

    def receive(self, version: int, sink: Sink) -> None:
        """Receive `version`: `sink.start` gets every tensor's name first, then `sink.put` each
        tensor (a view into the bucket, valid for the call). ChannelError when any part fails
        or takes longer than `timeout_s`."""
        tcp = self._store()
        if tcp is None:
            raise ChannelError("no sender")
        try:
            meta = json.loads(tcp.get(f"v{version}/meta"))
            if self.group is None or self.epoch != meta["epoch"]:
                if self.group is not None:
                    _drop(self.group)
                self.group = None
                self.group = _group(
                    tcp, meta["epoch"], self.rank, meta["size"], self.s.device, self.s.timeout_s
                )
                self.epoch = meta["epoch"]
            entries = [Entry(n, DTYPES[d], tuple(s)) for n, d, s in meta["entries"]]
            sink.start([e.name for e in entries])
            self.last_bytes = sum(e.nbytes for e in entries)
            for bucket in meta["buckets"]:
                size = sum(entries[k].nbytes for k in bucket)
                buf = torch.empty(size, dtype=torch.uint8, device=self.s.device)
                _broadcast(self.group, buf)
                at = 0
                for k in bucket:
                    e = entries[k]
                    view = buf[at : at + e.nbytes].view(e.dtype).reshape(e.shape)
                    sink.put(e.name, view)
                    at += e.nbytes
        except ChannelError:
            raise
        except Exception as e:  # noqa: BLE001 - a peer gone, a timeout: the store path
            if self.group is not None:
                _drop(self.group)
            self.group = None
            raise ChannelError(
                f"weight channel: version {version} not received ({str(e).splitlines()[0][:200]})"
            ) from None

    def digests(self, version: int) -> dict[str, str]:
        """The sha256s of version `version`'s files, once the sender has written them (it
        broadcasts first and writes the checkpoint while the receivers already sample)."""
        tcp = self._store()
        if tcp is None:
            raise ChannelError("weight channel: the sender is gone")
        try:
            return json.loads(tcp.get(f"v{version}/done"))
        except Exception as e:  # noqa: BLE001 - the sender gone before it wrote them
            raise ChannelError(
                f"weight channel: the sha256s of version {version} never came ({e})"
            ) from None

    def _reset(self) -> None:
        if self.group is not None:
            _drop(self.group)
        self.group = self.tcp = self.address = self.epoch = None

    def close(self) -> None:
        self._reset()
