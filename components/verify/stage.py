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
    SUCCESS,
    OutputDir,
    check_shard,
    clear_other_layouts,
    committed_files,
    lineage,
    shard_dir,
    shard_name,
    shard_of,
)
from components.core.config import (
    CurriculumSection,
    OverlongPenalty,
    RewardSpec,
    RunConfig,
    unused_keys,
)
from components.core.curriculum import PROMPT_STATS, group_shares, scored_prompt_stats
from components.core.errors import StageError
from components.core.layout import RunLayout, store_for
from components.core.schemas import COMPONENTS, SCORED, read_records, stamp
from components.core.warm import Timeline, run_once, segment_summary, serve_stage
from components.core.warm import segment as warm_segment
from components.verify.executor import ScoreItem, score_batch
from components.verify.format import soft_overlong_penalty

log = logging.getLogger("rlvr.verify")

# verl's well-known data sources and the verifier that scores them; config entries win.
DEFAULT_REWARDS: dict[str, str] = {
    "openai/gsm8k": "math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "math_dapo": "math",
}


Component = tuple[str, str, float]  # (name, verifier spec, weight)


def resolve_rewards(
    data_sources: set[str], rewards: dict[str, str | RewardSpec]
) -> dict[str, list[Component]]:
    """data_source -> its reward components, or StageError listing what is registered."""
    table = {**DEFAULT_REWARDS, **rewards}
    missing = sorted(d for d in data_sources if d not in table)
    if missing:
        raise StageError(
            f"no verifier registered for data_source {missing}; registered data sources: "
            f"{sorted(table)}. Add e.g. `verify.rewards: {{{missing[0]!r}: math}}` to the config "
            "(built-ins: math, exact, code, format; or a plugin 'module:function' / 'file.py:function')"
        )
    out: dict[str, list[Component]] = {}
    for d in data_sources:
        spec = table[d]
        if isinstance(spec, str):
            out[d] = [(spec, spec, 1.0)]
        else:
            out[d] = [(c.key, c.verifier, c.weight) for c in spec.components]
    return out


def describe(components: list[Component]) -> str:
    """The `verifier` column: the spec, or `w*name:spec + ...` for a weighted sum."""
    if len(components) == 1 and components[0][2] == 1.0:
        return components[0][1]
    return " + ".join(f"{w:g}*{name}:{spec}" for name, spec, w in components)


