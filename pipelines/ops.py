"""KFP components: one lightweight Python component per stage.

(No `from __future__ import annotations` here: KFP reads the real annotation objects.)

Each component body only imports its stage module and calls `run(config, iteration)`; stage code
never imports kfp. The component's `base_image` is that stage's image, which the KFP local runner
ignores, so the same pipeline serves the cluster and the laptop. Components are built by
`make_ops(images)` so the images come from config at compile time.

Everything crosses the boundary as parameters (the resolved config as JSON, the iteration) and
URIs inside the object store; the JSON string a component returns is its result summary.
"""

from collections.abc import Callable
from dataclasses import dataclass

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

# Every op takes the pipeline's run-time parameters (config_json, run_id, store, base_checkpoint,
# eval_sets) and rebuilds the effective config itself (components.core.config.effective_config).
# They are not computed once by an upstream task on purpose: kfp.local resolves an upstream
# output passed into a dsl.ParallelFor body to the loop item (seen with kfp 2.17).


def init_stage(
    config_json: str,
    run_id: str,
    force: bool = False,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    segment: int = -1,
    attempt: str = "",
    job_id: str = "",
) -> str:
    """Copy the base checkpoint and the datasets into the run. In a training segment
    (`segment` >= 0), then uncommit every stale output and commit the attempt's plan, which the
    workers wait for (pipelines/plan.py)."""
    import json

    from components.core.config import effective_config
    from components.core.stage_cli import run_from_pipeline, setup_logging

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    out = run_from_pipeline("init", params, force=force)
    if segment < 0:
        return out
    from pipelines.plan import plan_segment

    setup_logging()
    plan = plan_segment(effective_config(**params), segment, attempt or job_id)
    return json.dumps({**json.loads(out), "plan": plan}, default=str)


