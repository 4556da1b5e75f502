"""The `rlvr` command line.

    rlvr run CONFIG [--run-id ID] [--iterations N] [--set k=v ...]   whole pipeline on kfp.local
    rlvr stage NAME CONFIG --run-id ID --iteration I [--force]       one stage of one iteration
    rlvr compile CONFIG -o pipeline.yaml                             KFP v2 IR YAML for a cluster
    rlvr report RUN_DIR                                              table of every evaluation

`run` prepares the example inputs if the config names a `prepare` module and an input is missing,
writes the resolved config as run.yaml, then executes the same pipeline function a cluster runs,
on KFP's local SubprocessRunner. Re-running with the same run id resumes: committed stages skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from components.core.config import ConfigError, RunConfig, load_config
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.stage_cli import run_stage, setup_logging
from components.core.store import get_store, join

console = Console(stderr=True)


def _load(config: str, overrides: tuple[str, ...], **kw) -> RunConfig:
    try:
        return load_config(config, list(overrides), **kw)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def _stage_fns():
    from components.core import run_setup
    from components.evaluate import stage as evaluate
    from components.generate import stage as generate
    from components.train import stage as train
    from components.verify import stage as verify

    return {
        "init": run_setup.run,
        "generate": generate.run,
        "verify": verify.run,
        "train": train.run,
        "evaluate": evaluate.run,
    }


def prepare_inputs(cfg: RunConfig) -> None:
    """Run the config's prepare module when the base model or a dataset is missing."""
    inputs = [cfg.model.base, cfg.data.train, *(e.path for e in cfg.data.eval)]
    missing = [p for p in inputs if "://" not in p and not Path(p).exists()]
    if not missing:
        return
    if cfg.prepare is None or not cfg.prepare.module:
        click.echo(
            f"error: input(s) {missing} do not exist and the config has no prepare step", err=True
        )
        sys.exit(2)
    cmd = [sys.executable, "-m", cfg.prepare.module]
    if cfg.prepare.out:
        cmd += ["--out", cfg.prepare.out]
    console.print(f"[bold]preparing inputs[/]: {' '.join(cmd)}")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(cmd, cwd=root)
    if proc.returncode != 0:
        click.echo(f"error: prepare step {cfg.prepare.module} failed ({proc.returncode})", err=True)
        sys.exit(proc.returncode)
    still = [p for p in inputs if "://" not in p and not Path(p).exists()]
    if still:
        click.echo(f"error: prepare step ran but {still} still do not exist", err=True)
        sys.exit(2)


def eval_table(cfg_or_root: RunConfig | str) -> Table:
    """A rich table of every committed evaluation of a run."""
    if isinstance(cfg_or_root, RunConfig):
        store, root = store_for(cfg_or_root), RunLayout.of(cfg_or_root).root
    else:
        store, root = get_store(cfg_or_root), cfg_or_root.rstrip("/")
    table = Table(title=f"held-out evaluation: {root}")
    table.add_column("checkpoint")
    table.add_column("eval set")
    table.add_column("pass@1", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("mean@n", justify="right")
    table.add_column("best pass@k", justify="right")
    for c in committed_indices(store, join(root, "evals")):
        top = json.loads(store.read_text(join(root, "evals", f"{c:05d}", "metrics.json")))
        for name, m in top["sets"].items():
            ov, n = m["overall"], m["n"]
            ci = ov.get("pass@1_ci95")
            ks = [int(k.split("@")[1]) for k in ov if k.startswith("pass@") and "_" not in k]
            kmax = max(ks)
            table.add_row(
                f"{c:05d}",
                name,
                f"{ov['pass@1']:.3f}",
                f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-",
                f"{ov[f'mean@{n}']:.3f}",
                f"pass@{kmax} {ov[f'pass@{kmax}']:.3f}",
            )
    return table


@click.group(help="rlvr: RL from verifiable rewards as Kubeflow Pipelines stages.")
def main() -> None:
    pass


@main.command(help="Run the training pipeline on KFP's local runner (resumes an existing run id).")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option(
    "--run-id", default=None, help="Run id (default: run.run_id, else the config's folder)."
)
@click.option("--iterations", type=int, default=None, help="Override run.iterations.")
@click.option("--set", "overrides", multiple=True, help="Override a config key: a.b=value")
def run(
    config: str, run_id: str | None, iterations: int | None, overrides: tuple[str, ...]
) -> None:
    cfg = _load(config, overrides, run_id=run_id, iterations=iterations)
    prepare_inputs(cfg)
    from pipelines.train import run_local

    layout, store = RunLayout.of(cfg), store_for(cfg)
    store.write_text(layout.run_yaml, cfg.to_yaml())
    console.print(
        f"[bold]rlvr run[/] {cfg.run_id}: {cfg.run.iterations} iterations -> {layout.root}"
    )
    t0 = time.perf_counter()
    pipeline_root = (
        str(Path(layout.root) / "kfp") if "://" not in layout.root else "./local_outputs"
    )
    try:
        run_local(cfg, pipeline_root)
    except RuntimeError as e:
        console.print(f"[red]pipeline failed[/]: {e}")
        console.print(f"fix the cause and rerun the same command to resume run {cfg.run_id}")
        sys.exit(1)
    elapsed = time.perf_counter() - t0
    Console().print(eval_table(cfg))
    console.print(f"done in {elapsed:.0f} s; outputs under {layout.root}")


@main.command(help="Run one stage of one iteration (what that stage's container runs).")
@click.argument("name", type=click.Choice(["init", "generate", "verify", "train", "evaluate"]))
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
@click.option("--set", "overrides", multiple=True, help="Override a config key: a.b=value")
def stage(
    name: str, config: str, run_id: str | None, iteration: int, force: bool, overrides: tuple
) -> None:
    setup_logging()
    cfg = _load(config, overrides, run_id=run_id)
    result = run_stage(_stage_fns()[name], cfg, iteration=iteration, force=force)
    click.echo(json.dumps(result, indent=2, default=str))


@main.command(name="compile", help="Compile the training pipeline to KFP v2 IR YAML.")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--run-id", default=None)
@click.option("--iterations", type=int, default=None)
@click.option("--set", "overrides", multiple=True)
def compile_cmd(
    config: str, output: str, run_id: str | None, iterations: int | None, overrides: tuple
) -> None:
    from pipelines.train import compile_pipeline

    cfg = _load(config, overrides, run_id=run_id, iterations=iterations)
    compile_pipeline(cfg, output)
    click.echo(output)


@main.command(help="Print the evaluation table of a run directory (local path or s3:// URI).")
@click.argument("run_dir")
def report(run_dir: str) -> None:
    Console().print(eval_table(run_dir))


if __name__ == "__main__":
    main()