def score_table(
    table: pa.Table,
    rewards: dict[str, str | RewardSpec],
    *,
    num_workers: int,
    timeout_s: float,
    max_error_fraction: float,
    overlong: OverlongPenalty | None = None,
    env_reward_weight: float = 1.0,
) -> tuple[pa.Table, dict[str, Any]]:
    """Score a rollouts table; returns the scored table and stats.

    reward = sum_k weight_k * component_k (+ the overlong penalty, + the environment's reward
    times `env_reward_weight` where the rollouts carry `env_reward`); every component's value is
    kept in `reward_components`. A component that raises or times out contributes 0 and its
    error goes to `verify_error`; the stage fails when more than `max_error_fraction` of the
    samples had an error.
    """
    sources = table.column("data_source").to_pylist()
    plan = resolve_rewards(set(sources), rewards)
    responses = table.column("response").to_pylist()
    truths = table.column("ground_truth").to_pylist()
    extras = [json.loads(e) if e else None for e in table.column("extra_info").to_pylist()]
    items: list[ScoreItem] = []
    owner: list[tuple[int, str, float]] = []  # (row, component name, weight) per item
    for row, ds in enumerate(sources):
        for name, spec, weight in plan[ds]:
            items.append(ScoreItem(spec, ds, responses[row], truths[row], extras[row]))
            owner.append((row, name, weight))
    t0 = time.perf_counter()
    results = score_batch(items, num_workers=num_workers, timeout_s=timeout_s)
    elapsed = time.perf_counter() - t0

    n = len(sources)
    reward = [0.0] * n
    components: list[dict[str, float]] = [{} for _ in range(n)]
    answer: list[str | None] = [None] * n
    row_errors: list[list[str]] = [[] for _ in range(n)]
    errors: Counter[str] = Counter()
    timeouts: Counter[str] = Counter()
    for item, res, (row, name, weight) in zip(items, results, owner, strict=True):
        components[row][name] = res.reward
        reward[row] += weight * res.reward
        if answer[row] is None:
            answer[row] = res.extracted_answer
        if res.timed_out:
            timeouts[item.verifier] += 1
        elif res.error is not None:
            errors[item.verifier] += 1
        if res.error is not None:
            row_errors[row].append(
                res.error if len(plan[item.data_source]) == 1 else f"{name}: {res.error}"
            )
    if overlong is not None:
        lengths = [len(t) for t in table.column("response_token_ids").to_pylist()]
        for row, length in enumerate(lengths):
            pen = soft_overlong_penalty(
                length,
                max_length=overlong.max_length,
                buffer=overlong.buffer,
                penalty=overlong.penalty,
            )
            components[row]["overlong"] = pen
            reward[row] += pen
    if "env_reward" in table.column_names and env_reward_weight:
        for row, value in enumerate(table.column("env_reward").to_pylist()):
            components[row]["env"] = env_reward_weight * float(value or 0.0)
            reward[row] += components[row]["env"]
    bad = sum(1 for e in row_errors if e)
    stats: dict[str, Any] = {
        "samples": n,
        "reward_mean": sum(reward) / n if n else 0.0,
        "errors": dict(errors),
        "timeouts": dict(timeouts),
        "error_fraction": bad / n if n else 0.0,
        "verifications_per_s": len(items) / elapsed if elapsed > 0 else 0.0,
        "verifiers": {d: describe(c) for d, c in plan.items()},
    }
    by_source: dict[str, list[float]] = {}
    for ds, r in zip(sources, reward, strict=True):
        by_source.setdefault(ds, []).append(r)
    stats["reward_mean_by_data_source"] = {k: sum(v) / len(v) for k, v in by_source.items()}
    keys = sorted({k for c in components for k in c})
    stats["reward_components_mean"] = (
        {k: sum(c.get(k, 0.0) for c in components) / n for k in keys} if n else {}
    )
    if n and bad / n > max_error_fraction:
        first = next(e[0] for e in row_errors if e)
        raise StageError(
            f"{bad}/{n} samples errored or timed out (> verify.max_error_fraction="
            f"{max_error_fraction}); first error: {first}. Fix the verifier or raise the limit"
        )
    scored = (
        table.append_column("reward", pa.array(reward, pa.float32()))
        .append_column("verifier", pa.array([describe(plan[d]) for d in sources], pa.string()))
        .append_column("extracted_answer", pa.array(answer, pa.string()))
        .append_column(
            "verify_error", pa.array(["; ".join(e) if e else None for e in row_errors], pa.string())
        )
        .append_column(
            "reward_components",
            pa.array(
                [[{"name": k, "value": v} for k, v in c.items()] for c in components], COMPONENTS
            ),
        )
    )
    extra_cols = [c for c in scored.column_names if c not in SCORED.names]
    return scored.select(SCORED.names + extra_cols), stats