def generate_stage(
    config_json: str,
    run_id: str,
    iteration: int,
    force: bool = False,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> str:
    """Sample rollouts of one iteration (or one shard) with checkpoint `iteration`."""
    from components.core.stage_cli import run_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    kw = dict(iteration=iteration, force=force, shard=shard, num_shards=num_shards)
    return run_from_pipeline("generate", params, **kw)


def verify_stage(
    config_json: str,
    run_id: str,
    iteration: int,
    force: bool = False,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> str:
    """Score the rollouts of one iteration (or one shard)."""
    from components.core.stage_cli import run_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    kw = dict(iteration=iteration, force=force, shard=shard, num_shards=num_shards)
    return run_from_pipeline("verify", params, **kw)


def train_stage(
    config_json: str,
    run_id: str,
    iteration: int,
    metrics: Output[Metrics],
    force: bool = False,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> str:
    """Take the policy update of one iteration: checkpoint i -> i+1; the KFP UI shows its metrics."""
    from components.core.commit import read_manifest
    from components.core.config import effective_config
    from components.core.layout import RunLayout, store_for
    from components.core.stage_cli import run_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    out = run_from_pipeline("train", params, iteration=iteration, force=force)
    cfg = effective_config(**params)
    stats = read_manifest(store_for(cfg), RunLayout.of(cfg).checkpoint(iteration + 1))["stats"]
    for key, value in stats.items():
        if isinstance(value, int | float) and key.startswith("train/"):
            metrics.log_metric(key, float(value))
    return out


def evaluate_stage(
    config_json: str,
    run_id: str,
    checkpoint: int,
    metrics: Output[Metrics],
    report: Output[Markdown],
    force: bool = False,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> str:
    """Evaluate one checkpoint; the KFP UI shows its metrics and report. With num_shards > 1 this
    task only samples and scores its shard (the gather task computes the metrics)."""
    import json

    from components.core.config import effective_config
    from components.core.layout import RunLayout, store_for
    from components.core.stage_cli import run_from_pipeline
    from components.core.store import join

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    kw = dict(iteration=checkpoint, force=force, shard=shard, num_shards=num_shards)
    out = run_from_pipeline("evaluate", params, **kw)
    if num_shards > 1:
        return out
    cfg = effective_config(**params)
    st, layout = store_for(cfg), RunLayout.of(cfg)
    top = json.loads(st.read_text(join(layout.evals(checkpoint), "metrics.json")))
    for name, m in top["sets"].items():
        for key, value in m["overall"].items():
            if isinstance(value, int | float):
                metrics.log_metric(f"eval/{name}/{key}", float(value))
    with open(report.path, "w") as f:
        f.write(st.read_text(join(layout.evals(checkpoint), "report.md")))
    return out


def report_stage(
    config_json: str,
    run_id: str,
    report: Output[Markdown],
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> str:
    """Regenerate the run-level plots and report from every committed evaluation (runs last:
    evaluations may finish in any order)."""
    import json

    from components.core.config import effective_config
    from components.core.layout import RunLayout, store_for
    from components.report.run_report import write_run_report

    cfg = effective_config(config_json, run_id, store, base_checkpoint, eval_sets)
    st, root = store_for(cfg), RunLayout.of(cfg).root
    paths = write_run_report(st, root)
    with open(report.path, "w") as f:
        f.write(st.read_text(paths["report.md"]))
    return json.dumps(paths)


# `attempt` is set by `rlvr run` (a local run: no retries); on a cluster it is empty and the
# KFP run's id stands in, and KFP retries a failed task, so its peers wait for it a while.


def generate_worker(
    config_json: str,
    run_id: str,
    segment: int,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    attempt: str = "",
    job_id: str = "",
) -> str:
    """Serve generate for every iteration of a segment (one shard), the policy kept loaded."""
    from components.core.stage_cli import serve_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    return serve_from_pipeline(
        "generate",
        params,
        segment=segment,
        shard=shard,
        num_shards=num_shards,
        attempt=attempt or job_id,
        retried=not attempt,
    )


def verify_worker(
    config_json: str,
    run_id: str,
    segment: int,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    attempt: str = "",
    job_id: str = "",
) -> str:
    """Serve verify for every iteration of a segment (one shard)."""
    from components.core.stage_cli import serve_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    return serve_from_pipeline(
        "verify",
        params,
        segment=segment,
        shard=shard,
        num_shards=num_shards,
        attempt=attempt or job_id,
        retried=not attempt,
    )


def train_worker(
    config_json: str,
    run_id: str,
    segment: int,
    metrics: Output[Metrics],
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    attempt: str = "",
    job_id: str = "",
) -> str:
    """Serve train for every iteration of a segment, the DeepSpeed engine kept in memory; the KFP
    UI shows the train and health figures of the segment's last update."""
    from components.core.stage_cli import segment_train_figures, serve_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    out = serve_from_pipeline(
        "train", params, segment=segment, attempt=attempt or job_id, retried=not attempt
    )
    for key, value in segment_train_figures(params, segment).items():
        metrics.log_metric(key, value)
    return out


def evaluate_worker(
    config_json: str,
    run_id: str,
    segment: int,
    shard: int = 0,
    num_shards: int = 1,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    attempt: str = "",
    job_id: str = "",
) -> str:
    """Evaluate each of the segment's checkpoints as it lands (one sampling shard, or the
    gather / unsharded evaluation), the policy kept loaded."""
    from components.core.stage_cli import serve_from_pipeline

    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    return serve_from_pipeline(
        "evaluate",
        params,
        segment=segment,
        shard=shard,
        num_shards=num_shards,
        attempt=attempt or job_id,
        retried=not attempt,
    )


def next_segment(
    config_json: str,
    run_id: str,
    segment: int,
    chain: bool = False,
    experiment: str = "rlvr",
    namespace: str = "",
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
    attempt: str = "",
    job_id: str = "",
) -> str:
    """After the segment's training: submit the next segment as a new run of this pipeline
    (through the KFP API, with the pod's service account token), so a run of any length goes on
    without a client attached. Does nothing when `chain` is off (the local runner drives
    segments itself). The submission runs in a fresh interpreter (pipelines/chain.py): this body
    runs under `_KFP_RUNTIME=true`, where kfp's client and DSL do not import."""
    import json
    import os
    import subprocess
    import sys

    if not chain:
        return ""
    params = dict(
        config_json=config_json,
        run_id=run_id,
        store=store,
        base_checkpoint=base_checkpoint,
        eval_sets=eval_sets,
    )
    env = {k: v for k, v in os.environ.items() if k != "_KFP_RUNTIME"}
    cmd = [
        sys.executable,
        "-m",
        "pipelines.chain",
        json.dumps(params),
        "--segment",
        str(segment),
        "--experiment",
        experiment,
        "--namespace",
        namespace,
        "--attempt",
        attempt or job_id,
    ]
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else ""


def resolve_stage(
    config_json: str,
    run_id: str,
    checkpoint: str,
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> int:
    """The checkpoint index to evaluate: "latest" (the newest committed, resolved now) or an index."""
    from components.core.config import effective_config
    from components.evaluate.stage import resolve_checkpoint

    cfg = effective_config(config_json, run_id, store, base_checkpoint, eval_sets)
    return resolve_checkpoint(cfg, checkpoint)


STAGE_FUNCS: dict[str, Callable] = {
    "init": init_stage,
    "generate": generate_stage,
    "verify": verify_stage,
    "train": train_stage,
    "evaluate": evaluate_stage,
    "resolve": resolve_stage,
    "report": report_stage,
    "generate_worker": generate_worker,
    "verify_worker": verify_worker,
    "train_worker": train_worker,
    "evaluate_worker": evaluate_worker,
    "next_segment": next_segment,
}


@dataclass(frozen=True)
class Ops:
    init: Callable
    generate: Callable
    verify: Callable
    train: Callable
    evaluate: Callable
    resolve: Callable
    report: Callable
    generate_worker: Callable
    verify_worker: Callable
    train_worker: Callable
    evaluate_worker: Callable
    next_segment: Callable


def make_ops(images: dict[str, str]) -> Ops:
    """KFP components for every stage, each on its stage's image (`images` has one per stage)."""
    image_of = {
        "resolve": images["evaluate"],  # a lookup beside evaluate
        "report": images["evaluate"],
        "generate_worker": images["generate"],
        "verify_worker": images["verify"],
        "train_worker": images["train"],
        "evaluate_worker": images["evaluate"],
        "next_segment": images["init"],
        **images,
    }
    # install_kfp_package=False: the images carry the exact kfp that compiles the pipeline
    # (images/*/Dockerfile), so a task starts the KFP executor at once, with no start-up
    # `pip install` (which needs the network and costs a second per task).
    built = {
        name: dsl.component(base_image=image_of[name], install_kfp_package=False)(fn)
        for name, fn in STAGE_FUNCS.items()
    }
    return Ops(**built)
