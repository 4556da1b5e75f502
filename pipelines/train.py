"""The KFP v2 training pipeline: init, then N unrolled iterations of generate -> verify -> train,
each new checkpoint followed by evaluate.

KFP v2 has no while loops, so iterations are unrolled when the pipeline is compiled; the run's
state lives in the object store, so a rerun with the same run id resumes (committed stages skip).
The pipeline function only wires tasks; Kubernetes placement is added by small helpers.
"""

from collections.abc import Callable

from kfp import dsl

from components.core.config import RunConfig
from pipelines.ops import make_ops
from pipelines.placement import place

STAGES = ("generate", "verify", "train", "evaluate")


def eval_checkpoints(cfg: RunConfig) -> list[int]:
    """Checkpoints the pipeline evaluates: the base, every `evaluate.every`-th, and the last."""
    last = cfg.run.iterations
    if not cfg.data.eval:
        return []
    every = cfg.evaluate.every
    return sorted({0, last, *range(every, last + 1, every)})


def build_train_pipeline(cfg: RunConfig, *, for_cluster: bool = True) -> Callable:
    """The pipeline function for this config (iterations and images fixed at compile time).

    `for_cluster=False` leaves out the Kubernetes placement (the local runner has no use for it).
    """
    ops = make_ops({s: cfg.cluster.image(s) for s in ("init", *STAGES)})
    iterations = cfg.run.iterations
    evaluated = set(eval_checkpoints(cfg))

    def _placed(stage: str):
        def apply(task: dsl.PipelineTask) -> dsl.PipelineTask:
            if for_cluster:
                return place(task, stage, cfg.cluster)
            return task.set_caching_options(False)

        return apply

    def fan_out(stage, after, shards: int, **kwargs) -> dsl.PipelineTask:
        """One task, or `shards` tasks under dsl.ParallelFor. A later task's .after() on the
        returned task waits for every shard (the gather)."""
        index = kwargs.get("iteration", kwargs.get("checkpoint"))
        op, name = getattr(ops, stage), f"{stage}-{index:05d}"
        if shards == 1:
            return _placed(stage)(op(**kwargs)).after(after).set_display_name(name)
        with dsl.ParallelFor(items=list(range(shards)), parallelism=shards) as shard:
            task = _placed(stage)(op(**kwargs, shard=shard, num_shards=shards))
            task.after(after).set_display_name(f"{name}-shard")
        return task

    @dsl.pipeline(name="rlvr-train", description="RLVR: generate -> verify -> train, evaluate")
    def rlvr_train(
        config_json: str = cfg.to_json(),
        run_id: str = cfg.run_id,
        store: str = "",
        base_checkpoint: str = "",
        eval_sets: str = "",
    ) -> None:
        """Empty store / base_checkpoint / eval_sets (JSON list) keep the compiled-in config's."""
        common = dict(config_json=config_json, run_id=run_id, store=store,
                      base_checkpoint=base_checkpoint, eval_sets=eval_sets)  # fmt: skip
        init = _placed("init")(ops.init(**common)).set_display_name("init")

        evals: list[dsl.PipelineTask] = []

        def evaluate(c: int, after: dsl.PipelineTask) -> None:
            shards = cfg.evaluate.num_shards
            if shards > 1:  # sample+score shards in parallel, then gather the metrics
                after = fan_out("evaluate", after, shards, **common, checkpoint=c)
            task = _placed("evaluate")(ops.evaluate(**common, checkpoint=c))
            evals.append(task.after(after).set_display_name(f"evaluate-{c:05d}"))

        if 0 in evaluated:
            evaluate(0, init)
        prev = init
        for i in range(iterations):
            gen = fan_out("generate", prev, cfg.generate.num_shards, **common, iteration=i)
            ver = fan_out("verify", gen, cfg.verify.num_shards, **common, iteration=i)
            trn = _placed("train")(ops.train(**common, iteration=i))
            trn.after(ver).set_display_name(f"train-{i:05d}")
            if i + 1 in evaluated:
                # Runs beside generate of iteration i+1 where resources allow: both follow train i.
                evaluate(i + 1, trn)
            prev = trn
        if evals:  # evaluations may finish in any order: the run-level report comes last
            report = _placed("init")(ops.report(**common)).set_display_name("report")
            report.after(*evals)

    return rlvr_train


def compile_pipeline(cfg: RunConfig, out_path: str) -> str:
    from kfp import compiler

    compiler.Compiler().compile(build_train_pipeline(cfg), package_path=out_path)
    return out_path


def run_local(cfg: RunConfig, pipeline_root: str) -> None:
    """Execute the pipeline on KFP's local SubprocessRunner (no cluster, no Docker)."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root)
    pipeline = build_train_pipeline(cfg, for_cluster=False)
    pipeline(config_json=cfg.to_json(), run_id=cfg.run_id)
