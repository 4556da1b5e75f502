"""What each stage's outputs are computed from, as data: one description for stages and planner.

A stage skips a step, and the planner (pipelines/plan.py) keeps a committed output, only when
the output was committed with the lineage described here: the digests of its input directories
and of the config it depends on (components/core/commit.py, `lineage`). Each function below is a
function of the config and the run's layout alone; reading the digests takes the store's
manifests, never a model, a tokenizer or a stage. So the planner decides what is current
without building generate, verify or train, and the stages and the planner cannot disagree.

Which keys of a section enter is declared on each config field (its lineage role,
components/core/config_fields.py) and read by `lineage_dump` alone. The digests are pinned
(tests/core/test_lineages.py): a change to them recomputes finished runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.core.commit import (
    SUCCESS,
    Lineage,
    OutputDir,
    config_digest,
    content_digest,
    is_retired,
    lineage,
    read_manifest,
    shard_dir,
    with_input,
)
from components.core.config import CurriculumSection, RunConfig
from components.core.config_fields import lineage_dump
from components.core.layout import RunLayout
from components.core.store import Store, StoreError

__all__ = [
    "Output",
    "current",
    "evaluate_current",
    "generate",
    "sampler_config",
    "sampler_inputs",
    "stats_horizon",
    "suites_due",
    "train",
    "verify",
    "verify_current",
]


def policy_version(cfg: RunConfig, iteration: int) -> int:
    """The checkpoint that samples iteration i: i - train.max_staleness (never before 0)."""
    return max(0, iteration - cfg.train.max_staleness)


@dataclass(frozen=True)
class Output:
    """One step's output directory and what it must have been computed from to be current."""

    stage: str
    uri: str
    inputs: tuple[str, ...]
    config: Any

    def dir(self, store: Store) -> OutputDir:
        return OutputDir(store, self.uri, self.stage)

    def lineage(self, store: Store, root: str) -> Lineage:
        """The input digests (reads the inputs' manifests; StoreError when one is missing)."""
        return lineage(store, list(self.inputs), self.config, root)


# --- generate ---


def stats_horizon(cfg: RunConfig, iteration: int) -> int:
    """The last iteration whose prompt stats iteration `iteration` may use (-1: none): the one
    scored before checkpoint ``iteration - max_staleness`` was trained, so generate, which waits
    for that checkpoint, never waits longer for the curriculum."""
    return iteration - 1 - cfg.train.max_staleness


def sampler_inputs(cfg: RunConfig, layout: RunLayout, iteration: int) -> list[str]:
    """What the prompt sampler of iteration `iteration` reads besides the train set: with the
    curriculum, the newest scored rollouts it folds (their prompt stats are committed before
    them)."""
    last = stats_horizon(cfg, iteration)
    return [layout.scored(last)] if cfg.data.sampler == "curriculum" and last >= 0 else []


def sampler_config(cfg: RunConfig) -> dict[str, Any]:
    """What of the config the draw depends on beyond the uniform sampler's (empty for it: the
    uniform draw depends on the seed and prompts_per_iteration alone)."""
    if cfg.data.sampler != "curriculum":
        return {}
    return {
        "sampler": "curriculum",
        "curriculum": lineage_dump(cfg.data.curriculum, cfg),
        "max_staleness": cfg.train.max_staleness,
    }


def generate(
    cfg: RunConfig, layout: RunLayout, iteration: int, shard: int = 0, num_shards: int = 1
) -> Output:
    """Iteration i's rollouts (one shard's): the policy, the train set, the sampler's inputs."""
    version = policy_version(cfg, iteration)
    config: dict[str, Any] = {
        "generate": lineage_dump(cfg.generate, cfg),
        "prompts_per_iteration": cfg.data.prompts_per_iteration,
        "seed": cfg.run.seed,
        "policy_version": version,
    }
    if sampler := sampler_config(cfg):
        config["sampler"] = sampler
    inputs = (
        layout.checkpoint(version),
        layout.train_data,
        *sampler_inputs(cfg, layout, iteration),
    )
    uri = shard_dir(layout.rollouts(iteration), shard, num_shards)
    return Output("generate", uri, inputs, config)


# --- verify ---


def verify(
    cfg: RunConfig, layout: RunLayout, iteration: int, shard: int = 0, num_shards: int = 1
) -> Output:
    """Iteration i's scored rollouts (one shard's). At the default success threshold of the
    prompt stats the config is the verify section itself, every key (its digest is of
    pydantic's JSON of the section); another threshold joins the section's lineage dump."""
    threshold = cfg.data.curriculum.success_threshold
    config: Any = cfg.verify
    if threshold != CurriculumSection().success_threshold:
        config = {"verify": lineage_dump(cfg.verify, cfg), "success": threshold}
    uri = shard_dir(layout.scored(iteration), shard, num_shards)
    return Output("verify", uri, (layout.rollouts(iteration),), config)


def prompt_stats_dir(
    store: Store, layout: RunLayout, iteration: int, shard: int, num_shards: int
) -> OutputDir:
    """Where verify commits the per-prompt stats, with the scored rollouts' lineage."""
    return OutputDir(store, shard_dir(layout.prompt_stats(iteration), shard, num_shards), "verify")


