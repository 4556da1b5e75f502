"""Typed, versioned records that cross stage boundaries (docs/contracts.md).

Each record type is an Arrow schema plus a version stamped into the Parquet metadata
(`rlvr.schema`, `rlvr.schema_version`). Every stage validates what it reads with `validate`:
a missing or mistyped column is a `SchemaError` naming the file, the column and the fix.
Columns beyond the contract pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import UserError
from components.core.store import Store

SCHEMA_VERSION = 3
"""2: rollouts carry `policy_version` (the checkpoint that sampled them; bounded staleness).
3: `reward_components` is a list of {name, value} structs, no longer a map (HF datasets has no
map type; pandas, polars, duckdb and pyarrow read both). Version-2 files are still read: the
map is converted on read (`upgrade`)."""

# one reward component: the name it has in `verify.rewards` and its (unweighted) value
COMPONENT = pa.struct([("name", pa.string()), ("value", pa.float32())])
COMPONENTS = pa.list_(COMPONENT)

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])

# Input datasets are verl's format, unchanged; `prompt` may also be a plain string.
DATASET_REQUIRED = {
    "data_source": pa.string(),
    "prompt": (pa.list_(MESSAGE), pa.string()),
    "reward_model": None,  # a struct with ground_truth (checked below)
}

ROLLOUTS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("sample_index", pa.int32()),
        ("data_source", pa.string()),
        ("ground_truth", pa.string()),
        ("prompt", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("response", pa.string()),
        ("response_token_ids", pa.list_(pa.int32())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()),
        ("checkpoint", pa.string()),
        ("extra_info", pa.string()),  # the dataset row's extra_info as JSON (nullable)
        ("policy_version", pa.int32()),  # index of the checkpoint that sampled the row
    ]
)

SCORED = pa.schema(
    list(ROLLOUTS)
    + [
        ("reward", pa.float32()),
        ("verifier", pa.string()),
        ("extracted_answer", pa.string()),
        ("verify_error", pa.string()),
        ("reward_components", COMPONENTS),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {"rollouts": ROLLOUTS, "scored": SCORED}

# Multi-turn rollouts (tool calls, environments): the response is the whole trajectory after the
# prompt, the policy's turns and the tools' observations in order, as one token stream.
#: one turn of a trajectory: who wrote it, its text, and its span [start, end) in
#: response_token_ids
TURN = pa.struct(
    [("role", pa.string()), ("content", pa.string()), ("start", pa.int32()), ("end", pa.int32())]
)
#: Columns a record may carry beyond its contract, checked when present: `response_mask` is 1
#: for each response token the policy sampled and 0 for one a tool or environment wrote (its
#: `response_logprobs` entry is 0 and means nothing); `turns` lists the trajectory's turns.
#: Absent, every response token was sampled (single-turn).
OPTIONAL: dict[str, pa.DataType] = {
    "response_mask": pa.list_(pa.int8()),
    "turns": pa.list_(TURN),
    "env_reward": pa.float32(),  # the environment's rewards summed over a trajectory's steps
    # image prompts: `<dataset path relative to the run>#<row>`, where the row's images are
    # (components/model/vision.py); the images themselves are never copied into rollouts
    "images_ref": pa.string(),
}
#: `turns`: a multi-turn trajectory out of policy turns; `error`: its environment failed.
FINISH_REASONS = ("stop", "length", "turns", "error")


class SchemaError(UserError):
    """Data that does not follow its contract; the message names the file, column and fix."""


def stamp(schema: pa.Schema, name: str) -> pa.Schema:
    """Attach the record name and version to a schema's metadata."""
    return schema.with_metadata(
        {b"rlvr.schema": name.encode(), b"rlvr.schema_version": str(SCHEMA_VERSION).encode()}
    )


def validate(schema: pa.Schema, name: str, source: str) -> None:
    """Check that `schema` (as read from `source`) carries every column of record `name`."""
    expected = SCHEMAS[name]
    meta = schema.metadata or {}
    version = meta.get(b"rlvr.schema_version")
    if version is not None and int(version) > SCHEMA_VERSION:
        raise SchemaError(
            f"{source}: schema version {int(version)} is newer than this rlvr supports "
            f"({SCHEMA_VERSION}); upgrade rlvr"
        )
    for fld in expected:
        if fld.name not in schema.names:
            raise SchemaError(
                f"{source}: missing column {fld.name!r} ({fld.type}) required by the {name} "
                f"contract (docs/contracts.md); regenerate it with the stage that writes {name}"
            )
        got = schema.field(fld.name).type
        if got != fld.type and not _upgradable(fld.name, got):
            raise SchemaError(
                f"{source}: column {fld.name!r} has type {got}, the {name} contract needs "
                f"{fld.type} (docs/contracts.md)"
            )
    for column, want in OPTIONAL.items():
        if column in schema.names and schema.field(column).type != want:
            raise SchemaError(
                f"{source}: column {column!r} has type {schema.field(column).type}, the {name} "
                f"contract needs {want} where it is present (docs/contracts.md)"
            )


