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
    RetiredError,
    clear_other_layouts,
    committed_files,
    content_digest,
    shard_dir,
    shard_of,
    with_input,
)
from components.core.config import RunConfig
from components.core.errors import StageError, UserError
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.schemas import read_records
from components.core.store import Store, StoreError, join
from components.core.warm import (
    Stage,
    Timeline,
    run_once,
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
from components.generate.engine import PolicyEngine
from components.generate.rollouts import dataset_uri, generate_rollouts, load_prompts, spec_from
from components.verify.scoring import resolve_rewards, score_table

log = logging.getLogger("rlvr.evaluate")
EVAL_SEED_ITERATION = -1  # the same sample seeds for every checkpoint


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
    committed = committed_indices(store, join(layout.root, "checkpoints"))
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


def _gather(cfg: RunConfig, store: Store, shards_uri: str) -> dict[str, dict[str, Any]]:
    """The scored samples of every eval set, from the committed sampling shards."""
    files = committed_files(store, shards_uri, ".parquet")
    results: dict[str, dict[str, Any]] = {}
    for ev in cfg.data.eval:
        results[ev.name] = {}
        for kind in ("samples", "greedy_samples") if ev.greedy else ("samples",):
            mine = [f for f in files if f.endswith(f"/{ev.name}/{kind}.parquet")]
            results[ev.name][kind] = read_records(store, mine, "scored")
    return results


def _sample_and_score(
    cfg: RunConfig,
    store: Store,
    layout: RunLayout,
    c: int,
    shard: int,
    num_shards: int,
    engine: PolicyEngine,
) -> dict[str, dict[str, Any]]:
    """Sample and score every eval set (this shard's prompts); nothing is committed here."""
    ckpt_uri = layout.checkpoint(c)
    sets = []
    for ev in cfg.data.eval:
        uri = dataset_uri(store, layout.eval_data(ev.name))
        prompts = load_prompts(store, uri, ev.name)
        if ev.data_sources is not None:
            prompts = [p for p in prompts if p.data_source in set(ev.data_sources)]
            if not prompts:
                raise StageError(
                    f"data.eval[{ev.name}].data_sources={ev.data_sources} matches no prompt of {uri}"
                )
        if ev.max_prompts is not None:
            prompts = prompts[: ev.max_prompts]
        resolve_rewards({p.data_source for p in prompts}, cfg.verify.rewards)  # before sampling
        prompts = [p for p in prompts if shard_of(p.prompt_id, num_shards) == shard]
        common = dict(top_p=ev.top_p, top_k=ev.top_k, max_new_tokens=ev.max_new_tokens)
        specs = {
            "samples": spec_from(
                cfg.generate, cfg.evaluate.seed, n=ev.n, temperature=ev.temperature, **common
            )
        }
        if ev.greedy:
            specs["greedy_samples"] = spec_from(
                cfg.generate, cfg.evaluate.seed, n=1, temperature=0.0, **common
            )
        sets.append((ev, prompts, specs))
    backend, tokenizer, _ = engine.ensure(store, ckpt_uri)  # loaded by the caller: a reuse
    scratch_root = join(layout.root, "eval_scratch", f"{c:05d}-{shard}-of-{num_shards}")
    out: dict[str, dict[str, Any]] = {}
    tools = None
    if cfg.generate.tools or cfg.generate.environment:  # evaluated as trained
        from components.generate.tools import load_tools

        tools = load_tools(cfg.generate.tools)
    try:
        for ev, prompts, specs in sets:
            out[ev.name] = {}
            for kind, spec in specs.items():
                scratch = OutputDir(store, join(scratch_root, ev.name, kind), "evaluate")
                generate_rollouts(
                    scratch,
                    backend,
                    tokenizer,
                    prompts,
                    spec,
                    iteration=EVAL_SEED_ITERATION,
                    checkpoint_uri=ckpt_uri,
                    max_prompt_tokens=cfg.generate.max_prompt_tokens,
                    rows_per_part=cfg.generate.rows_per_part,
                    policy_version=c,
                    desc=f"evaluate {c:05d} {ev.name}" + (" (greedy)" if kind != "samples" else ""),
                    allow_empty=num_shards > 1,
                    tools=tools,
                    max_turns=cfg.generate.max_turns,
                    max_response_tokens=cfg.generate.max_response_tokens,
                    environment=cfg.generate.environment,
                    run_root=layout.root,
                )
                scratch.commit({})
                files = committed_files(store, scratch.uri, ".parquet")
                scored, vstats = score_table(
                    read_records(store, files, "rollouts"),
                    cfg.verify.rewards,
                    num_workers=cfg.verify.num_workers,
                    timeout_s=cfg.verify.timeout_s,
                    max_error_fraction=cfg.verify.max_error_fraction,
                    overlong=cfg.verify.overlong_penalty,
                    env_reward_weight=cfg.verify.env_reward_weight,
                )
                out[ev.name][kind] = scored
                out[ev.name][f"{kind}_verify"] = vstats
    finally:
        store.delete_tree(scratch_root)
        if tools is not None:
            tools.close()
    return out


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
            return [lineages.eval_shards(layout, c), layout.checkpoint(c)]
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
        shards_uri = lineages.eval_shards(layout, c)
        out = OutputDir(store, shard_dir(shards_uri, shard, num_shards), "evaluate")
        if out.up_to_date(inputs) and not force:
            return {"skipped": True, "uri": out.uri}
        self._load(c, timeline)
        with timeline.span("work"):
            results = _sample_and_score(cfg, store, layout, c, shard, num_shards, self.engine)
        t0 = time.time()
        clear_other_layouts(store, shards_uri, num_shards)
        out.begin(force=True)
        for name, res in results.items():
            for kind in ("samples", "greedy_samples"):
                if kind in res:
                    write_table(out, res[kind], f"{name}/{kind}.parquet", tmp)
        timeline.add("commit", t0, time.time())
        stats = {"shard": shard, "num_shards": num_shards, "timeline": timeline.record()}
        out.commit(stats, inputs)
        return {"skipped": False, "uri": out.uri}

    def _evaluate(
        self, c: int, inputs: Lineage, tmp: Path, *, force: bool, timeline: Timeline
    ) -> dict[str, Any]:
        """The whole evaluation of checkpoint c: sampled here, or gathered from the shards."""
        cfg, store, layout = self.cfg, self.store, self.layout
        out = OutputDir(store, layout.evals(c), "evaluate")
        shards_uri = lineages.eval_shards(layout, c)
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
                results = _gather(cfg, store, shards_uri)
        else:
            self._load(c, timeline)
            with timeline.span("work"):
                results = _sample_and_score(cfg, store, layout, c, 0, 1, self.engine)
        suites = self._suites(c, timeline)
        t0 = time.time()
        top = write_outputs(cfg, store, layout, c, results, out, tmp, lm_eval=suites)
        timeline.add("commit", t0, time.time())
        stats = self._stats(c, top, suites)
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
        """Every lm-eval suite on checkpoint c ({suite name: summary}), with the policy the
        engine holds where it is a transformers model."""
        due = lineages.suites_due(self.cfg, c)
        if not due:
            return {}
        from components.evaluate import lm_eval_suite

        self._load(c, timeline)  # a reuse where sampling loaded it
        out = {}
        with timeline.span("lm_eval"):
            model, tokenizer = self._policy(c)
            try:
                for suite in due:
                    log.info(
                        "evaluate %s: lm-eval %s (%s)",
                        self.label or f"{c:05d}",
                        suite.name,
                        ", ".join(suite.lm_eval),
                    )
                    lm = lm_eval_suite.adapter(model, tokenizer, suite)
                    out[suite.name] = lm_eval_suite.run_suite(suite, lm)
            finally:
                del model, tokenizer
                if self.engine.backend is not None and not hasattr(self.engine.backend, "model"):
                    import torch

                    if torch.cuda.is_available():  # the copy loaded beside vLLM's engine
                        torch.cuda.empty_cache()
        return out

    def _policy(self, c: int) -> tuple[Any, Any]:
        """The model and tokenizer lm-eval's transformers adapter wraps: the engine's own
        (transformers backend; a LoRA policy as its PEFT model), else checkpoint c loaded once
        more with transformers, for this checkpoint's suites only (a vLLM engine's weights are
        out of lm-eval's reach; it then needs room beside vLLM's share of the GPU)."""
        backend, tokenizer = self.engine.backend, self.engine.tokenizer
        model = getattr(backend, "model", None)
        if model is not None and hasattr(model, "forward"):
            return model, tokenizer
        import torch
        from transformers import AutoTokenizer

        from components.core.adapter import is_adapter_dir
        from components.core.checkpoint import local_checkpoint, model_class
        from components.core.retention import reading

        uri = self.layout.checkpoint(c)
        with reading(self.store, uri, self.task):
            ckpt = local_checkpoint(self.store, uri)
            if is_adapter_dir(ckpt):  # refused by check() before any work
                raise UserError(
                    "lm-eval suites on a LoRA policy need generate.backend: transformers"
                )
            device = "cuda" if torch.cuda.is_available() else "cpu"
            # dtype auto: the checkpoint's own, the sampler's (the policy handoff's dtype)
            model = model_class(ckpt).from_pretrained(ckpt, dtype="auto").to(device).eval()
            return model, AutoTokenizer.from_pretrained(ckpt)

    def _load(self, c: int, timeline: Timeline) -> None:
        """Checkpoint c into the engine (in place when only the weights changed)."""
        load = self.engine.ensure(self.store, self.layout.checkpoint(c), self.task)[2]
        timeline.add("load", load.start, load.end)

    def close(self) -> None:
        self.engine.close()


def evaluate_external(cfg: RunConfig, checkpoint: str, *, force: bool = False) -> dict[str, Any]:
    """Evaluate any HF checkpoint directory or store URI, outside an RL run.

    It becomes checkpoint 00000 of a run named `eval-<digest of the URI>` in the same store (the
    checkpoint and eval sets are copied in, as for any run), so results are kept and an unchanged
    checkpoint is not evaluated twice.
    """
    import hashlib

    from components.core import run_setup

    cfg = cfg.model_copy(deep=True)
    cfg.evaluate.num_shards = 1  # one local process: no shard fan-out to gather
    cfg.model.base = checkpoint
    cfg.run.run_id = "eval-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:12]
    run_setup.run(cfg, force=True)  # re-import: a changed checkpoint gets a new content digest
    result = run_once(EvaluateStage(cfg, label=checkpoint), 0, force=force)
    return {**result, "root": RunLayout.of(cfg).root, "run_id": cfg.run_id}


def watch_run(
    cfg: RunConfig, *, poll_s: float = 30.0, timeout_s: float | None = None, force: bool = False
) -> dict[str, Any]:
    """Evaluate each committed checkpoint of a run as it lands (the local recurring evaluation).

    Returns once the run's last checkpoint (run.iterations) is evaluated, or after timeout_s.
    """
    from components.core.tracking import StageTracking

    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"num_shards": 1})})
    store, layout = store_for(cfg), RunLayout.of(cfg)
    start = time.monotonic()
    done: set[int] = set()
    stage = EvaluateStage(cfg)  # warm: each new checkpoint's weights go into the loaded policy
    tracking = StageTracking(stage)  # each evaluation to the trackers, as a worker's
    try:
        while True:
            for c in committed_indices(store, join(layout.root, "checkpoints")):
                if c not in done:
                    timeline = Timeline(stage.task, c)
                    try:
                        result = stage.step(c, force=force, timeline=timeline)
                    except RetiredError:  # retired by the run while this one loaded it
                        result = {"skipped": True, "retired": True}
                    if not result.get("retired"):
                        tracking.after_step(c, result, timeline)
                    done.add(c)
            if cfg.run.iterations in done:
                return {"evaluated": sorted(done)}
            if timeout_s is not None and time.monotonic() - start >= timeout_s:
                return {"evaluated": sorted(done), "timed_out": True}
            log.info(
                "watching %s: evaluated %s; next poll in %.0f s", layout.root, sorted(done), poll_s
            )
            time.sleep(poll_s)
    finally:
        tracking.close()
        stage.close()


#: `rlvr stage evaluate` (checkpoint `iteration`, or one shard of its samples, cold) and the
#: worker task.
run, serve = EvaluateStage.run, EvaluateStage.serve
