"""Arrow contracts: datasets, rollouts and scored rollouts validate on read."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.schemas import (
    ROLLOUTS,
    SCORED,
    SchemaError,
    read_dataset,
    read_records,
    stamp,
    validate,
    validate_dataset,
)
from components.core.store import LocalStore


def test_scored_extends_rollouts():
    assert SCORED.names[: len(ROLLOUTS)] == ROLLOUTS.names
    assert {"reward", "verifier", "extracted_answer", "verify_error"} <= set(SCORED.names)


def test_missing_column_names_file_and_column(tmp_path):
    table = ROLLOUTS.empty_table().drop_columns(["response_logprobs"])
    path = tmp_path / "part-00000.parquet"
    pq.write_table(table, path)
    with pytest.raises(SchemaError) as e:
        read_records(LocalStore(), [str(path)], "rollouts")
    assert str(path) in str(e.value) and "'response_logprobs'" in str(e.value)


def test_mistyped_column_is_named():
    fields = [pa.field(f.name, pa.int64() if f.name == "reward" else f.type) for f in SCORED]
    with pytest.raises(SchemaError, match="'reward' has type int64.*needs float"):
        validate(pa.schema(fields), "scored", "x.parquet")


def test_extra_columns_pass_through(tmp_path):
    table = SCORED.empty_table().append_column("my_note", pa.array([], pa.string()))
    path = tmp_path / "p.parquet"
    pq.write_table(table.replace_schema_metadata(stamp(table.schema, "scored").metadata), path)
    out = read_records(LocalStore(), [str(path)], "scored")
    assert "my_note" in out.column_names


def test_newer_schema_version_is_refused():
    schema = ROLLOUTS.with_metadata({b"rlvr.schema_version": b"99"})
    with pytest.raises(SchemaError, match="newer than this rlvr"):
        validate(schema, "rollouts", "x")


@pytest.mark.parametrize(
    "table, message",
    [
        (pa.table({"prompt": ["1+1="], "reward_model": [{"ground_truth": "2"}]}), "'data_source'"),
        (
            pa.table(
                {"data_source": ["a"], "prompt": [1], "reward_model": [{"ground_truth": "2"}]}
            ),
            "'prompt' has type int64",
        ),
        (
            pa.table({"data_source": ["a"], "prompt": ["x"], "reward_model": [{"style": "r"}]}),
            "'reward_model' must be a struct with a 'ground_truth'",
        ),
    ],
)
def test_dataset_contract(table, message):
    with pytest.raises(SchemaError, match=message):
        validate_dataset(table.schema, "d.parquet")


def test_dataset_accepts_chat_and_string_prompts(tmp_path, tiny_assets):
    t = read_dataset(LocalStore(), str(tiny_assets / "train.parquet"))
    assert pa.types.is_list(t.schema.field("prompt").type)
    plain = pa.table(
        {"data_source": ["a"], "prompt": ["2+2="], "reward_model": [{"ground_truth": "4"}]}
    )
    pq.write_table(plain, tmp_path / "plain.parquet")
    assert read_dataset(LocalStore(), str(tmp_path / "plain.parquet")).num_rows == 1
    pq.write_table(plain.slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(SchemaError, match="no rows"):
        read_dataset(LocalStore(), str(tmp_path / "empty.parquet"))


def test_unreadable_parquet_names_the_file(tmp_path):
    bad = tmp_path / "part-00000.parquet"
    bad.write_bytes(b"this is not parquet")
    with pytest.raises(SchemaError, match=f"{bad}: not a readable Parquet file"):
        read_records(LocalStore(), [str(bad)], "rollouts")


def test_reading_parquet_never_aborts_the_interpreter_at_exit(tmp_path, tiny_assets):
    """pyarrow 26 reading a Parquet *buffer* with its thread pool made about one process in four
    abort at exit ("terminate called without an active exception", status 134): a stage that
    had printed its result then failed. Files are read from their path now; ten processes that
    read and exit must all exit cleanly."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from components.core.schemas import read_dataset\n"
        "from components.core.store import LocalStore\n"
        f"read_dataset(LocalStore(), {str(tiny_assets / 'train.parquet')!r})\n"
        "sys.exit(2)\n"
    )
    codes = [
        subprocess.run([sys.executable, "-c", script], capture_output=True).returncode
        for _ in range(10)
    ]
    assert codes == [2] * 10, codes
