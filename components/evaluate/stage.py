"""Evaluate stage: checkpoint c + held-out sets -> samples, pass@k metrics, plots, report.

    python -m components.evaluate CONFIG --run-id ID --iteration C [--force]
    rlvr stage evaluate CONFIG --run-id ID --iteration C

Here the "iteration" is the checkpoint index (00000 is the base). For each `data.eval` set it
samples n responses per prompt with the generate code, scores them with the verify code and
writes, under `evals/<c>/`:

    <set>/samples.parquet     scored rollouts (contract: scored)
    <set>/metrics.json        checkpoint, n, overall, by_data_source
    metrics.json              the first set's metrics at top level, every set under "sets"
    pass_at_k.png, history.png, report.md

Sampling seeds are the same for every checkpoint (common random numbers), so differences between
checkpoints are not blurred by sampling noise.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from components.core import lineages
from components.core.commit import (
    Lineage,
    OutputDir,
    clear_other_layouts,
    content_digest,
    shard_dir,
    with_input,
)
from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.store import StoreError
from components.core.warm import (
    Stage,
    Timeline,
    segment_eval_checkpoints,
)
from components.core.warm import segment as warm_segment
from components.evaluate.metrics import (
    default_ks,
)
from components.evaluate.results import (
    suite_record,
    write_outputs,
    write_table,
)
from components.evaluate.sampling import gather, sample_and_score
from components.model import device_turn
from components.model.engine import PolicyEngine

log = logging.getLogger("rlvr.evaluate")


def validate_eval_sets(cfg: RunConfig) -> None:
    if not cfg.data.eval and not cfg.data.lm_eval:
        raise StageError(
            "data.eval is empty: add at least one eval set ({name, path, n}, or {name, "
            "lm_eval: [tasks]} for standard benchmarks)"
        )
    for ev in cfg.data.eval:
        try:
            default_ks(ev.n, [*cfg.evaluate.ks, *ev.ks])
        except ValueError as e:
            raise StageError(f"data.eval[{ev.name}] (n={ev.n}) / evaluate.ks / ks: {e}") from None


def resolve_checkpoint(cfg: RunConfig, spec: str | int) -> int:
    """A checkpoint index from "latest" (the newest committed checkpoint of the run) or a number."""
    store, layout = store_for(cfg), RunLayout.of(cfg)
    committed = committed_indices(store, layout.checkpoints_dir)
    if str(spec) == "latest":
        if not committed:
            raise StageError(f"run {layout.root} has no committed checkpoint yet")
        return committed[-1]
    try:
        c = int(spec)
    except ValueError:
        raise StageError(f"checkpoint must be 'latest' or an index, got {spec!r}") from None
    if c not in committed:
        raise StageError(f"checkpoint {c:05d} of {layout.root} is not committed; have {committed}")
    return c


class EvaluateStage(Stage):
    """Warm evaluate worker (components/core/warm.py): the policy stays loaded and each step takes
    checkpoint c's weights in place.

    With `evaluate.num_shards` S > 1 the work is split: a stage with `shard=i, num_shards=S`
    samples and scores shard i's prompts into `eval_shards/<c>/shard-i-of-S/`, and the plain stage
    (no shard) then computes the metrics from all S shards: identical to an unsharded evaluation
    whenever the samples are (docs/contracts.md, "Batch and shard invariance").
    """

    name = "evaluate"

    def __init__(
        self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1, label: str | None = None
    ) -> None:
        super().__init__(cfg, shard=shard, num_shards=num_shards)
        # what its log lines call the checkpoint: its index, or (`rlvr eval --checkpoint`) the
        # checkpoint evaluated, which is index 0 of a run of its own that the user never named
        self.label = label
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.engine = PolicyEngine(cfg.generate, cfg.evaluate.seed)

    def task_name(self) -> str:
        """With sharded evaluation the unsharded worker gathers the shards: `evaluate-gather`."""
        if self.num_shards == 1 and self.cfg.evaluate.num_shards > 1:
            return "evaluate-gather"
        return super().task_name()

    def iterations(self, index: int) -> list[int]:
        """The checkpoints of segment `index` to evaluate (every `evaluate.every`-th)."""
        return segment_eval_checkpoints(self.cfg, warm_segment(self.cfg, index))

    def check(self) -> None:
        """Eval sets and ks, and the verifiers that score the samples, before anything loads."""
        from components.core.errors import Problems
        from components.verify.checks import check_verifier_specs

        validate_eval_sets(self.cfg)
        problems = Problems()
        check_verifier_specs(self.cfg, problems)
        if self.cfg.data.lm_eval:
            from components.evaluate.lm_eval_suite import check_suites

            check_suites(self.cfg, problems)
            if self.cfg.model.lora is not None and self.cfg.generate.backend == "vllm":
                problems.error(
                    "data.eval (lm-eval suites)",
                    "a LoRA policy sampled by vLLM cannot be handed to lm-eval's adapter",
                    "evaluate with generate.backend: transformers, or leave out the suites",
                )
        problems.raise_if_any("evaluate config")

    def needs(self, c: int) -> list[str]:
        layout = self.layout
        if self.num_shards == 1 and self.cfg.evaluate.num_shards > 1:
            return [layout.eval_shards(c), layout.checkpoint(c)]
        return [layout.checkpoint(c), *(layout.eval_data(e.name) for e in self.cfg.data.eval)]

    def up_to_date(self, c: int) -> bool:
        """Whether checkpoint c's evaluation (this shard's part of it) is committed and current;
        a retired checkpoint counts as done, there being nothing left to evaluate."""
        return lineages.evaluate_current(
            self.cfg, self.store, self.layout, c, self.shard, self.num_shards
        )

    def step(self, c: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        """Evaluate checkpoint `c` on every eval set (or sample this shard's part of it)."""
        if lineages.retired(self.store, self.layout, c):
            log.warning(
                "checkpoint %05d was retired by the run's retention policy before it could be "
                "evaluated with these settings; skipping it (keep more: retention.keep_last, "
                "retention.milestone_every)",
                c,
            )
            return {"skipped": True, "retired": True, "uri": self.layout.evals(c)}
        validate_eval_sets(self.cfg)
        inputs = lineages.evaluate(self.cfg, self.layout, c).lineage(self.store, self.layout.root)
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-eval-"))
        try:
            if self.num_shards > 1:
                return self._sample_shard(c, inputs, tmp, force=force, timeline=timeline)
            return self._evaluate(c, inputs, tmp, force=force, timeline=timeline)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _sample_shard(
        self, c: int, inputs: Lineage, tmp: Path, *, force: bool, timeline: Timeline
    ) -> dict[str, Any]:
        """A sampling shard: its prompts' samples, scored, committed for the gather."""
        cfg, store, layout, shard, num_shards = (
            self.cfg,
            self.store,
            self.layout,
            self.shard,
            self.num_shards,
        )
        shards_uri = layout.eval_shards(c)
        out = OutputDir(store, shard_dir(shards_uri, shard, num_shards), "evaluate")
        if out.up_to_date(inputs) and not force:
            return {"skipped": True, "uri": out.uri}
        self._load(c, timeline)
        with timeline.span("work"):
            results = sample_and_score(cfg, store, layout, c, shard, num_shards, self.engine)
        t0 = time.time()
        clear_other_layouts(store, shards_uri, num_shards)
        out.begin(force=True)
        for name, res in results.items():
            for kind in ("samples", "greedy_samples"):
                if kind in res:
                    write_table(out, res[kind], f"{name}/{kind}.parquet", tmp)
        timeline.add("commit", t0, time.time())
        timeline.carve("turn", device_turn.take_waits())
        stats = {"shard": shard, "num_shards": num_shards, "timeline": timeline.record()}
        out.commit(stats, inputs)
        return {"skipped": False, "uri": out.uri}

    def _evaluate(
        self, c: int, inputs: Lineage, tmp: Path, *, force: bool, timeline: Timeline
    ) -> dict[str, Any]:
        """The whole evaluation of checkpoint c: sampled here, or gathered from the shards."""
        cfg, store, layout = self.cfg, self.store, self.layout
        out = OutputDir(store, layout.evals(c), "evaluate")
        shards_uri = layout.eval_shards(c)
        sharded = cfg.evaluate.num_shards > 1
        if sharded:
            inputs = with_input(inputs, "shards", content_digest(store, shards_uri))
        inputs = lineages.with_suites(cfg, c, inputs)
        if out.up_to_date(inputs) and not force:
            log.info(
                "evaluation of checkpoint %s already committed; skipping", self.label or f"{c:05d}"
            )
            return {"skipped": True, "uri": out.uri}
        if sharded:
            with timeline.span("read"):
                results = gather(cfg, store, shards_uri)
        else:
            self._load(c, timeline)
            with timeline.span("work"):
                results = sample_and_score(cfg, store, layout, c, 0, 1, self.engine)
        suites = self._suites(c, timeline)
        t0 = time.time()
        top = write_outputs(cfg, store, layout, c, results, out, tmp, lm_eval=suites)
        timeline.add("commit", t0, time.time())
        stats = self._stats(c, top, suites)
        timeline.carve("turn", device_turn.take_waits())
        stats["timeline"] = timeline.record()
        out.commit(stats, inputs)
        self._sweep()
        return {"skipped": False, "uri": out.uri, "stats": stats, "metrics": top}

    def _stats(self, c: int, top: dict[str, Any], suites: dict[str, Any]) -> dict[str, Any]:
        """The evaluation's manifest stats, logged as they are recorded."""
        stats: dict[str, Any] = {"checkpoint_index": c}
        label = self.label or f"{c:05d}"
        if self.cfg.data.eval:
            stats |= {"pass@1": top["overall"]["pass@1"], "n": top["n"]}
            log.info("evaluate %s: pass@1 %.4f", label, top["overall"]["pass@1"])
        if suites:
            stats["lm_eval"] = suite_record(suites)
            for task, res in top["lm_eval"].items():
                shown = ", ".join(
                    f"{k} {v:.4f}" for k, v in res["metrics"].items() if not k.endswith("_stderr")
                )
                log.info("evaluate %s: %s %s", label, task, shown)
        return stats

    def _sweep(self) -> None:
        """Apply the retention policy while serving a run: evaluation is the last reader of
        most checkpoints (it never fails the step)."""
        from components.core.retention import sweep

        if not self.serving:
            return
        try:
            sweep(self.cfg, self.task)
        except (StoreError, OSError) as e:
            log.warning("retention sweep failed (%s); nothing was deleted that a stage needs", e)

    def _suites(self, c: int, timeline: Timeline) -> dict[str, Any]:
        """Every lm-eval suite due on checkpoint c ({suite name: summary})."""
        due = lineages.suites_due(self.cfg, c)
        if not due:
            return {}
        from components.evaluate.lm_eval_suite import run_on_policy

        self._load(c, timeline)  # a reuse where sampling loaded it
        with timeline.span("lm_eval"):
            uri, label = self.layout.checkpoint(c), self.label or f"{c:05d}"
            return run_on_policy(due, self.engine, self.store, uri, self.task, label)

    def _load(self, c: int, timeline: Timeline) -> None:
        """Checkpoint c into the engine (in place when only the weights changed)."""
        load = self.engine.ensure(self.store, self.layout.checkpoint(c), self.task)[2]
        timeline.add("load", load.start, load.end)

    def close(self) -> None:
        self.engine.close()


#: `rlvr stage evaluate` (checkpoint `iteration`, or one shard of its samples, cold) and the
#: worker task.
run, serve = EvaluateStage.run, EvaluateStage.serve
