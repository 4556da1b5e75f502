"""Compile, submit and schedule pipelines on a Kubeflow Pipelines cluster through `kfp.Client`.

Auth follows kfp.Client's conventions: an existing token (`--token` or `KF_PIPELINES_TOKEN`-style
environment handled by kfp), or the in-cluster service account when run inside a pod. Nothing
here reads or writes object-store credentials: stages get them from a Kubernetes Secret.
"""

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.core.config import RunConfig
from components.core.errors import UserError

PIPELINES = ("train", "eval", "stage")


def build(
    cfg: RunConfig, pipeline: str, *, stage: str | None = None, iteration: int = 0
) -> Callable:
    from pipelines.evaluation import build_eval_pipeline, build_stage_pipeline
    from pipelines.train import build_train_pipeline

    if pipeline == "train":
        return build_train_pipeline(cfg)
    if pipeline == "eval":
        return build_eval_pipeline(cfg)
    if pipeline == "stage":
        if not stage:
            raise UserError("--pipeline stage needs --stage NAME (and --iteration I)")
        return build_stage_pipeline(cfg, stage, iteration)
    raise UserError(f"unknown pipeline {pipeline!r}; valid: {', '.join(PIPELINES)}")


def compile_to(fn: Callable, path: str | Path) -> str:
    from kfp import compiler

    compiler.Compiler().compile(fn, package_path=str(path))
    return str(path)


def client(host: str, namespace: str | None = None, token: str | None = None):
    import kfp

    return kfp.Client(host=host, namespace=namespace, existing_token=token)


@dataclass
class Submitted:
    run_id: str
    url: str


def submit(
    cfg: RunConfig,
    fn: Callable,
    *,
    host: str,
    experiment: str,
    namespace: str | None,
    token: str | None,
    arguments: dict,
    run_name: str,
) -> Submitted:
    c = client(host, namespace, token)
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_to(fn, Path(tmp) / "pipeline.yaml")
        result = c.create_run_from_pipeline_package(
            path,
            arguments=arguments,
            run_name=run_name,
            experiment_name=experiment,
            namespace=namespace,
            enable_caching=False,
            service_account=cfg.cluster.service_account,
        )
    return Submitted(result.run_id, f"{host.rstrip('/')}/#/runs/details/{result.run_id}")


def segment_run_name(cfg: RunConfig, segment: int) -> str:
    return f"{cfg.run_id}-train-seg{segment:05d}"


def submit_segment(
    cfg: RunConfig,
    params: dict[str, str],
    *,
    segment: int,
    host: str,
    experiment: str,
    namespace: str | None,
    token: str | None,
) -> Submitted:
    """Submit one segment of a training run (`rlvr submit`, and the last task of each segment
    for the next one). The compiled pipeline is the same for every segment: its size does not
    depend on run.iterations; the segment index is a run-time parameter."""
    from pipelines.train import build_train_pipeline

    arguments = {
        **{k: v for k, v in params.items() if v != ""},
        "segment": segment,
        "chain": True,
        "experiment": experiment,
        "namespace": namespace or "",
    }
    return submit(
        cfg, build_train_pipeline(cfg), host=host, experiment=experiment, namespace=namespace,
        token=token, arguments=arguments, run_name=segment_run_name(cfg, segment),
    )  # fmt: skip


def chain_next_segment(
    params: dict[str, str],
    *,
    segment: int,
    chain: bool,
    experiment: str,
    namespace: str,
    attempt: str = "local",
) -> str:
    """Body of the `next-segment` task: once the segment's last checkpoint is committed, submit
    segment+1 of the run from inside the cluster (`cluster.kfp_api`, the pod's service account
    token). Returns the new run id, or "" for the last segment and when chaining is off. It
    fails, submitting nothing, when a worker of the segment fails."""
    import logging

    from components.core.config import effective_config
    from components.core.warm import segments

    cfg = effective_config(**params)
    if not chain or segment + 1 >= len(segments(cfg)):
        return ""
    # Started beside the workers: wait, like them, for the segment's training to be committed.
    from components.core.layout import RunLayout, store_for
    from components.core.store import join
    from components.core.warm import RunStatus, wait_committed
    from components.core.warm import segment as segment_of

    layout, stop = RunLayout.of(cfg), segment_of(cfg, segment).stop
    store = store_for(cfg)
    wait_committed(
        store, [layout.checkpoint(stop), layout.train_state(stop)],
        status=RunStatus.of(cfg, attempt), task="next-segment", timeout_s=cfg.run.wait_timeout_s
        * max(1, cfg.run.segment_iterations), poll_max_s=cfg.run.poll_max_s or 5.0,
    )  # fmt: skip
    # Exactly once: a retried task (its pod lost after the submission) finds the claim.
    claim = join(layout.root, "status", "segments", f"{segment + 1:05d}.json")
    if store.exists(claim):
        record = json.loads(store.read_text(claim))
        logging.getLogger("rlvr.chain").info(
            "segment %d was already submitted as run %s", segment + 1, record["run_id"]
        )
        return record["run_id"]
    name = segment_run_name(cfg, segment + 1)
    existing = find_run(cfg.cluster.kfp_api, name, namespace or None)
    run_id = existing or submit_segment(
        cfg, params, segment=segment + 1, host=cfg.cluster.kfp_api, experiment=experiment,
        namespace=namespace or None, token=None,
    ).run_id  # fmt: skip
    store.write_text(claim, json.dumps({"run_id": run_id, "name": name, "by": attempt}))
    logging.getLogger("rlvr.chain").info("segment %d submitted as run %s", segment + 1, run_id)
    return run_id


def find_run(host: str, name: str, namespace: str | None) -> str | None:
    """The id of a run with this display name that is not over yet (a submission whose claim
    was lost with its pod), or None."""
    c = client(host, namespace, None)
    flt = json.dumps({"predicates": [{"key": "display_name", "operation": "EQUALS",
                                      "string_value": name}]})  # fmt: skip
    try:
        runs = c.list_runs(page_size=10, filter=flt, namespace=namespace).runs or []
    except Exception:  # noqa: BLE001 - a lookup that fails must not stop the chain
        return None
    for r in runs:
        if r.display_name == name and str(r.state) not in ("FAILED", "CANCELED", "SKIPPED"):
            return r.run_id
    return None


def schedule(
    cfg: RunConfig,
    fn: Callable,
    *,
    host: str,
    cron: str,
    experiment: str,
    namespace: str | None,
    token: str | None,
    arguments: dict,
    job_name: str,
) -> str:
    """A recurring run (KFP's six-field cron), one at a time, with no catch-up of missed runs."""
    if len(cron.split()) != 6:
        raise UserError(
            f"--cron {cron!r} must have six fields (seconds first), e.g. '0 0 */6 * * *'"
        )
    c = client(host, namespace, token)
    exp = c.create_experiment(experiment, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_to(fn, Path(tmp) / "pipeline.yaml")
        rr = c.create_recurring_run(
            experiment_id=exp.experiment_id,
            job_name=job_name,
            cron_expression=cron,
            pipeline_package_path=path,
            params=arguments,
            max_concurrency=1,
            no_catchup=True,
            enable_caching=False,
            service_account=cfg.cluster.service_account,
        )
    return rr.recurring_run_id


def list_runs(*, host: str, namespace: str | None, token: str | None, page_size: int = 20):
    c = client(host, namespace, token)
    response = c.list_runs(page_size=page_size, sort_by="created_at desc", namespace=namespace)
    return response.runs or []
