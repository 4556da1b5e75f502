"""The KFP v2 training pipeline: one run serves one segment of a training run with warm workers.

    init                                  (copies the base policy and data into the run)
    generate (worker; one per shard)      \
    verify (worker; one per shard)         |  all start at once and meet in the store
    train (worker)                         |
    next-segment                          /   (submits segment+1 once train commits the last)
    evaluate (worker; + shards) --> report

Each worker is one long-running task on its stage's image and node pool that serves every
iteration of the segment (components/core/warm.py): its model, engine and optimizer are loaded
once, and each iteration's output is committed to the store as before. Workers of a segment run
side by side and meet only through the store's commit markers: generate of iteration i waits for
checkpoint max(0, i - train.max_staleness), verify for the rollouts, train for the scored
rollouts, evaluate for the checkpoints it evaluates. So stages overlap where the data allows (and
more with bounded staleness), a failed worker is retried alone and resumes at its first
uncommitted iteration, and a committed output is never recomputed.

KFP v2 has no loops that span runs, so a run of any length is a chain of segments: the segment
index is a run-time parameter, the compiled pipeline does not grow with run.iterations, and the
`next-segment` task submits the next segment through the KFP API. Locally, `rlvr run` drives the
segments itself, each on the concurrent local runner (pipelines/local_runner.py), because
kfp.local runs one task at a time and workers that wait on each other need to run together.
The pipeline function only wires tasks; Kubernetes placement is added by small helpers. With
train.nodes > 1 the train task's pod only submits and follows a multi-node TrainJob / PyTorchJob
(components/train/jobs.py), so it is placed on the init pool, without a GPU.
"""

from collections.abc import Callable

from kfp import dsl, kubernetes

from components.core.commit import shard_name
from components.core.config import RunConfig, code_stages
from components.core.stages import STEPS
from components.core.warm import eval_checkpoints
from pipelines.ops import make_ops
from pipelines.placement import place, submits_job

__all__ = ["build_train_pipeline", "compile_pipeline", "eval_checkpoints"]


class _Placer:
    """Display names and placement of the tasks of one compiled pipeline."""

    def __init__(self, cfg: RunConfig, for_cluster: bool) -> None:
        self.cfg, self.for_cluster = cfg, for_cluster
        channel = cfg.train.handoff.channel == "broadcast"
        self.ends = {"train": "sender", "generate": "receiver"} if channel else {}

    def __call__(
        self, task: dsl.PipelineTask, stage: str, name: str, serves: bool = True
    ) -> dsl.PipelineTask:
        """Display name and placement; a task that serves the segment gets a pod deadline of
        its stage's per-iteration timeout times the segment's iterations."""
        cfg = self.cfg
        task.set_display_name(name)
        if self.for_cluster:
            n = cfg.run.segment_iterations if serves else 1
            return place(
                task,
                stage,
                cfg.cluster,
                iterations=n,
                runs_code=stage in code_stages(cfg),
                submits_job=submits_job(cfg, stage),
                channel=self.ends.get(stage) if serves else None,
            )
        return task.set_caching_options(False)

    def shards(self, op: Callable, stage: str, count: int, **kwargs) -> list[dsl.PipelineTask]:
        """One worker per shard (shards are few and fixed by config, so they are unrolled).
        Display names are the stages' task names, which also name their failure markers."""
        if count == 1:
            return [self(op(**kwargs), stage, stage)]
        return [
            self(op(**kwargs, shard=s, num_shards=count), stage, f"{stage}-{shard_name(s, count)}")
            for s in range(count)
        ]


def build_train_pipeline(cfg: RunConfig, *, for_cluster: bool = True) -> Callable:
    """The segment pipeline for this config (images, shard counts and placement fixed at compile
    time; run id, store, base checkpoint, eval sets and the segment index at run time).

    `for_cluster=False` leaves out the Kubernetes placement (the local runner has no use for it).
    """
    ops = make_ops({s: cfg.cluster.image(s) for s in STEPS})
    placed = _Placer(cfg, for_cluster)
    shards_of = placed.shards

    @dsl.pipeline(
        name="rlvr-train",
        description="RLVR: one segment of warm generate / verify / train / evaluate workers",
    )
    def rlvr_train(
        config_json: str = cfg.to_json(),
        run_id: str = cfg.run_id,
        store: str = "",
        base_checkpoint: str = "",
        eval_sets: str = "",
        segment: int = 0,
        chain: bool = False,
        experiment: str = "rlvr",
        namespace: str = "",
        attempt: str = "",
    ) -> None:
        """Empty store / base_checkpoint / eval_sets (JSON list) keep the compiled-in config's.
        `chain`: submit the next segment when this one's training is done (`rlvr submit`).
        `attempt`: names this run's failure markers and plan; empty means the KFP run's id."""
        common = dict(
            config_json=config_json,
            run_id=run_id,
            store=store,
            base_checkpoint=base_checkpoint,
            eval_sets=eval_sets,
        )
        ids = dict(attempt=attempt, job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        # Every task starts at once: workers wait for init's plan (its commits and every stale
        # output uncommitted) like for any other input, so their cold start overlaps init.
        placed(ops.init(**common, segment=segment, **ids), "init", "init", serves=False)
        seg = dict(**common, segment=segment, **ids)
        shards_of(ops.generate_worker, "generate", cfg.generate.num_shards, **seg)
        shards_of(ops.verify_worker, "verify", cfg.verify.num_shards, **seg)
        placed(ops.train_worker(**seg), "train", "train")
        # Waits (in the store) for the segment's last checkpoint, then submits the next segment.
        nxt = ops.next_segment(**seg, chain=chain, experiment=experiment, namespace=namespace)
        placed(nxt, "init", "next-segment")
        if for_cluster:  # Kubeflow's PodDefault projects the KFP API token into labelled pods
            kubernetes.add_pod_label(nxt, "access-ml-pipeline", "true")
        if cfg.data.evaluates:
            evals = []
            if cfg.evaluate.num_shards > 1:
                evals += shards_of(ops.evaluate_worker, "evaluate", cfg.evaluate.num_shards, **seg)
            gather = "evaluate" if cfg.evaluate.num_shards == 1 else "evaluate-gather"
            evals.append(placed(ops.evaluate_worker(**seg), "evaluate", gather))
            # Evaluations finish in any order; the run-level report comes last.
            placed(ops.report(**common).after(*evals), "init", "report", serves=False)

    return rlvr_train


def compile_pipeline(cfg: RunConfig, out_path: str) -> str:
    from kfp import compiler

    compiler.Compiler().compile(build_train_pipeline(cfg), package_path=out_path)
    return out_path
