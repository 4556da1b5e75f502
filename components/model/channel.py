"""A direct weight channel: train's rank 0 broadcasts each new policy to the generate workers
(`train.handoff.channel: broadcast`), gloo on CPU and NCCL on GPU, bucket by bucket.

The store path stays the record: train still commits every checkpoint to the store, and
generate commits its rollouts only once the checkpoint it sampled with is committed there and
that checkpoint's files hash to what it received. The channel only lets generate start sampling
without waiting for that commit (an S3 upload of a 7B policy's 14 GB takes longer than a
broadcast over InfiniBand by an order of magnitude; docs/design.md, "The policy handoff").

Meeting through the store. Train's rank 0 runs a TCPStore (the rendezvous torch.distributed
uses) on `train.handoff.port` and publishes its address in the run: `<run>/status/channel/
train.json` (on a cluster the pod's IP, `POD_IP` from the downward API), with a nonce the
TCPStore also holds, so a receiver never joins another run's or an earlier attempt's sender.
The sender removes the address when it closes. A worker that cannot reach it, or finds no
address, uses the store path.

Per version v (checkpoint v), the sender writes `v<v>/meta` into the TCPStore: the tensors in
order (names, dtypes, shapes), their buckets, the files they make up, and the group's epoch.
Every receiver of the epoch then joins a process group of its own (rank 0 the sender, ranks 1..
the receivers; independent of the train ranks' DeepSpeed group: a `ProcessGroupGloo` or
`ProcessGroupNCCL` on a prefix of the TCPStore), and each bucket is broadcast from rank 0 into a
buffer of `bucket_mb` on every receiver, which copies its tensors out and starts sampling. Each
receiver hashes what it received, file by file as the checkpoint's files are laid out
(components/model/weights.py), on a thread of its own while it samples; before it commits it
compares the sha256s with the checkpoint train committed. Only after the broadcast does the
sender write that checkpoint.

Every wait has `timeout_s`. A receiver missing or killed makes the sender's group or broadcast
fail within it (gloo directly; NCCL with blocking waits, `TORCH_NCCL_BLOCKING_WAIT`): the sender
drops the channel for that version (its store write goes on) and forms a new group, epoch + 1,
for the next; after MAX_FAILURES versions in a row it stops trying. A sender gone makes the
receivers' waits fail: they load the checkpoint from the store. Nothing hangs.

Receivers must all wait for the same version at the same time, which on-policy runs do; `rlvr
check` refuses the broadcast channel with `train.max_staleness > 0`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from components.core.errors import UserError
from components.core.layout import RunLayout
from components.core.store import Store, StoreError
from components.model.weights import DTYPE_CODES, Entry, FileWriter, HashSink, raw_bytes

log = logging.getLogger("rlvr.channel")

MAX_FAILURES = 3
"""Versions in a row the sender may fail to deliver before it stops offering any."""
CONNECT_S = 5.0
"""How long a receiver tries to reach a published address (an old one is not retried)."""

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
    """A process group of its own for one epoch of the channel (rank 0 the sender). NCCL's is
    made to raise on a timeout rather than hang (blocking waits) and connected at once (a
    first collective), so a peer missing shows here, within the timeout."""
    prefix = torch.distributed.PrefixStore(f"e{epoch}", store)
    if not device.startswith("cuda"):
        return torch.distributed.ProcessGroupGloo(prefix, rank, size, _timeout(timeout_s))
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # read as each group is made
    options = torch.distributed.ProcessGroupNCCL.Options()
    options._timeout = _timeout(timeout_s)
    group = torch.distributed.ProcessGroupNCCL(prefix, rank, size, options)
    _broadcast(group, torch.zeros(1, device=device))
    return group


def _broadcast(group, tensor: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()
    if tensor.is_cuda:  # the collective is done, not only queued
        torch.cuda.current_stream(tensor.device).synchronize()


def _drop(group) -> None:
    """Let a group go without waiting on a peer that may be gone."""
    abort = getattr(group, "abort", None)
    if callable(abort):
        with contextlib.suppress(Exception):
            abort()


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
    is full), `end`. A failure at any point drops the channel for that version only: `put` goes
    on accepting tensors."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.tcp = torch.distributed.TCPStore(
            "0.0.0.0",
            s.port,
            is_master=True,
            wait_for_workers=False,
            timeout=_timeout(s.timeout_s),
        )
        self.nonce = uuid.uuid4().hex
        self.tcp.set("nonce", self.nonce)
        self.epoch = 0
        self.group = None
        self.live = False
        self.failures = 0
        self._version = -1
        self._plan: list[list[int]] = []
        self._entries: list[Entry] = []
        self._bucket = 0
        self._chunk: list[torch.Tensor] = []
        address = {
            "host": advertised_host(),
            "port": self.tcp.port,
            "nonce": self.nonce,
            "root": s.root,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "at": time.time(),
        }
        s.store.write_text(RunLayout(s.root).channel_address, json.dumps(address))

    def begin(
        self,
        version: int,
        entries: list[Entry],
        files: list[tuple[str, int]],
        metadata: dict[str, str] | None = None,
    ) -> bool:
        """Offer `version`, its tensors in this order, laid out in `files` ((name, how many of
        the entries, in order), as the checkpoint writes them), and meet the receivers; False
        when they are not all there within the timeout (the version then goes by the store
        alone), or the channel has failed too often."""
        self._version, self._entries = version, list(entries)
        self._plan = buckets(self._entries, self.s.bucket_mb << 20)
        self._bucket, self._chunk = 0, []
        if self.failures >= MAX_FAILURES:
            return False
        meta = {
            "version": version,
            "epoch": self.epoch,
            "size": self.s.receivers + 1,
            "entries": [
                [e.name, str(e.dtype).removeprefix("torch."), list(e.shape)] for e in entries
            ],
            "buckets": self._plan,
            "files": [list(f) for f in files],
            "metadata": metadata or {},
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

    def end(self) -> bool:
        """True when every receiver got every bucket of the version."""
        delivered = self.live and self._bucket == len(self._plan)
        self.live = False
        if delivered:
            self.failures = 0
        return delivered

    def _broken(self, error: BaseException) -> None:
        self.failures += 1
        log.warning(
            "weight channel: version %d not delivered (%s); generate loads it from the store%s",
            self._version,
            str(error).splitlines()[0][:200] if str(error) else type(error).__name__,
            "; the channel stays off from now on" if self.failures >= MAX_FAILURES else "",
        )
        if self.group is not None:
            _drop(self.group)
        self.group = None
        self.live = False
        self.epoch += 1

    def close(self) -> None:
        """Drop the group and withdraw the address (if it is still this sender's)."""
        if self.group is not None:
            _drop(self.group)
            self.group = None
        uri = RunLayout(self.s.root).channel_address
        with contextlib.suppress(StoreError, ValueError):
            if json.loads(self.s.store.read_text(uri)).get("nonce") == self.nonce:
                self.s.store.delete(uri)


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


class Received:
    """The sha256s of what a receiver got, file by file as the checkpoint lays it out, computed
    on a thread of its own from CPU copies of the buckets while the receiver goes on (its
    sampling); `digests()` waits for them."""

    def __init__(self, meta: dict[str, Any], entries: list[Entry]) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._digests: dict[str, str] = {}
        self._error: BaseException | None = None
        files, at = [], 0
        for name, n in meta["files"]:
            files.append((name, entries[at : at + n]))
            at += n
        self._thread = threading.Thread(
            target=self._hash, args=(files, meta.get("metadata") or None), daemon=True
        )
        self._thread.start()

    def put(self, tensor: torch.Tensor) -> None:
        self._queue.put(tensor)

    def abort(self) -> None:
        """The transfer failed: the hashing thread ends."""
        self._queue.put(None)

    def _hash(self, files, metadata) -> None:
        try:
            for name, entries in files:
                w = FileWriter(HashSink(), entries, metadata)
                for e in entries:
                    tensor = self._queue.get()
                    if tensor is None:
                        raise ChannelError("the transfer failed")
                    w.put(e.name, tensor)
                self._digests[name] = w.close().sha256
        except BaseException as e:  # noqa: BLE001 - handed to digests()
            self._error = e

    def digests(self, timeout_s: float = 600.0) -> dict[str, str]:
        self._thread.join(timeout_s)
        if self._thread.is_alive() or self._error is not None:
            raise ChannelError(
                f"weight channel: the received weights could not be hashed ({self._error})"
            )
        return self._digests


class Receiver:
    """A generate worker's end: rank `rank` (1..) of the channel's groups."""

    def __init__(self, s: Settings, rank: int) -> None:
        self.s, self.rank = s, rank
        self.last_bytes = 0
        self.tcp = None
        self.address: dict[str, Any] | None = None
        self.unreachable: dict[str, Any] | None = None
        self.group = None
        self.epoch: int | None = None

    def _store(self):
        """The sender's TCPStore, connected once (None: no sender of this run has published an
        address, it cannot be reached, or it is not the sender that published it)."""
        try:
            address = json.loads(self.s.store.read_text(RunLayout(self.s.root).channel_address))
        except (StoreError, ValueError):
            return None
        if self.tcp is not None and address == self.address:
            return self.tcp
        if address == self.unreachable or address.get("root", self.s.root) != self.s.root:
            return None  # tried already; a new sender writes a new address
        self._reset()
        try:
            tcp = torch.distributed.TCPStore(
                address["host"],
                int(address["port"]),
                is_master=False,
                timeout=_timeout(min(self.s.timeout_s, CONNECT_S)),
            )
            if tcp.get("nonce").decode() != address.get("nonce"):
                raise ChannelError("another sender listens there")
            tcp.set_timeout(_timeout(self.s.timeout_s))
            self.tcp, self.address = tcp, address
        except Exception as e:  # noqa: BLE001 - an old address, a sender gone
            log.info(
                "weight channel: %s:%s unreachable (%s); the store path",
                address.get("host"),
                address.get("port"),
                str(e).splitlines()[0][:200] if str(e) else type(e).__name__,
            )
            self.unreachable = address
        return self.tcp

    def offered(self, version: int) -> bool:
        """Whether the sender has begun sending `version` (cheap: one key check)."""
        tcp = self._store()
        if tcp is None:
            return False
        try:
            return bool(tcp.check([f"v{version}/meta"]))
        except Exception:  # noqa: BLE001 - the sender went away: the store path
            self.unreachable = self.address
            self._reset()
            return False

    def receive(self, version: int, sink: Sink) -> Received:
        """Receive `version`: `sink.start` gets every tensor's name first, then `sink.put` each
        tensor (a view into the bucket, valid for the call). Returns the received bytes'
        sha256s to come. ChannelError when any part fails or takes longer than `timeout_s`."""
        tcp = self._store()
        if tcp is None:
            raise ChannelError("weight channel: no sender")
        received = None
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
            received = Received(meta, entries)
            self.last_bytes = sum(e.nbytes for e in entries)
            for bucket in meta["buckets"]:
                size = sum(entries[k].nbytes for k in bucket)
                buf = torch.empty(size, dtype=torch.uint8, device=self.s.device)
                _broadcast(self.group, buf)
                host = buf if buf.device.type == "cpu" else buf.cpu()  # a new buffer each bucket
                at = 0
                for k in bucket:
                    e = entries[k]
                    sink.put(e.name, buf[at : at + e.nbytes].view(e.dtype).reshape(e.shape))
                    received.put(host[at : at + e.nbytes].view(e.dtype).reshape(e.shape))
                    at += e.nbytes
            return received
        except ChannelError:
            raise
        except Exception as e:  # noqa: BLE001 - a peer gone, a timeout: the store path
            if received is not None:
                received.abort()
            if self.group is not None:
                _drop(self.group)
            self.group = None
            raise ChannelError(
                f"weight channel: version {version} not received ({str(e).splitlines()[0][:200]})"
            ) from None

    def _reset(self) -> None:
        if self.group is not None:
            _drop(self.group)
        self.group = self.tcp = self.address = self.epoch = None

    def close(self) -> None:
        self._reset()
