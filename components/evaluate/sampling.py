"""Sampling and scoring the eval sets of one checkpoint (one shard's prompts), and gathering the
shards' scored samples. Nothing here commits: the evaluate stage does.

Sampling seeds are the same for every checkpoint (:data:`EVAL_SEED_ITERATION`: common random
numbers), so differences between checkpoints are not blurred by sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.core.commit import OutputDir, committed_files, shard_of
from components.core.config import EvalSetConfig, RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout
from components.core.schemas import read_records
from components.core.store import Store, join
from components.generate.rollouts import (
    LoadedPolicy,
    PromptRow,
    RolloutSettings,
    dataset_uri,
    generate_rollouts,
    load_prompts,
    spec_from,
)
from components.model.backends import SamplingSpec
from components.model.engine import PolicyEngine
from components.verify.scoring import resolve_rewards, score_table

__all__ = ["EVAL_SEED_ITERATION", "gather", "sample_and_score"]

EVAL_SEED_ITERATION = -1  # the same sample seeds for every checkpoint


@dataclass
class _EvalSet:
    """One eval set's prompts (this shard's) and a sampling spec per kind of samples."""

    ev: EvalSetConfig
    prompts: list[PromptRow]
    specs: dict[str, SamplingSpec]


def _eval_sets(
    cfg: RunConfig, store: Store, layout: RunLayout, shard: int, num_shards: int
) -> list[_EvalSet]:
    """Every eval set's prompts, filtered (`data_sources`, `max_prompts`) and checked against
    the verifiers before anything is sampled."""
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
        sets.append(_EvalSet(ev, prompts, specs))
    return sets


def sample_and_score(
    cfg: RunConfig,
    store: Store,
    layout: RunLayout,
    c: int,
    shard: int,
    num_shards: int,
    engine: PolicyEngine,
) -> dict[str, dict[str, Any]]:
    """Sample and score every eval set (this shard's prompts) with checkpoint c, which the
    caller has loaded into `engine`: {set: {kind: scored table, kind_verify: verify stats}}."""
    sets = _eval_sets(cfg, store, layout, shard, num_shards)
    backend, tokenizer, _ = engine.ensure(store, layout.checkpoint(c))  # a reuse
    scratch_root = layout.eval_scratch(c, shard, num_shards)
    tools = None
    if cfg.generate.tools or cfg.generate.environment:  # evaluated as trained
        from components.generate.tools import load_tools

        tools = load_tools(cfg.generate.tools)
    out: dict[str, dict[str, Any]] = {}
    try:
        for s in sets:
            out[s.ev.name] = {}
            for kind, spec in s.specs.items():
                scratch = OutputDir(store, join(scratch_root, s.ev.name, kind), "evaluate")
                rollouts = _sample(
                    cfg,
                    layout,
                    c,
                    s,
                    kind,
                    spec,
                    scratch,
                    (backend, tokenizer),
                    num_shards=num_shards,
                    tools=tools,
                )
                scored, vstats = _score(cfg, rollouts)
                out[s.ev.name][kind] = scored
                out[s.ev.name][f"{kind}_verify"] = vstats
    finally:
        store.delete_tree(scratch_root)
        if tools is not None:
            tools.close()
    return out


def _sample(
    cfg: RunConfig,
    layout: RunLayout,
    c: int,
    s: _EvalSet,
    kind: str,
    spec: SamplingSpec,
    scratch: OutputDir,
    policy: tuple[Any, Any],
    *,
    num_shards: int,
    tools: Any,
) -> Any:
    """One kind of samples of one set, through the generate code into a scratch directory;
    returns them as a rollouts table."""
    backend, tokenizer = policy
    generate_rollouts(
        scratch,
        LoadedPolicy(backend, tokenizer, layout.checkpoint(c), c),
        s.prompts,
        spec,
        RolloutSettings.of(cfg.generate, tools),
        iteration=EVAL_SEED_ITERATION,
        desc=f"evaluate {c:05d} {s.ev.name}" + (" (greedy)" if kind != "samples" else ""),
        allow_empty=num_shards > 1,
        run_root=layout.root,
    )
    scratch.commit({})
    files = committed_files(scratch.store, scratch.uri, ".parquet")
    return read_records(scratch.store, files, "rollouts")


def _score(cfg: RunConfig, rollouts: Any) -> tuple[Any, dict[str, Any]]:
    v = cfg.verify
    return score_table(
        rollouts,
        v.rewards,
        num_workers=v.num_workers,
        timeout_s=v.timeout_s,
        max_error_fraction=v.max_error_fraction,
        overlong=v.overlong_penalty,
        env_reward_weight=v.env_reward_weight,
    )


def gather(cfg: RunConfig, store: Store, shards_uri: str) -> dict[str, dict[str, Any]]:
    """The scored samples of every eval set, from the committed sampling shards."""
    files = committed_files(store, shards_uri, ".parquet")
    results: dict[str, dict[str, Any]] = {}
    for ev in cfg.data.eval:
        results[ev.name] = {}
        for kind in ("samples", "greedy_samples") if ev.greedy else ("samples",):
            mine = [f for f in files if f.endswith(f"/{ev.name}/{kind}.parquet")]
            results[ev.name][kind] = read_records(store, mine, "scored")
    return results
