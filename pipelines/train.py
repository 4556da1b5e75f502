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

STAGES = ("generate", "verify", "train", "evaluate")


def eval_checkpoints(cfg: RunConfig) -> list[int]:
    """Checkpoints the pipeline evaluates: the base, every `evaluate.every`-th, and the last."""
    last = cfg.run.iterations
    if not cfg.data.eval:
        return []
    every = cfg.evaluate.every
    return sorted({0, last, *range(every, last + 1, every)})


def _plain(task: dsl.PipelineTask) -> dsl.PipelineTask:
    # Stages are idempotent against the object store; KFP's cache would only hide reruns.
    task.set_caching_options(False)
    return task


def build_train_pipeline(cfg: RunConfig) -> Callable:
    """The pipeline function for this config (iterations and images fixed at compile time)."""
    ops = make_ops({s: cfg.cluster.image(s) for s in STAGES})
    iterations = cfg.run.iterations
    evaluated = set(eval_checkpoints(cfg))

    @dsl.pipeline(name="rlvr-train", description="RLVR: generate -> verify -> train, evaluate")
    def rlvr_train(config_json: str = cfg.to_json(), run_id: str = cfg.run_id) -> None:
        init = _plain(ops.init(config_json=config_json, run_id=run_id)).set_display_name("init")
        if 0 in evaluated:
            _plain(ops.evaluate(config_json=config_json, run_id=run_id, checkpoint=0)).after(
                init
            ).set_display_name("evaluate-00000")
        prev = init
        for i in range(iterations):
            gen = _plain(ops.generate(config_json=config_json, run_id=run_id, iteration=i))
            gen.after(prev).set_display_name(f"generate-{i:05d}")
            ver = _plain(ops.verify(config_json=config_json, run_id=run_id, iteration=i))
            ver.after(gen).set_display_name(f"verify-{i:05d}")
            trn = _plain(ops.train(config_json=config_json, run_id=run_id, iteration=i))
            trn.after(ver).set_display_name(f"train-{i:05d}")
            if i + 1 in evaluated:
                ev = _plain(ops.evaluate(config_json=config_json, run_id=run_id, checkpoint=i + 1))
                ev.after(trn).set_display_name(f"evaluate-{i + 1:05d}")
            prev = trn

    return rlvr_train


def compile_pipeline(cfg: RunConfig, out_path: str) -> str:
    from kfp import compiler

    compiler.Compiler().compile(build_train_pipeline(cfg), package_path=out_path)
    return out_path


def run_local(cfg: RunConfig, pipeline_root: str) -> None:
    """Execute the pipeline on KFP's local SubprocessRunner (no cluster, no Docker)."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root)
    pipeline = build_train_pipeline(cfg)
    pipeline(config_json=cfg.to_json(), run_id=cfg.run_id)
