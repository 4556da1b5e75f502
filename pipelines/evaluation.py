"""The KFP evaluation pipeline and the single-stage pipeline.

- `rlvr-eval`: evaluate one checkpoint of a run: an index, or "latest", resolved when the
  pipeline runs, so a recurring run (`rlvr schedule`) always evaluates whatever is newest. An
  evaluation that already exists for that checkpoint is not redone (unless `force`).
- `rlvr-stage`: rerun one named stage of one iteration on the cluster
  (`rlvr submit CONFIG --stage verify --iteration 3`).
"""

from collections.abc import Callable

from kfp import dsl

from components.core.config import RunConfig, code_stages
from components.core.errors import UserError
from components.core.stages import STAGES, STEPS
from pipelines.ops import make_ops
from pipelines.placement import place, submits_job


def _ops(cfg: RunConfig):
    return make_ops({s: cfg.cluster.image(s) for s in STEPS})


def _apply(task: dsl.PipelineTask, stage: str, cfg: RunConfig, for_cluster: bool):
    if not for_cluster:
        return task.set_caching_options(False)
    return place(
        task,
        stage,
        cfg.cluster,
        runs_code=stage in code_stages(cfg),
        submits_job=submits_job(cfg, stage),
    )


def build_eval_pipeline(cfg: RunConfig, *, for_cluster: bool = True) -> Callable:
    ops = _ops(cfg)

    @dsl.pipeline(name="rlvr-eval", description="RLVR: evaluate a checkpoint (or the latest)")
    def rlvr_eval(
        config_json: str = cfg.to_json(),
        run_id: str = cfg.run_id,
        checkpoint: str = "latest",
        force: bool = False,
        store: str = "",
        eval_sets: str = "",
    ) -> None:
        params = dict(config_json=config_json, run_id=run_id, store=store, eval_sets=eval_sets)
        resolved = _apply(ops.resolve(**params, checkpoint=checkpoint), "init", cfg, for_cluster)
        resolved.set_display_name("resolve-checkpoint")
        # The shards take the resolved index from the resolve task, so all of them and the gather
        # evaluate the same checkpoint even if a newer one lands meanwhile. (kfp.local 2.17 feeds
        # an upstream output into a ParallelFor body as the loop item: run sharded evaluation
        # pipelines on a cluster, or use `rlvr eval` / `rlvr stage evaluate --shard` locally.)
        common = dict(**params, checkpoint=resolved.output, force=force)
        after = resolved
        shards = cfg.evaluate.num_shards
        if shards > 1:  # sample+score shards in parallel, then gather the metrics
            with dsl.ParallelFor(items=list(range(shards)), parallelism=shards) as shard:
                part = ops.evaluate(**common, shard=shard, num_shards=shards)
                _apply(part, "evaluate", cfg, for_cluster).after(resolved)
                part.set_display_name("evaluate-shard")
            after = part
        ev = ops.evaluate(**common)
        _apply(ev, "evaluate", cfg, for_cluster).after(after).set_display_name("evaluate")

    return rlvr_eval


def build_stage_pipeline(
    cfg: RunConfig, stage: str, iteration: int, *, for_cluster: bool = True
) -> Callable:
    if stage not in STEPS:
        raise UserError(f"unknown stage {stage!r}; valid: init, {', '.join(STAGES)}")
    ops = _ops(cfg)
    op = getattr(ops, stage)
    display = f"{stage}-{iteration:05d}"  # the compile-time default; the parameter may differ

    @dsl.pipeline(name=f"rlvr-stage-{stage}", description=f"RLVR: rerun {stage} of one iteration")
    def rlvr_stage(
        config_json: str = cfg.to_json(),
        run_id: str = cfg.run_id,
        iteration: int = iteration,
        force: bool = True,
    ) -> None:
        if stage == "init":
            task = op(config_json=config_json, run_id=run_id, force=force)
        elif stage == "evaluate":
            task = op(config_json=config_json, run_id=run_id, checkpoint=iteration, force=force)
        else:
            task = op(config_json=config_json, run_id=run_id, iteration=iteration, force=force)
        _apply(task, stage, cfg, for_cluster).set_display_name(display)

    return rlvr_stage
