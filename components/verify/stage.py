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

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.core import lineages
from components.core.commit import (
    Lineage,
    OutputDir,
    clear_other_layouts,
    committed_files,
    shard_of,
)
from components.core.config import RunConfig
from components.core.layout import RunLayout, store_for
from components.core.prompt_stats import PROMPT_STATS, group_shares, scored_prompt_stats
from components.core.schemas import read_records, stamp
from components.core.timing import Timeline
from components.core.warm import Stage
from components.verify.scoring import score_table

log = logging.getLogger("rlvr.verify")


class VerifyStage(Stage):
    """Warm verify worker (components/core/warm.py): scores iteration i's rollouts (or one shard
    of them, by prompt_id hash). Verifier plugins and the math verifier's imports are loaded once
    per process, not once per iteration."""

    name = "verify"

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        super().__init__(cfg, shard=shard, num_shards=num_shards)
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)

    def check(self) -> None:
        """Every verifier spec resolves (plugins import) before any rollout is read."""
        from components.core.errors import Problems
        from components.verify.checks import check_verifier_specs

        problems = Problems()
        check_verifier_specs(self.cfg, problems)
        problems.raise_if_any("verify config")

    def needs(self, iteration: int) -> list[str]:
        return [self.layout.rollouts(iteration)]

    def _plan(self, iteration: int) -> tuple[OutputDir, Lineage]:
        o = lineages.verify(self.cfg, self.layout, iteration, self.shard, self.num_shards)
        return o.dir(self.store), o.lineage(self.store, self.layout.root)

    def _stats_dir(self, iteration: int) -> OutputDir:
        return lineages.prompt_stats_dir(
            self.store, self.layout, iteration, self.shard, self.num_shards
        )

    def up_to_date(self, iteration: int) -> bool:
        return self._current(iteration, *self._plan(iteration))

    def _current(self, iteration: int, out: OutputDir, inputs: Lineage) -> bool:
        return lineages.verify_current(
            self.store, self.layout, iteration, self.shard, self.num_shards, out, inputs
        )

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        cfg, store, layout = self.cfg, self.store, self.layout
        shard, num_shards = self.shard, self.num_shards
        out, inputs = self._plan(iteration)  # the lineage once: it reads the inputs' manifests
        if self._current(iteration, out, inputs) and not force:
            log.info(
                "scored rollouts of iteration %d (%s) already committed; skipping",
                iteration,
                out.uri,
            )
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
            iteration,
            stats["reward_mean"],
            stats["samples"],
            stats["verifications_per_s"],
        )
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


#: `rlvr stage verify` (one iteration, or one shard of it by prompt_id hash, cold) and the
#: worker task.
run, serve = VerifyStage.run, VerifyStage.serve