def _upgradable(column: str, got: pa.DataType) -> bool:
    """A column type of an older schema version that ``upgrade`` converts."""
    return (
        column == "reward_components"
        and pa.types.is_map(got)
        and pa.types.is_string(got.key_type)
        and pa.types.is_floating(got.item_type)
    )


def upgrade(table: pa.Table) -> pa.Table:
    """An older version's record table in the current layout (version 2's map of reward
    components becomes the list of {name, value} structs). A cast, so sliced chunks (row
    groups read in pieces), nulls and empty maps convert as they are."""
    if "reward_components" not in table.column_names:
        return table
    col = table.column("reward_components")
    if not pa.types.is_map(col.type):
        return table
    i = table.column_names.index("reward_components")
    return table.set_column(i, pa.field("reward_components", COMPONENTS), col.cast(COMPONENTS))


def components_dict(value: list[dict] | None) -> dict[str, float]:
    """One row's reward components (as ``to_pylist`` gives them) as {name: value}."""
    return {c["name"]: c["value"] for c in value or []}


def validate_dataset(schema: pa.Schema, source: str) -> None:
    """Check a verl-format input dataset."""
    names = schema.names
    for col in ("data_source", "prompt", "reward_model"):
        if col not in names:
            raise SchemaError(
                f"{source}: missing column {col!r}; datasets use verl's format: data_source "
                "(string), prompt (list of {role, content} or string), reward_model "
                "(struct with ground_truth), extra_info (optional)"
            )
    if schema.field("data_source").type not in (pa.string(), pa.large_string()):
        raise SchemaError(f"{source}: column 'data_source' must be a string")
    ptype = schema.field("prompt").type
    ok_prompt = ptype in (pa.string(), pa.large_string()) or (
        pa.types.is_list(ptype)
        and pa.types.is_struct(ptype.value_type)
        and {"role", "content"} <= {f.name for f in ptype.value_type}
    )
    if not ok_prompt:
        raise SchemaError(
            f"{source}: column 'prompt' has type {ptype}; it must be a string or a list of "
            "{role: string, content: string} messages"
        )
    rm = schema.field("reward_model").type
    if not pa.types.is_struct(rm) or "ground_truth" not in {f.name for f in rm}:
        raise SchemaError(
            f"{source}: column 'reward_model' must be a struct with a 'ground_truth' field "
            f"(got {rm}); e.g. {{'ground_truth': '42', 'style': 'rule'}}"
        )


def read_parquet(store: Store, uri: str) -> pa.Table:
    """A whole Parquet file as a table: a local file is read from its path; a remote one from
    its bytes, single-threaded. (pyarrow 26 reading a Parquet *buffer* with its thread pool
    aborts the interpreter at exit now and then, "terminate called without an active
    exception"; reading a path does not. tests/core/test_schemas.py checks the exit status.) One
    file through ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose
    import cost every stage process 0.2-0.4 s of CPU at start-up."""
    local = store.local_path(uri)
    try:
        if local is not None:
            return pq.ParquetFile(local).read()
        return pq.ParquetFile(pa.BufferReader(store.read_bytes(uri))).read(use_threads=False)
    except FileNotFoundError:
        raise SchemaError(f"{uri}: no such file") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise SchemaError(
            f"{uri}: not a readable Parquet file ({e}); regenerate or replace it"
        ) from None


def read_records(store: Store, uris: Iterable[str], name: str) -> pa.Table:
    """Read and validate record files (e.g. all committed rollout parts) into one table."""
    tables = []
    for uri in uris:
        t = read_parquet(store, uri)
        validate(t.schema, name, uri)
        t = upgrade(t)
        tables.append(
            t.select(
                SCHEMAS[name].names + [c for c in t.column_names if c not in SCHEMAS[name].names]
            )
        )
    if not tables:
        return SCHEMAS[name].empty_table()
    return pa.concat_tables(tables, promote_options="default")


def read_dataset(store: Store, uri: str) -> pa.Table:
    """Read and validate a verl-format dataset."""
    t = read_parquet(store, uri)
    validate_dataset(t.schema, uri)
    if t.num_rows == 0:
        raise SchemaError(f"{uri}: the dataset has no rows")
    return t


def ground_truth_of(row_reward_model: dict | None, source: str, index: int) -> str:
    gt = (row_reward_model or {}).get("ground_truth")
    if gt is None:
        raise SchemaError(f"{source}: row {index} has no reward_model.ground_truth")
    return gt if isinstance(gt, str) else json.dumps(gt)


class PartWriter:
    """Streams records of one contract into a local Parquet file, one row group per flush."""

    def __init__(self, path: Path, name: str, optional: tuple[str, ...] = ()) -> None:
        self.path = path
        schema = SCHEMAS[name]
        for column in optional:  # e.g. multi-turn rollouts' response_mask and turns
            schema = schema.append(pa.field(column, OPTIONAL[column]))
        self.schema = stamp(schema, name)
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self.rows = 0

    def write(self, rows: dict[str, list]) -> None:
        batch = pa.Table.from_pydict(rows, schema=self.schema)
        self._writer.write_table(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()
