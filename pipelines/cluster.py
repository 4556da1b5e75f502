"""Compile, submit and schedule pipelines on a Kubeflow Pipelines cluster through `kfp.Client`.

Auth follows kfp.Client's conventions: an existing token (`--token` or `KF_PIPELINES_TOKEN`-style
environment handled by kfp), or the in-cluster service account when run inside a pod. Nothing
here reads or writes object-store credentials: stages get them from a Kubernetes Secret.
"""

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.core.config import RunConfig
from components.core.errors import UserError


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
