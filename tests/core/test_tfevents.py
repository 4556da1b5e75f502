"""components/core/tfevents.py against published values and TensorBoard's own reader."""

from __future__ import annotations

import math

from components.core.tfevents import crc32c, record, scalar_event_file


def test_crc32c_matches_the_published_check_values():
    """RFC 3720 (iSCSI) B.4 and the standard check value of CRC-32C."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(bytes([0xFF] * 32)) == 0x62A8AB43


def test_tensorboard_reads_the_scalars_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for step in (0, 7):
        data = scalar_event_file({"train/loss": 0.25 + step, "a/b": -3.0}, step, 1.5e9 + step)
        (tmp_path / f"events.out.tfevents.{step:08d}.rlvr").write_bytes(data)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["a/b", "train/loss"]
    loss = acc.Scalars("train/loss")
    assert [(e.step, e.value, e.wall_time) for e in loss] == [
        (0, 0.25, 1.5e9),
        (7, 7.25, 1.5e9 + 7),
    ]
    assert [e.value for e in acc.Scalars("a/b")] == [-3.0, -3.0]


def test_a_record_is_framed_with_its_length_and_checksums():
    """Length, masked CRC of the length, data, masked CRC of the data, against TensorBoard's own
    masked CRC-32C."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    framed = record(b"abc")
    assert len(framed) == 8 + 4 + 3 + 4 and framed[:8] == (3).to_bytes(8, "little")
    assert framed[12:15] == b"abc"
    assert int.from_bytes(framed[8:12], "little") == masked_crc32c(framed[:8])
    assert int.from_bytes(framed[15:19], "little") == masked_crc32c(b"abc")


def test_a_value_past_float32_is_written_infinite(tmp_path):
    """protobuf stores a float field past float32's range as inf; so do these files, instead of
    failing (which would turn TensorBoard off for the rest of the worker)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = scalar_event_file({"big": 1e40, "small": -1e40, "ok": 2.5}, 3, 1.5e9)
    (tmp_path / "events.out.tfevents.00000003.rlvr").write_bytes(data)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.value for e in acc.Scalars("big")] == [math.inf]
    assert [e.value for e in acc.Scalars("small")] == [-math.inf]
    assert [e.value for e in acc.Scalars("ok")] == [2.5]
