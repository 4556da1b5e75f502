"""The `rlvr` command line.

    rlvr check CONFIG [--offline]                                    everything, before any work
    rlvr run CONFIG [--run-id ID] [--iterations N] [--set k=v ...]   whole pipeline, local runner
    rlvr stage NAME CONFIG --run-id ID --iteration I [--force]       one stage of one iteration
    rlvr compile CONFIG -o pipeline.yaml [--pipeline train|eval|stage]   KFP v2 IR YAML
    rlvr submit CONFIG --host URL [--pipeline ...] [--stage S -i I]  run on a KFP cluster
    rlvr schedule CONFIG --host URL --cron "0 0 */6 * * *"          recurring evaluation
    rlvr runs --host URL                                             list cluster runs
    rlvr eval CONFIG (--checkpoint URI | --run-id ID [--watch])      evaluate locally
    rlvr report RUN_DIR                                              table of every evaluation
    rlvr prune RUN_DIR [--dry-run]                                   apply the retention policy

`run` prepares the example inputs if the config names a `prepare` module and an input is missing,
writes the resolved config as run.yaml, then executes the same pipeline function a cluster runs,
on KFP's local SubprocessRunner. Re-running with the same run id resumes: committed stages skip.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from components.core.config import RunConfig, load_config
from components.core.errors import UserError
from components.core.layout import RunLayout
from components.core.stage_cli import run_stage, setup_logging
from components.core.stages import STEPS
from components.core.store import get_store
from pipelines.local import console, eval_tables, prepare_inputs, print_health

SET_OPTION = click.option(
    "--set", "overrides", multiple=True, help="Override a config key: a.b=value (repeatable)."
)


def _load(config: str, overrides: tuple[str, ...], **kw) -> RunConfig:
    return load_config(config, list(overrides), **kw)  # a ConfigError: the group's exit 2


def _stage_fns():
    import importlib

    from components.core.stage_cli import STAGE_MODULES

    return {name: importlib.import_module(mod).run for name, mod in STAGE_MODULES.items()}


def local_path_warnings(cfg: RunConfig) -> list[str]:
    """``pipelines.preflight.local_path_warnings``, imported on use (it pulls in pyarrow,
    which every other command of this CLI need not pay for at start-up)."""
    from pipelines.preflight import local_path_warnings as warnings

    return warnings(cfg)


class _Cli(click.Group):
    """The `rlvr` group: a user error from any command (components/core/errors.py: bad input,
    or the store's own failure) is one line and exit status 2; anything else keeps its
    traceback."""

    def invoke(self, ctx: click.Context):
        from components.core.errors import USER_ERRORS

        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_Cli, help="rlvr: RL from verifiable rewards as Kubeflow Pipelines stages.")
@click.version_option(package_name="rlvr", prog_name="rlvr")
def main() -> None:
    pass


def _check(cfg: RunConfig, *, inputs: bool, for_cluster: bool = False) -> float:
    """`rlvr check`'s work; every error at once (a PreflightError: the group's exit status 2)."""
    from pipelines.preflight import run_check

    return run_check(cfg, inputs=inputs, for_cluster=for_cluster)


@main.command(
    help="Check a run config before any work: algorithm names and options, the store, the base "
    "checkpoint, every dataset row, the verifiers. Reports every problem; exit status 2."
)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--run-id", default=None)
@SET_OPTION
@click.option(
    "--offline", is_flag=True, help="Only what needs no inputs (as compile and submit do)."
)
def check(config: str, run_id: str | None, overrides: tuple[str, ...], offline: bool) -> None:
    cfg = _load(config, overrides, run_id=run_id)
    if not offline:
        prepare_inputs(cfg)
    seconds = _check(cfg, inputs=not offline)
    click.echo(f"ok: {config} checks out ({seconds:.1f} s)")


@main.command(help="Run the training pipeline on KFP's local runner (resumes an existing run id).")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option(
    "--run-id", default=None, help="Run id (default: run.run_id, else the config's folder)."
)
@click.option("--iterations", type=int, default=None, help="Override run.iterations.")
@SET_OPTION
@click.option("--skip-check", is_flag=True, help="Do not run `rlvr check` first.")
@click.option(
    "--runner",
    type=click.Choice(["subprocess", "docker"]),
    default="subprocess",
    show_default=True,
    help="Run each task as a subprocess here, or in its stage's image (cluster.image_repo / "
    "image_tag; build them with images/build.sh).",
)
@click.option(
    "--docker-user",
    default="auto",
    show_default=True,
    help="With --runner docker: the uid the images declare (image; needs root, which hands the "
    "run directory to it), yours (host), UID[:GID], or auto: image as root, else host.",
)
def run(
    config: str,
    run_id: str | None,
    iterations: int | None,
    overrides: tuple[str, ...],
    skip_check: bool,
    runner: str,
    docker_user: str,
) -> None:
    if runner == "docker":
        if not re.fullmatch(r"auto|image|host|\d+(:\d+)?", docker_user):
            raise click.BadParameter(
                f"{docker_user!r}: use auto, image, host or UID[:GID]", param_hint="--docker-user"
            )
        if docker_user == "auto":
            docker_user = "image" if os.geteuid() == 0 else "host"
    cfg = _load(config, overrides, run_id=run_id, iterations=iterations)
    prepare_inputs(cfg)
    if not skip_check:
        seconds = _check(cfg, inputs=True)
        console.print(
            f"checked the config, store, checkpoint, datasets and verifiers in {seconds:.1f} s"
        )
    from pipelines.local import run_local

    run_local(
        cfg,
        config_path=config,
        overrides=overrides,
        runner=runner,
        docker_user=docker_user,
        inputs_checked=not skip_check,
    )


@main.command(help="Run one stage of one iteration (what that stage's container runs).")
@click.argument("name", type=click.Choice(list(STEPS)))
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--run-id", default=None)
@click.option(
    "--iteration",
    "-i",
    type=int,
    default=0,
    show_default=True,
    help="Iteration (for evaluate: the checkpoint index).",
)
@click.option("--force", is_flag=True, help="Redo even if the output is committed.")
@SET_OPTION
@click.option("--shard", type=int, default=0, show_default=True, help="Sharded stages: this shard.")
@click.option("--num-shards", type=int, default=1, show_default=True, help="Sharded stages: of S.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the stage's whole result as JSON (timings, stats), not one line.",
)
def stage(name, config, run_id, iteration, force, overrides, shard, num_shards, as_json) -> None:
    setup_logging()
    cfg = _load(config, overrides, run_id=run_id)
    kwargs = {}
    if (shard, num_shards) != (0, 1):
        if name not in ("generate", "verify", "evaluate"):
            raise click.UsageError(f"the {name} stage is not sharded: leave out --shard")
        kwargs = {"shard": shard, "num_shards": num_shards}
    result = run_stage(_stage_fns()[name], cfg, iteration=iteration, force=force, **kwargs)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        click.echo(stage_summary(name, iteration, result))


def stage_summary(name: str, iteration: int, result: dict) -> str:
    """One line for a stage a user reran: what it did and where the output is (the stage's own
    log line above it has its figures; `--json` prints the whole result)."""
    what = "already committed, reused" if result.get("skipped") else "committed"
    where = result.get("uri") or result.get("root") or ""
    return f"{name} {iteration:05d}: {what}" + (f" -> {where}" if where else "")


def _pipeline_options(f):
    f = click.option(
        "--pipeline",
        type=click.Choice(["train", "eval", "stage"]),
        default="train",
        show_default=True,
        help="Which pipeline.",
    )(f)
    f = click.option(
        "--stage", "stage_name", default=None, help="With --pipeline stage: the stage."
    )(f)
    f = click.option(
        "--iteration",
        "-i",
        type=int,
        default=0,
        show_default=True,
        help="With --pipeline stage: the iteration (evaluate: checkpoint).",
    )(f)
    f = click.option("--run-id", default=None)(f)
    f = click.option("--iterations", type=int, default=None)(f)
    return SET_OPTION(f)


def _build(cfg: RunConfig, pipeline: str, stage_name: str | None, iteration: int):
    from pipelines.builders import build

    if stage_name and pipeline == "train":
        pipeline = "stage"
    return build(cfg, pipeline, stage=stage_name, iteration=iteration)


@main.command(name="compile", help="Compile a pipeline to KFP v2 IR YAML.")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@_pipeline_options
def compile_cmd(
    config, output, pipeline, stage_name, iteration, run_id, iterations, overrides
) -> None:
    from pipelines.cluster import compile_to

    cfg = _load(config, overrides, run_id=run_id, iterations=iterations)
    _check(cfg, inputs=False)
    for warning in local_path_warnings(cfg):
        click.echo(f"warning: {warning}", err=True)
    compile_to(_build(cfg, pipeline, stage_name, iteration), output)
    click.echo(output)


def _cluster_options(f):
    f = click.option(
        "--host", required=True, help="KFP API endpoint, e.g. https://kfp.example.com"
    )(f)
    f = click.option("--experiment", default="rlvr", show_default=True)(f)
    f = click.option("--namespace", default=None, help="Kubeflow profile namespace (multi-user).")(
        f
    )
    f = click.option(
        "--token",
        envvar="KFP_TOKEN",
        default=None,
        help="Existing bearer token (else kfp.Client's defaults, e.g. in-cluster SA).",
    )(f)
    return f


def _arguments(cfg: RunConfig, pipeline: str, checkpoint: str | None) -> dict:
    args = {"config_json": cfg.to_json(), "run_id": cfg.run_id}
    if pipeline == "eval":
        args["checkpoint"] = checkpoint or "latest"
    return args


@main.command(
    help="Compile and submit a pipeline run to a KFP cluster; prints the run id and link."
)
@click.argument("config", type=click.Path(dir_okay=False))
@_cluster_options
@_pipeline_options
@click.option("--checkpoint", default=None, help="With --pipeline eval: an index or 'latest'.")
@click.option(
    "--segment",
    type=int,
    default=0,
    show_default=True,
    help="Training: the segment to start from (each submits the next when done).",
)
def submit(
    config,
    host,
    experiment,
    namespace,
    token,
    pipeline,
    stage_name,
    iteration,
    run_id,
    iterations,
    overrides,
    checkpoint,
    segment,
) -> None:
    from pipelines.cluster import submit as do_submit

    cfg = _load(config, overrides, run_id=run_id, iterations=iterations)
    _check(cfg, inputs=False, for_cluster=True)
    fn = _build(cfg, pipeline, stage_name, iteration)
    kind = "stage" if stage_name else pipeline
    if kind == "train":
        from components.core.warm import segments
        from pipelines.chain import submit_segment

        n = len(segments(cfg))
        if not 0 <= segment < n:
            raise click.BadParameter(
                f"{segment}: the run has segments 0..{n - 1}", param_hint="--segment"
            )
        result = submit_segment(
            cfg,
            _arguments(cfg, kind, None),
            segment=segment,
            host=host,
            experiment=experiment,
            namespace=namespace,
            token=token,
        )
        click.echo(
            f"run id: {result.run_id} (segment {segment} of {n}; each segment submits "
            "the next when its training is done)"
        )
        click.echo(f"link:   {result.url}")
        return
    name = f"{cfg.run_id}-{kind}" + (f"-{stage_name}-{iteration:05d}" if stage_name else "")
    result = do_submit(
        cfg,
        fn,
        host=host,
        experiment=experiment,
        namespace=namespace,
        token=token,
        arguments=_arguments(cfg, kind, checkpoint),
        run_name=name,
    )
    click.echo(f"run id: {result.run_id}")
    click.echo(f"link:   {result.url}")


@main.command(
    help="Create a recurring evaluation run (KFP six-field cron, one at a time, no catch-up)."
)
@click.argument("config", type=click.Path(dir_okay=False))
@_cluster_options
@click.option("--cron", required=True, help="Six-field cron with seconds, e.g. '0 0 */6 * * *'.")
@click.option("--run-id", default=None)
@SET_OPTION
def schedule(config, host, experiment, namespace, token, cron, run_id, overrides) -> None:
    from pipelines.cluster import schedule as do_schedule
    from pipelines.evaluation import build_eval_pipeline

    cfg = _load(config, overrides, run_id=run_id)
    rr = do_schedule(
        cfg,
        build_eval_pipeline(cfg),
        host=host,
        cron=cron,
        experiment=experiment,
        namespace=namespace,
        token=token,
        arguments=_arguments(cfg, "eval", "latest"),
        job_name=f"{cfg.run_id}-eval-latest",
    )
    click.echo(f"recurring run id: {rr}")


@main.command(
    help="List the runs in a store (--store: iterations, pass@1, health) and/or on a KFP "
    "cluster (--host)."
)
@click.option(
    "--store", "store_uri", default=None, help="A run store, e.g. ./rlvr-runs or s3://b/p."
)
@click.option("--host", default=None, help="KFP API endpoint, e.g. https://kfp.example.com")
@click.option("--experiment", default="rlvr", show_default=True)
@click.option("--namespace", default=None, help="Kubeflow profile namespace (multi-user).")
@click.option("--token", envvar="KFP_TOKEN", default=None, help="Existing bearer token.")
@click.option("--limit", type=int, default=20, show_default=True)
def runs(store_uri, host, experiment, namespace, token, limit) -> None:
    if not store_uri and not host:
        raise click.UsageError("give --store DIR (the runs in a store) or --host URL (a cluster's)")
    if store_uri:
        from pipelines.local import store_runs_table

        Console().print(store_runs_table(store_uri))
    if not host:
        return
    from pipelines.cluster import list_runs

    table = Table(title=f"runs on {host}")
    for col in ("run id", "name", "state", "created"):
        table.add_column(col)
    for r in list_runs(host=host, namespace=namespace, token=token, page_size=limit):
        table.add_row(r.run_id, r.display_name, str(r.state), str(r.created_at))
    Console().print(table)


@main.command(
    name="eval", help="Evaluate a checkpoint locally: an HF dir / URI, or a run's checkpoints."
)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--checkpoint", default=None, help="HF checkpoint dir or URI to evaluate.")
@click.option("--run-id", default=None, help="Evaluate the checkpoints of this run.")
@click.option("--watch", is_flag=True, help="Keep evaluating each new committed checkpoint.")
@click.option("--poll-s", type=float, default=30.0, show_default=True)
@click.option("--timeout-s", type=float, default=None, help="Stop watching after this long.")
@click.option("--force", is_flag=True)
@SET_OPTION
def eval_cmd(config, checkpoint, run_id, watch, poll_s, timeout_s, force, overrides) -> None:
    from components.evaluate.local import evaluate_external, watch_run

    setup_logging()
    if bool(checkpoint) == bool(run_id):
        raise click.UsageError("give exactly one of --checkpoint URI or --run-id ID")
    cfg = _load(config, overrides, run_id=run_id)
    cfg.evaluate.num_shards = 1  # one local process evaluates everything; no shards to gather
    if checkpoint and "://" not in checkpoint and not Path(checkpoint).exists():
        from components.core.hub import bare_to_spec

        checkpoint = bare_to_spec(checkpoint, dataset=False) or checkpoint  # a Hub id
    if checkpoint:
        result = run_stage(evaluate_external, cfg, checkpoint=checkpoint, force=force)
        name = checkpoint.rstrip("/").rsplit("/", 1)[-1] or checkpoint
        Console().print(*eval_tables(result["root"], label=name))
        console.print(f"evaluated {checkpoint}")
        console.print(f"metrics, samples and plots: {RunLayout(result['root']).evals(0)}/")
        return
    if watch:
        run_stage(watch_run, cfg, poll_s=poll_s, timeout_s=timeout_s, force=force)
    else:
        from components.evaluate.stage import resolve_checkpoint
        from components.evaluate.stage import run as evaluate

        c = run_stage(resolve_checkpoint, cfg, spec="latest")
        run_stage(evaluate, cfg, iteration=c, force=force)
    Console().print(*eval_tables(cfg))


def _run_dir(run_dir: str) -> tuple[Any, str]:
    """The store and root of the run at `run_dir`; a UserError (exit 2) where it is not one."""
    store, root = get_store(run_dir), run_dir.rstrip("/")
    if not store.exists(RunLayout(root).run_yaml):
        raise UserError(
            f"{run_dir} is not a run: it has no run.yaml (give the run's directory or URI, "
            "<run.store>/<run_id>, e.g. rlvr-runs/arithmetic)"
        )
    return store, root


@main.command(help="Print every checkpoint's metrics and regenerate the run's plots and report.")
@click.argument("run_dir")
def report(run_dir: str) -> None:
    from components.report.run_report import write_run_report

    store, root = _run_dir(run_dir)
    Console().print(*eval_tables(run_dir))
    print_health(store, root)
    paths = run_stage(lambda _cfg: write_run_report(get_store(run_dir), run_dir), None)
    console.print(f"plots and report: {paths['report.md']}")
    console.print(f"dashboard: {paths['index.html']}")


@main.command(
    help="Apply the retention policy to a run now: delete the files of the checkpoints and "
    "train states it does not keep (their manifests stay)."
)
@click.argument("run_dir")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted, delete nothing.")
@click.option(
    "--set", "overrides", multiple=True, help="Override a retention key: retention.keep_last=5"
)
def prune(run_dir: str, dry_run: bool, overrides: tuple[str, ...]) -> None:
    import yaml

    from components.core.config import apply_overrides
    from components.core.retention import planned, sweep

    store, root = _run_dir(run_dir)
    raw = yaml.safe_load(store.read_text(RunLayout(root).run_yaml))
    if "://" in root and not root.startswith("file://"):  # s3://bucket/prefix/RUN
        parent, run_id = root.rsplit("/", 1)
    else:
        local = Path(root.removeprefix("file://")).resolve()
        parent, run_id = str(local.parent), local.name
    raw["run"] = {**raw.get("run", {}), "store": parent, "run_id": run_id}
    cfg = RunConfig.model_validate(apply_overrides(raw, list(overrides)))
    if dry_run:
        ckpts, states = planned(cfg)
        console.print(f"would delete checkpoints {ckpts} and train states {states}")
        return
    done = sweep(cfg, "rlvr prune")
    console.print(f"deleted the files of {len(done)} checkpoint(s) and state(s)")


@main.command(help="Fold a LoRA adapter checkpoint into its base: a plain HF checkpoint to serve.")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--merge",
    "do_merge",
    is_flag=True,
    required=True,
    help="Merge the adapter into the base weights (the only export there is).",
)
@click.option(
    "--base",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="The base checkpoint (default: the run's checkpoints/00000 beside CHECKPOINT).",
)
def export(checkpoint: str, out: str, do_merge: bool, base: str | None) -> None:
    from components.model.adapter import merge

    base_dir = Path(base) if base else Path(checkpoint).resolve().parent / "00000"
    if not base_dir.is_dir():
        raise UserError(f"no base checkpoint at {base_dir}; pass --base DIR")
    merged = merge(base_dir, Path(checkpoint), Path(out))  # Adapter/CheckpointError: exit 2
    console.print(f"merged checkpoint: {merged}")


def entry() -> None:
    """The `rlvr` program: `main`, then a quick exit (components/core/quick_exit.py: the
    interpreter's teardown took about 1 s after `rlvr run`). In-process callers (tests,
    CliRunner) call `main` and exit normally."""
    from components.core.quick_exit import run_then_exit

    run_then_exit(main)


if __name__ == "__main__":
    entry()
