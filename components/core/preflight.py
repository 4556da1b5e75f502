"""Checks shared by `rlvr check` and the stages: collect every problem, then fail once.

A `Problems` list gathers what is wrong, each entry naming where (a file, a row, a config key),
what, and the fix; `raise_if_any` turns the errors into one `PreflightError` (a StageError: exit
status 2, no traceback). Warnings (e.g. prompts that generate will skip) are reported but do not
fail. The checks here read only what they need: a store probe, a checkpoint's small files and
safetensors headers, a dataset scanned whole with Arrow compute (no Python loop over rows).

Stage-specific checks live with their stage (train: algorithm names and options; verify:
verifiers and data-source coverage; generate: prompt lengths); `pipelines/preflight.py` runs them
all for `rlvr check`, `run`, `compile` and `submit`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import Problems
from components.core.schemas import SchemaError, validate_dataset
from components.core.store import Store, StoreError, is_s3, join

MAX_ROWS_NAMED = 5


def rows_text(rows: np.ndarray) -> str:
    """'rows 3, 17 and 4 more' (0-based row indices)."""
    shown = ", ".join(str(int(r)) for r in rows[:MAX_ROWS_NAMED])
    more = len(rows) - MAX_ROWS_NAMED
    return f"row{'s' if len(rows) > 1 else ''} {shown}" + (f" and {more} more" if more > 0 else "")


# --- the store ---------------------------------------------------------------------------------


def check_store(store: Store, root: str, problems: Problems) -> None:
    """The store is reachable and writable: on S3 one HEAD request on the bucket; locally a probe
    file written and removed under the store directory."""
    if is_s3(root):
        bucket = root[len("s3://") :].split("/", 1)[0]
        try:
            store._client.head_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - botocore raises many kinds; each means unreachable
            problems.error(
                f"run.store {root}",
                f"bucket {bucket!r} is not reachable ({type(e).__name__}: {e})",
                "check the endpoint (run.s3_endpoint_url / AWS_ENDPOINT_URL), the bucket name "
                "and the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
            )
        return
    path = Path(root[len("file://") :] if root.startswith("file://") else root)
    if not path.exists():  # it will be created: its nearest existing parent must allow that
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            problems.error(
                f"run.store {root}",
                f"cannot be created ({parent} is not writable)",
                "choose a writable directory for run.store",
            )
        return
    probe = join(root, f".rlvr-check-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        store.write_bytes(probe, b"")
        store.delete(probe)
    except (StoreError, OSError) as e:
        problems.error(
            f"run.store {root}",
            f"cannot write there ({e})",
            "choose a writable directory for run.store",
        )


# --- datasets ----------------------------------------------------------------------------------


def scan_dataset(table: pa.Table, uri: str, problems: Problems) -> None:
    """Every row of a verl-format dataset, whole, with Arrow compute: a data_source, a non-empty
    prompt (every message with content), and a ground truth."""
    try:
        validate_dataset(table.schema, uri)
    except SchemaError as e:
        problems.error(uri, str(e).removeprefix(f"{uri}: "))
        return
    if table.num_rows == 0:
        problems.error(uri, "the dataset has no rows", "point data.* at a dataset with rows")
        return

    def report(mask, what: str, fix: str) -> None:
        mask = mask.combine_chunks() if hasattr(mask, "combine_chunks") else mask
        rows = np.flatnonzero(mask.fill_null(True).to_numpy(zero_copy_only=False))
        if rows.size:
            problems.error(f"{uri} {rows_text(rows)}", what, fix)

    ds = table.column("data_source")
    report(
        pc.or_kleene(ds.is_null(), pc.equal(pc.utf8_length(ds), 0)),
        "data_source is null or empty",
        "give every row the data_source of its verifier",
    )
    prompt = table.column("prompt")
    if pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type):
        empty = pc.or_kleene(
            prompt.is_null(), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(prompt)), 0)
        )
        report(empty, "prompt is null or empty", "remove those rows or give them a prompt")
    else:
        flat = prompt.combine_chunks()
        no_messages = pc.or_kleene(flat.is_null(), pc.equal(pc.list_value_length(flat), 0))
        report(no_messages, "prompt has no messages", "remove those rows or give them a prompt")
        values = pc.list_flatten(flat)
        parents = pc.list_parent_indices(flat).to_numpy()
        content = pc.struct_field(values, "content")
        role = pc.struct_field(values, "role")
        bad = pc.or_kleene(content.is_null(), pc.equal(pc.utf8_length(content), 0))
        bad = pc.or_kleene(bad, role.is_null())
        bad_msgs = bad.fill_null(True).to_numpy(zero_copy_only=False)
        if bad_msgs.any():
            rows = np.unique(parents[bad_msgs])
            problems.error(
                f"{uri} {rows_text(rows)}",
                "a prompt message has no role or no content",
                "every message needs a role and non-empty content",
            )
    rm = table.column("reward_model").combine_chunks()
    gt = pc.struct_field(rm, "ground_truth")
    missing = pc.or_kleene(rm.is_null(), gt.is_null())
    if pa.types.is_string(gt.type) or pa.types.is_large_string(gt.type):
        missing = pc.or_kleene(missing, pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(gt)), 0))
    report(
        missing,
        "reward_model.ground_truth is missing or empty",
        "every row needs the answer its verifier checks against",
    )


def prompt_byte_lengths(table: pa.Table) -> np.ndarray:
    """UTF-8 bytes of each row's prompt text (all message contents), with Arrow compute."""
    prompt = table.column("prompt").combine_chunks()
    if pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type):
        return pc.binary_length(prompt).fill_null(0).to_numpy(zero_copy_only=False)
    content = pc.struct_field(pc.list_flatten(prompt), "content")
    lengths = pc.binary_length(content).fill_null(0).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(prompt).to_numpy()
    return np.bincount(parents, weights=lengths, minlength=len(prompt)).astype(np.int64)
