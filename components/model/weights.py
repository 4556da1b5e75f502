"""Weight files written one tensor at a time.

A policy's weights go to the store every iteration (the handoff to generate and evaluate) and
its full training state every few (docs/contracts.md, "Checkpoints", "Train state"). Both are
safetensors files written here from a stream of `(name, tensor)` pairs in a declared order:

- nothing is held whole: a tensor is written as soon as it is gathered and then dropped, so a
  70B policy's 140 GB of bf16 weights never sit in one process's memory;
- each file's sha256 is computed as its bytes go out, so the commit manifest costs no second
  read of what was just written;
- the bytes depend only on the names, dtypes, shapes and values (the header is laid out
  deterministically), so the same weights always give the same file: a replayed update is
  checked against a committed checkpoint by hashing what it would write (`HashSink`), without
  writing anything.

The layout is the safetensors format (an 8-byte little-endian header length, a JSON header
padded with spaces to 8 bytes, the tensors' bytes back to back), tensors sorted by item size
and then name as the safetensors library sorts them, so every tensor starts aligned. Past
`max_shard_bytes` the weights are split into `model-0000k-of-0000n.safetensors` files with
Hugging Face's `model.safetensors.index.json`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

#: safetensors' names of the torch dtypes a checkpoint can hold.
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
#: Hugging Face's default shard size for `save_pretrained` is 5 GB; checkpoints here use 2 GB,
#: as they always have (components/model/checkpoint.py MAX_SHARD_SIZE).
MAX_SHARD_BYTES = 2 * 10**9


@dataclass(frozen=True)
class Entry:
    """One tensor of a weights file: its name in the file, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class FileInfo:
    """A written file: its size and sha256, as a commit manifest records them."""

    bytes: int
    sha256: str


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """The order tensors are stored in: larger items first, then by name (every tensor then
    starts at a multiple of its item size, since the header is padded to 8 bytes)."""
    return sorted(entries, key=lambda e: (-e.itemsize, e.name))


def header(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors header of `entries` stored in that order, length prefix included."""
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for e in entries:
        if e.dtype not in DTYPE_CODES:
            raise ValueError(f"{e.name}: dtype {e.dtype} cannot be stored in safetensors")
        doc[e.name] = {
            "dtype": DTYPE_CODES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class HashSink:
    """A file object that keeps nothing: what a writer would write, hashed and counted only."""

    def write(self, data) -> int:
        return len(memoryview(data))

    def close(self) -> None:
        pass


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes without a copy where it is contiguous (bf16 too, which numpy lacks)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


class _Hasher:
    """sha256 of a stream of buffers, computed on a thread of its own while the caller writes
    them (hashlib and file writes both release the GIL: on 2 cores the two overlap, a third
    off a streamed write). At most `pending` buffers wait, so memory stays bounded; each stays
    alive, unchanged, until hashed (the caller's tensors, held by the futures)."""

    def __init__(self, pending: int = 8) -> None:
        self._hash = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlvr-sha256")
        self._waiting: deque = deque()
        self._pending = pending

    def update(self, data) -> None:
        self._waiting.append(self._pool.submit(self._hash.update, data))
        while len(self._waiting) > self._pending:
            self._waiting.popleft().result()

    def hexdigest(self) -> str:
        while self._waiting:
            self._waiting.popleft().result()
        self._pool.shutdown()
        return self._hash.hexdigest()


class FileWriter:
    """Writes one safetensors file whose entries are declared up front; `put` the tensors in
    the declared order (`ordered(entries)`), then `close` for the file's size and sha256."""

    def __init__(
        self, sink: BinaryIO, entries: list[Entry], metadata: dict[str, str] | None = None
    ) -> None:
        self.sink, self.entries = sink, list(entries)
        self._next = 0
        # hashing only (no file): nothing to overlap with
        self._hash = hashlib.sha256() if isinstance(sink, HashSink) else _Hasher()
        self._bytes = 0
        self._emit(header(self.entries, metadata))

    def _emit(self, data) -> None:
        self._hash.update(data)
        self.sink.write(data)
        self._bytes += len(memoryview(data))

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self.entries):
            raise ValueError(f"{name}: every declared tensor was already written")
        e = self.entries[self._next]
        if name != e.name:
            raise ValueError(f"expected tensor {e.name!r} next, got {name!r}")
        if tensor.dtype != e.dtype or tuple(tensor.shape) != e.shape:
            raise ValueError(
                f"{name}: declared {e.dtype} {list(e.shape)}, got {tensor.dtype} "
                f"{list(tensor.shape)}"
            )
        self._emit(raw_bytes(tensor))
        self._next += 1

    def close(self) -> FileInfo:
        if self._next != len(self.entries):
            missing = [e.name for e in self.entries[self._next :]]
            raise ValueError(f"tensors declared but never written: {missing[:3]}")
        self.sink.close()
        return FileInfo(self._bytes, self._hash.hexdigest())

    def abort(self) -> None:
        """Stop without a result (the caller's error): the hashing thread ends."""
        if isinstance(self._hash, _Hasher):
            self._hash.hexdigest()
        self.sink.close()


def shard_plan(entries: list[Entry], max_shard_bytes: int = MAX_SHARD_BYTES) -> dict[str, list]:
    """{file name: its entries in storage order}: one `model.safetensors`, or shards of at most
    `max_shard_bytes` (a larger tensor gets a shard of its own) named as transformers names them."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in ordered(entries):
        if shards[-1] and size + e.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    if len(shards) == 1:
        return {WEIGHTS_NAME: shards[0]}
    n = len(shards)
    return {f"model-{k + 1:05d}-of-{n:05d}.safetensors": s for k, s in enumerate(shards)}


def index_json(plan: dict[str, list[Entry]]) -> bytes | None:
    """`model.safetensors.index.json` for a sharded plan (None for a single file)."""
    if len(plan) == 1:
        return None
    weight_map = {e.name: f for f, es in plan.items() for e in es}
    total = sum(e.nbytes for es in plan.values() for e in es)
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(doc, indent=2) + "\n").encode()


def write_files(
    directory: Path | None,
    plan: dict[str, list[Entry]],
    tensors: Iterator[tuple[str, torch.Tensor]],
    metadata: dict[str, str] | None = None,
) -> dict[str, FileInfo]:
    """Write `plan`'s files into `directory` from `tensors`, which must yield every entry in
    the plan's order (file by file, each in storage order). `directory` None: hash only
    (HashSink), to learn the files' sha256 without writing them."""
    out: dict[str, FileInfo] = {}
    for fname, entries in plan.items():
        sink = HashSink() if directory is None else open(Path(directory) / fname, "wb")  # noqa: SIM115
        w = FileWriter(sink, entries, metadata)
        try:
            for _ in entries:
                name, tensor = next(tensors)
                w.put(name, tensor)
            out[fname] = w.close()
        except BaseException:
            w.abort()
            raise
    return out


def plan_order(plan: dict[str, list[Entry]]) -> list[Entry]:
    """Every entry of a plan in the order `write_files` consumes them."""
    return [e for es in plan.values() for e in es]