class VerifyStage:
    """Warm verify worker (components/core/warm.py): scores iteration i's rollouts (or one shard
    of them, by prompt_id hash). Verifier plugins and the math verifier's imports are loaded once
    per process, not once per iteration."""

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        check_shard(shard, num_shards)
        self.cfg, self.shard, self.num_shards = cfg, shard, num_shards
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.task = "verify" + (f"-{shard_name(shard, num_shards)}" if num_shards > 1 else "")

    def check(self) -> None:
        """Every verifier spec resolves (plugins import) before any rollout is read."""
        from components.core.errors import Problems
        from components.verify.checks import check_verifier_specs

        problems = Problems()
        check_verifier_specs(self.cfg, problems)
        problems.raise_if_any("verify config")

    def needs(self, iteration: int) -> list[str]:
        return [self.layout.rollouts(iteration)]

    def _plan(self, iteration: int) -> tuple[OutputDir, dict[str, str]]:
        layout = self.layout
        uri = shard_dir(layout.scored(iteration), self.shard, self.num_shards)
        out = OutputDir(self.store, uri, "verify")
        threshold = self.cfg.data.curriculum.success_threshold
        config: Any = self.cfg.verify  # at the default threshold: the digest runs recorded before
        if threshold != CurriculumSection().success_threshold:
            config = {
                "verify": self.cfg.verify.model_dump(
                    mode="json", exclude=unused_keys(self.cfg)["verify"]
                ),
                "success": threshold,
            }
        return out, lineage(self.store, [layout.rollouts(iteration)], config, root=layout.root)

    def _stats_dir(self, iteration: int) -> OutputDir:
        uri = shard_dir(self.layout.prompt_stats(iteration), self.shard, self.num_shards)
        return OutputDir(self.store, uri, "verify")

    def up_to_date(self, iteration: int) -> bool:
        return self._current(iteration, *self._plan(iteration))

    def _current(self, iteration: int, out: OutputDir, inputs: dict[str, str]) -> bool:
        """The scored rollouts are current, and so are the prompt stats, or there are none at
        all (a run scored before prompt stats existed: skipping backfills them, see step)."""
        if not out.up_to_date(inputs):
            return False
        stats = self._stats_dir(iteration)
        return stats.up_to_date(inputs) or not any(
            f.endswith(SUCCESS) for f in self.store.list_files(self.layout.prompt_stats(iteration))
        )

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        cfg, store, layout = self.cfg, self.store, self.layout
        shard, num_shards = self.shard, self.num_shards
        out, inputs = self._plan(iteration)  # the lineage once: it reads the inputs' manifests
        if self._current(iteration, out, inputs) and not force:
            log.info(
                "scored rollouts of iteration %d (%s) already committed; skipping",
                iteration, out.uri,
            )  # fmt: skip
            if not self._stats_dir(iteration).up_to_date(inputs):
                self._backfill_stats(iteration, out, inputs)
            return {"skipped": True, "uri": out.uri}
        with timeline.span("read"):
            parts = committed_files(store, layout.rollouts(iteration), ".parquet")
            table = read_records(store, parts, "rollouts")
            if num_shards > 1:
                ids = table.column("prompt_id").to_pylist()
                table = table.filter(pa.array([shard_of(p, num_shards) == shard for p in ids]))
        with timeline.span("work"):
            scored, stats = score_table(
                table,
                cfg.verify.rewards,
                num_workers=cfg.verify.num_workers,
                timeout_s=cfg.verify.timeout_s,
                max_error_fraction=cfg.verify.max_error_fraction,
                overlong=cfg.verify.overlong_penalty,
                env_reward_weight=cfg.verify.env_reward_weight,
            )
            per_prompt = scored_prompt_stats(
                scored, iteration, cfg.data.curriculum.success_threshold
            )
            stats.update(group_shares(per_prompt))
        t0 = time.time()
        clear_other_layouts(store, layout.scored(iteration), num_shards)
        clear_other_layouts(store, layout.prompt_stats(iteration), num_shards)
        out.begin(force=True)
        stats_out = self._stats_dir(iteration)
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-verify-"))
        try:
            path = tmp / "part-00000.parquet"
            pq.write_table(
                scored.replace_schema_metadata(stamp(scored.schema, "scored").metadata),
                path,
                compression="zstd",
            )
            out.put_file(path, path.name)
            # Committed before the scored rollouts: whoever sees scored/ committed finds these.
            _commit_stats(stats_out, per_prompt, inputs, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        timeline.add("commit", t0, time.time())
        stats.update(
            iteration=iteration, shard=shard, num_shards=num_shards, timeline=timeline.record()
        )
        manifest = out.commit(stats, inputs)
        log.info(
            "verify %05d: reward mean %.4f over %d samples, %.0f verifications/s",
            iteration, stats["reward_mean"], stats["samples"], stats["verifications_per_s"],
        )  # fmt: skip
        return {"skipped": False, "uri": out.uri, "stats": manifest["stats"]}

    def _backfill_stats(self, iteration: int, out: OutputDir, inputs: dict[str, str]) -> None:
        """Prompt stats for scored rollouts committed without them (an older rlvr), from those
        rollouts: the scored output itself stays as it is."""
        cfg = self.cfg
        scored = read_records(
            self.store, committed_files(self.store, out.uri, ".parquet"), "scored"
        )
        per_prompt = scored_prompt_stats(scored, iteration, cfg.data.curriculum.success_threshold)
        clear_other_layouts(self.store, self.layout.prompt_stats(iteration), self.num_shards)
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-verify-"))
        try:
            _commit_stats(self._stats_dir(iteration), per_prompt, inputs, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("prompt stats of iteration %d derived from its scored rollouts", iteration)

    def close(self) -> None:
        pass


def _commit_stats(out: OutputDir, per_prompt: pa.Table, inputs: dict[str, str], tmp: Path) -> None:
    out.begin(force=True)
    pq.write_table(per_prompt, tmp / "prompts.parquet", compression="zstd")
    out.put_file(tmp / "prompts.parquet", "part-00000.parquet")
    out.commit({"prompts": per_prompt.num_rows, "schema": PROMPT_STATS.names}, inputs)


def run(
    cfg: RunConfig, iteration: int, *, force: bool = False, shard: int = 0, num_shards: int = 1
) -> dict[str, Any]:
    """Score the rollouts of one iteration (or one shard of them, by prompt_id hash), cold."""
    return run_once(VerifyStage(cfg, shard=shard, num_shards=num_shards), iteration, force=force)


def serve(
    cfg: RunConfig,
    segment: int,
    *,
    shard: int = 0,
    num_shards: int = 1,
    attempt: str | None = None,
    retried: bool = False,
) -> dict[str, Any]:
    """The verify worker of one segment."""
    stage = VerifyStage(cfg, shard=shard, num_shards=num_shards)
    results = serve_stage(
        stage, warm_segment(cfg, segment).iterations, cfg=cfg, attempt=attempt, retried=retried
    )
    return segment_summary(stage, segment, results)