def verify_current(
    store: Store,
    layout: RunLayout,
    iteration: int,
    shard: int,
    num_shards: int,
    out: OutputDir,
    inputs: Lineage,
) -> bool:
    """The scored rollouts are current, and so are the prompt stats, or there are none at all
    (a run scored before prompt stats existed: verify's skip backfills them)."""
    if not out.up_to_date(inputs):
        return False
    stats = prompt_stats_dir(store, layout, iteration, shard, num_shards)
    return stats.up_to_date(inputs) or not any(
        f.endswith(SUCCESS) for f in store.list_files(layout.prompt_stats(iteration))
    )


# --- train ---


def train(cfg: RunConfig, layout: RunLayout, iteration: int) -> Output:
    """Checkpoint i + 1: iteration i's scored rollouts, checkpoint i and the train settings
    that change the update (LoRA's where it trains an adapter)."""
    settings: dict[str, Any] = {
        "train": lineage_dump(cfg.train, cfg),
        "iterations": cfg.run.iterations,
        "seed": cfg.run.seed,
    }
    if cfg.model.lora is not None:
        settings["lora"] = lineage_dump(cfg.model.lora, cfg)
    inputs = (layout.scored(iteration), layout.checkpoint(iteration))
    return Output("train", layout.checkpoint(iteration + 1), inputs, settings)


# --- evaluate ---


def suites_due(cfg: RunConfig, c: int) -> list[Any]:
    """The lm-eval suites that run on checkpoint c (`every`)."""
    return [s for s in cfg.data.lm_eval if s.due(c, cfg.evaluate.every, cfg.run.iterations)]


def evaluate(cfg: RunConfig, layout: RunLayout, c: int) -> Output:
    """Checkpoint c's evaluation on the eval sets (the output of the unsharded evaluation; a
    shard's part has the same lineage)."""
    config = {
        # not the source path: the run's copy of each set is an input by content
        "eval": [lineage_dump(e, cfg) for e in cfg.data.eval],
        "evaluate": lineage_dump(cfg.evaluate, cfg),
        # sampled and scored with evaluate's own layout: not generate's or verify's
        "generate": lineage_dump(cfg.generate, cfg, own=False),
        "verify": lineage_dump(cfg.verify, cfg, own=False),
    }
    inputs = (layout.checkpoint(c), *(layout.eval_data(e.name) for e in cfg.data.eval))
    return Output("evaluate", layout.evals(c), inputs, config)


def with_suites(cfg: RunConfig, c: int, inputs: Lineage) -> Lineage:
    """The inputs of checkpoint c's whole evaluation: with the settings and task files of the
    lm-eval suites due on it, where there are any (a run without them keeps its lineage)."""
    due = suites_due(cfg, c)
    if not due:
        return inputs
    from components.core.task_files import suite_inputs

    return with_input(inputs, "lm_eval", config_digest([suite_inputs(s) for s in due]))


def retired(store: Store, layout: RunLayout, c: int) -> bool:
    """Checkpoint c's files were deleted by the retention policy (components/core/
    retention.py): it cannot be evaluated (again); what was evaluated of it stays."""
    try:
        return is_retired(read_manifest(store, layout.checkpoint(c)))
    except StoreError:
        return False


def evaluate_current(
    cfg: RunConfig, store: Store, layout: RunLayout, c: int, shard: int = 0, num_shards: int = 1
) -> bool:
    """Whether checkpoint c's evaluation (this shard's part of it) is committed and current; a
    retired checkpoint counts as done, there being nothing left to evaluate. StoreError when an
    input is missing."""
    if retired(store, layout, c):
        return True
    inputs = evaluate(cfg, layout, c).lineage(store, layout.root)
    if num_shards > 1:
        uri = shard_dir(layout.eval_shards(c), shard, num_shards)
        return OutputDir(store, uri, "evaluate").up_to_date(inputs)
    if cfg.evaluate.num_shards > 1:
        try:
            inputs = with_input(inputs, "shards", content_digest(store, layout.eval_shards(c)))
        except StoreError:
            return False
    inputs = with_suites(cfg, c, inputs)
    return OutputDir(store, layout.evals(c), "evaluate").up_to_date(inputs)


# --- the planner's question ---


def current(
    cfg: RunConfig,
    store: Store,
    layout: RunLayout,
    stage: str,
    iteration: int,
    shard: int = 0,
    num_shards: int = 1,
) -> bool:
    """Whether `stage`'s output of `iteration` (one shard's) is committed with the lineage it
    would have now. StoreError when one of its inputs is missing."""
    if stage == "verify":
        o = verify(cfg, layout, iteration, shard, num_shards)
        inputs = o.lineage(store, layout.root)
        return verify_current(store, layout, iteration, shard, num_shards, o.dir(store), inputs)
    if stage == "generate":
        o = generate(cfg, layout, iteration, shard, num_shards)
    elif stage == "train":
        o = train(cfg, layout, iteration)
    else:
        raise ValueError(f"no iteration output for stage {stage!r}")
    return o.dir(store).up_to_date(o.lineage(store, layout.root))
