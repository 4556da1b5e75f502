"""Outputs every reader opens: scored rollouts and eval samples, as the
stages write them, read by pyarrow, pandas, polars, duckdb and Hugging Face datasets, with the
same reward components in each; and files of the previous schema version still read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from components.core.schemas import SCHEMA_VERSION, SCORED, read_records, stamp, upgrade
from components.core.store import get_store
from pipelines.cli import main


def _components(rows: list) -> list[dict[str, float]]:
    return [{c["name"]: round(float(c["value"]), 6) for c in r} for r in rows]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, tiny_assets) -> dict[str, Path]:
    from tests.support.runs import write_config

    root = tmp_path_factory.mktemp("readers")
    config = write_config(root, tiny_assets, run={"iterations": 1})
    for stage in ("init", "generate", "verify"):
        res = CliRunner().invoke(main, ["stage", stage, str(config)])
        assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["stage", "evaluate", str(config)])
    assert res.exit_code == 0, res.output
    run = root / "runs" / "t"
    scored = sorted((run / "iterations/00000/scored").glob("*.parquet"))
    samples = sorted((run / "evals/00000").rglob("*.parquet"))
    assert scored and samples
    return {"scored": scored[0], "eval samples": samples[0]}


@pytest.mark.parametrize("kind", ["scored", "eval samples"])
def test_five_readers_agree(outputs: dict[str, Path], kind: str) -> None:
    import datasets
    import duckdb
    import pandas as pd
    import polars as pl

    path = str(outputs[kind])
    want = _components(pq.read_table(path).column("reward_components").to_pylist())
    assert want and all(want)  # every row names its components
    got = {
        "pandas": _components([list(v) for v in pd.read_parquet(path)["reward_components"]]),
        "polars": _components(pl.read_parquet(path)["reward_components"].to_list()),
        "duckdb": _components(
            [r[0] for r in duckdb.sql(f"SELECT reward_components FROM '{path}'").fetchall()]
        ),
        "datasets.from_parquet": _components(
            datasets.Dataset.from_parquet(path, cache_dir=str(Path(path).parent / ".hf"))[
                "reward_components"
            ]
        ),
        "load_dataset": _components(
            datasets.load_dataset(
                "parquet", data_files=path, split="train", cache_dir=str(Path(path).parent / ".hf")
            )["reward_components"]
        ),
    }
    for reader, value in got.items():
        assert value == want, reader


def test_version_2_files_still_read(tmp_path: Path) -> None:
    v2_type = pa.map_(pa.string(), pa.float32())
    old_schema = pa.schema(
        [f if f.name != "reward_components" else pa.field(f.name, v2_type) for f in SCORED]
    )
    row = {f.name: None for f in SCORED}
    row.update(prompt_id="p", sample_index=0, reward=1.0)
    rows = [
        dict(row, reward_components=[("correct", 1.0), ("format", 0.5)]),
        dict(row, sample_index=1, reward_components=None),
    ]
    table = pa.Table.from_pylist(rows, schema=old_schema)
    meta = stamp(table.schema, "scored").metadata
    meta[b"rlvr.schema_version"] = b"2"
    path = tmp_path / "part-00000.parquet"
    pq.write_table(table.replace_schema_metadata(meta), path)
    got = read_records(get_store(str(tmp_path)), [str(path)], "scored")
    assert got.schema.field("reward_components").type == SCORED.field("reward_components").type
    assert got.column("reward_components").to_pylist() == [
        [{"name": "correct", "value": 1.0}, {"name": "format", "value": 0.5}],
        None,
    ]
    assert upgrade(got) is got  # already current
    assert SCHEMA_VERSION == 3


def test_upgrade_handles_sliced_chunks_nulls_and_empty_maps() -> None:
    # a row group read in pieces arrives as slices of one array with offsets not at 0
    v2 = pa.array(
        [[("a", 1.0)], [("b", 2.0), ("c", 3.0)], None, [], [("d", 4.0)]] * 3,
        pa.map_(pa.string(), pa.float32()),
    )
    table = pa.table({"reward_components": pa.chunked_array([v2.slice(0, 4), v2.slice(4, 9)])})
    got = upgrade(table).column("reward_components").to_pylist()
    want = [
        [{"name": k, "value": v} for k, v in row] if row is not None else None
        for row in v2.to_pylist()[:13]
    ]
    assert got == want
