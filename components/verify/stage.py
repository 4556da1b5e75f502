"""Verify stage: rollouts of iteration i -> scored rollouts.

    python -m components.verify CONFIG --run-id ID --iteration I [--force]
    rlvr stage verify CONFIG --run-id ID --iteration I

Each row's `data_source` picks its verifier from `verify.rewards` (then the built-in defaults).
A data_source with no verifier is an error listing the registered ones: it never silently scores
zero. Samples run in a process pool with a per-sample deadline (components/verify/executor.py);
a verifier that raises or times out gives that sample reward 0 and a `verify_error`, and the
stage fails only when more than `verify.max_error_fraction` of samples errored, so a broken
verifier cannot pass as a bad policy.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.commit import (
    OutputDir,
    check_shard,
    clear_other_layouts,
    committed_files,
    lineage,
    shard_dir,
    shard_of,
)
from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout, store_for
from components.core.schemas import SCORED, read_records, stamp
from components.verify.executor import ScoreItem, score_batch

log = logging.getLogger("rlvr.verify")

# verl's well-known data sources and the verifier that scores them; config entries win.
DEFAULT_REWARDS: dict[str, str] = {
    "openai/gsm8k": "math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "math_dapo": "math",
}


def resolve_verifiers(data_sources: set[str], rewards: dict[str, str]) -> dict[str, str]:
    """data_source -> verifier spec, or StageError listing what is registered."""
    table = {**DEFAULT_REWARDS, **rewards}
    missing = sorted(d for d in data_sources if d not in table)
    if missing:
        raise StageError(
            f"no verifier registered for data_source {missing}; registered data sources: "
            f"{sorted(table)}. Add e.g. `verify.rewards: {{{missing[0]!r}: math}}` to the config "
            "(built-ins: math, exact, code, format; or a plugin 'module:function' / 'file.py:function')"
        )
    return {d: table[d] for d in data_sources}


def score_table(
    table: pa.Table,
    rewards: dict[str, str],
    *,
    num_workers: int,
    timeout_s: float,
    max_error_fraction: float,
) -> tuple[pa.Table, dict[str, Any]]:
    """Score a rollouts table; returns the scored table and stats."""
    sources = table.column("data_source").to_pylist()
    verifiers = resolve_verifiers(set(sources), rewards)
    responses = table.column("response").to_pylist()
    truths = table.column("ground_truth").to_pylist()
    extras = table.column("extra_info").to_pylist()
    items = [
        ScoreItem(verifiers[ds], ds, resp, gt, json.loads(extra) if extra else None)
        for ds, resp, gt, extra in zip(sources, responses, truths, extras, strict=True)
    ]
    t0 = time.perf_counter()
    results = score_batch(items, num_workers=num_workers, timeout_s=timeout_s)
    elapsed = time.perf_counter() - t0

    errors: Counter[str] = Counter()
    timeouts: Counter[str] = Counter()
    for item, res in zip(items, results, strict=True):
        if res.timed_out:
            timeouts[item.verifier] += 1
        elif res.error is not None:
            errors[item.verifier] += 1
    n = len(items)
    bad = sum(errors.values()) + sum(timeouts.values())
    rewards_col = [r.reward for r in results]
    stats: dict[str, Any] = {
        "samples": n,
        "reward_mean": sum(rewards_col) / n if n else 0.0,
        "errors": dict(errors),
        "timeouts": dict(timeouts),
        "error_fraction": bad / n if n else 0.0,
        "verifications_per_s": n / elapsed if elapsed > 0 else 0.0,
        "verifiers": verifiers,
    }
    by_source: dict[str, list[float]] = {}
    for ds, r in zip(sources, rewards_col, strict=True):
        by_source.setdefault(ds, []).append(r)
    stats["reward_mean_by_data_source"] = {k: sum(v) / len(v) for k, v in by_source.items()}
    if n and bad / n > max_error_fraction:
        first = next(r.error for r in results if r.error is not None)
        raise StageError(
            f"{bad}/{n} samples errored or timed out (> verify.max_error_fraction="
            f"{max_error_fraction}); first error: {first}. Fix the verifier or raise the limit"
        )
    scored = (
        table.append_column("reward", pa.array(rewards_col, pa.float32()))
        .append_column("verifier", pa.array([i.verifier for i in items], pa.string()))
        .append_column(
            "extracted_answer", pa.array([r.extracted_answer for r in results], pa.string())
        )
        .append_column("verify_error", pa.array([r.error for r in results], pa.string()))
    )
    extra_cols = [c for c in scored.column_names if c not in SCORED.names]
    return scored.select(SCORED.names + extra_cols), stats


def run(
    cfg: RunConfig, iteration: int, *, force: bool = False, shard: int = 0, num_shards: int = 1
) -> dict[str, Any]:
    """Score the rollouts of one iteration (or one shard of them, by prompt_id hash)."""
    check_shard(shard, num_shards)
    store, layout = store_for(cfg), RunLayout.of(cfg)
    out = OutputDir(store, shard_dir(layout.scored(iteration), shard, num_shards), "verify")
    inputs = lineage(store, [layout.rollouts(iteration)], cfg.verify)
    if out.up_to_date(inputs) and not force:
        log.info(
            "scored rollouts of iteration %d (%s) already committed; skipping", iteration, out.uri
        )
        return {"skipped": True, "uri": out.uri}
    parts = committed_files(store, layout.rollouts(iteration), ".parquet")
    table = read_records(store, parts, "rollouts")
    if num_shards > 1:
        ids = table.column("prompt_id").to_pylist()
        table = table.filter(pa.array([shard_of(p, num_shards) == shard for p in ids]))
    scored, stats = score_table(
        table,
        cfg.verify.rewards,
        num_workers=cfg.verify.num_workers,
        timeout_s=cfg.verify.timeout_s,
        max_error_fraction=cfg.verify.max_error_fraction,
    )
    clear_other_layouts(store, layout.scored(iteration), num_shards)
    out.begin(force=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-verify-"))
    try:
        path = tmp / "part-00000.parquet"
        pq.write_table(
            scored.replace_schema_metadata(stamp(scored.schema, "scored").metadata),
            path,
            compression="zstd",
        )
        out.put_file(path, path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stats.update(iteration=iteration, shard=shard, num_shards=num_shards)
    manifest = out.commit(stats, inputs)
    log.info(
        "iteration %d: reward mean %.4f over %d samples",
        iteration,
        stats["reward_mean"],
        stats["samples"],
    )
    return {"skipped": False, "uri": out.uri, "stats": manifest["stats"]}
