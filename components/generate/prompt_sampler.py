"""Which train-set rows iteration i samples: `data.sampler` (uniform, or curriculum by pass rate).

`uniform` walks a seeded permutation epoch by epoch (:func:`select_indices`). `curriculum` folds
the per-prompt stats verify committed for iterations up to ``i - 1 - train.max_staleness`` and
draws from them (components/generate/curriculum.py). A warm worker keeps the folded history and
adds one iteration's stats per step; a cold start (or a rerun of an earlier iteration) folds
from iteration 0. Either way the rows depend only on the run seed, i and committed stats.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from components.core.commit import committed_files, committed_parts, content_digest, read_manifest
from components.core.config import RunConfig
from components.core.errors import UserError
from components.core.layout import RunLayout
from components.core.lineages import sampler_inputs, stats_horizon
from components.core.prompt_stats import PROMPT_STATS, row_of, scored_prompt_stats
from components.core.schemas import SchemaError, read_parquet, read_records
from components.core.store import Store
from components.core.warm import is_committed
from components.generate.curriculum import History, curriculum_indices, group_keys

__all__ = ["PromptSampler", "read_prompt_stats", "select_indices"]


def select_indices(num_rows: int, count: int, seed: int, iteration: int) -> list[int]:
    """Iteration i's prompts: a slice of a seeded permutation of the train set, reshuffled every
    epoch. An epoch holds floor(num_rows / count) iterations, so within an epoch no prompt
    repeats; the remainder waits for the next shuffle."""
    if count > num_rows:
        raise UserError(
            f"data.prompts_per_iteration={count} exceeds the {num_rows} rows of the train set; "
            "lower it or use a larger train set"
        )
    per_epoch = num_rows // count
    epoch, slot = divmod(iteration, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(num_rows)
    return [int(x) for x in perm[slot * count : (slot + 1) * count]]


class PromptSampler:
    """The rows of each iteration, for one generate worker (every shard draws the same rows)."""

    def __init__(self, cfg: RunConfig, store: Store, layout: RunLayout) -> None:
        self.cfg, self.store, self.layout = cfg, store, layout
        self._history: History | None = None
        self._folded: dict[int, str] = {}  # the newest iteration folded in -> its digest
        self._groups: tuple[Any, np.ndarray] | None = None

    @property
    def curriculum(self) -> bool:
        return self.cfg.data.sampler == "curriculum"

    def needs(self, iteration: int) -> list[str]:
        """Directories that must be committed before iteration `iteration` can draw, which are
        also its inputs (components/core/lineages.py, `sampler_inputs`)."""
        return sampler_inputs(self.cfg, self.layout, iteration)

    def indices(self, table, iteration: int) -> tuple[list[int], dict[str, float]]:
        """Iteration `iteration`'s rows of the train `table`, and the sampler's figures."""
        cfg = self.cfg
        count = cfg.data.prompts_per_iteration
        if not self.curriculum:
            return select_indices(table.num_rows, count, cfg.run.seed, iteration), {}
        history = self._fold(table.num_rows, stats_horizon(cfg, iteration))
        return curriculum_indices(
            history, self._group_keys(table), count, cfg.run.seed, iteration, cfg.data.curriculum
        )

    def _group_keys(self, table) -> np.ndarray:
        # The table itself is held (not its id, which a new table could reuse once it is freed).
        if self._groups is None or self._groups[0] is not table:
            self._groups = (table, group_keys(table, self.cfg.data.curriculum.group_by))
        return self._groups[1]

    def _fold(self, num_rows: int, last: int) -> History:
        """History through iteration `last`, reusing what this worker folded while the scored
        rollouts of the newest iteration folded in are unchanged in the store (a rerun of its
        verify refolds from 0; one of an older iteration during a live segment is not seen,
        the next segment's plan redoes everything downstream of it)."""
        h = self._history
        reusable = (
            h is not None
            and h.num_rows == num_rows
            and h.next_iteration <= last + 1
            and all(
                content_digest(self.store, self.layout.scored(i)) == digest
                for i, digest in self._folded.items()
            )
        )
        if not reusable:
            h, self._folded = History(num_rows), {}
        assert h is not None
        retire_after = self.cfg.data.curriculum.retire_after
        for i in range(h.next_iteration, last + 1):
            h.fold(self._stats(i), i, retire_after, self._skipped(i))
        if last >= 0 and last not in self._folded:
            self._folded = {last: content_digest(self.store, self.layout.scored(last))}
        self._history = h
        return h

    def _stats(self, i: int) -> pa.Table:
        """Iteration i's prompt stats as verify committed them, or derived from its scored
        rollouts where it did not (a run scored before prompt stats existed)."""
        store, layout = self.store, self.layout
        if is_committed(store, layout.prompt_stats(i)):
            return read_prompt_stats(store, layout.prompt_stats(i))
        table = read_records(store, committed_files(store, layout.scored(i), ".parquet"), "scored")
        return scored_prompt_stats(table, i, self.cfg.data.curriculum.success_threshold)

    def _skipped(self, i: int) -> list[int]:
        """Rows generate skipped in iteration i (every shard's manifest lists its own)."""
        rows = []
        for part in committed_parts(self.store, self.layout.rollouts(i)):
            ids = read_manifest(self.store, part)["stats"].get("skipped_prompt_ids") or []
            rows += [row_of(pid) for pid in ids]
        return rows


def read_prompt_stats(store: Store, uri: str) -> pa.Table:
    """One iteration's committed prompt stats (all shards), checked against the contract."""
    tables = []
    for f in committed_files(store, uri, ".parquet"):
        t = read_parquet(store, f)
        missing = [c for c in PROMPT_STATS.names if c not in t.column_names]
        if missing:
            raise SchemaError(
                f"{f}: prompt stats lack columns {missing} (docs/contracts.md, 'Prompt stats'); "
                "rerun verify of that iteration with --force"
            )
        tables.append(t.select(PROMPT_STATS.names).cast(PROMPT_STATS))
    return pa.concat_tables(tables) if tables else PROMPT_STATS.empty_table()
