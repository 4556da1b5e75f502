"""TensorBoard event files of scalars, written directly.

An event file is a sequence of TFRecords (8-byte length, masked CRC-32C of the length, the
record, masked CRC-32C of the record), each an `Event` protocol buffer: the first says the file
version, the others carry a wall time, a step and a `Summary` of (tag, simple_value) pairs.
That is all a run's figures need, so it is written here, in a few dozen lines, instead of through
tensorboardX, which imports torch when torch is installed: the verify worker, which needs no
torch, paid about 1.3 s of CPU for it at its first commit, beside generate and train. TensorBoard's
own reader reads these files (tests/core/test_tfevents.py, tests/core/test_tracking.py).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames its records."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord."""
    length = struct.pack("<Q", len(data))
    return length + _masked_crc(length) + data + _masked_crc(data)


def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _float32(value: float) -> bytes:
    """A float as protobuf's `float` field holds it: past float32's range it is infinite (as
    protobuf itself converts it), not an error."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(
    wall_time: float,
    step: int = 0,
    *,
    scalars: Mapping[str, float] | None = None,
    file_version: bytes | None = None,
) -> bytes:
    """An `Event`: wall_time (1, double), step (2, int64), file_version (3) or summary (5), the
    summary's values (1) each a tag (1) and a simple_value (2, float)."""
    out = b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version)
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + b"\x15" + _float32(value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


def scalar_event_file(scalars: Mapping[str, float], step: int, wall_time: float) -> bytes:
    """A whole event file: the version record, then one record per scalar (as a SummaryWriter's
    add_scalar writes them), in the order given."""
    out = record(event(wall_time, file_version=FILE_VERSION))
    for tag, value in scalars.items():
        out += record(event(wall_time, step, scalars={tag: float(value)}))
    return out
