"""The thin command line every stage shares: `python -m components.<stage> CONFIG ...`.

It is what a stage's container runs. It loads and validates the config, calls the stage's
`run(config, iteration, force=...)` and prints the result as JSON. Any error in the inputs exits
with status 2 and a message naming the file, field or column; nothing is committed.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from components.core.config import RunConfig, load_config

StageFn = Callable[..., dict[str, Any]]


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True
    )


def run_stage(fn: StageFn, cfg: RunConfig, **kwargs: Any) -> dict[str, Any]:
    """Call a stage, turning input errors into a clean message and exit status 2."""
    from components.core.errors import USER_ERRORS

    try:
        return fn(cfg, **kwargs)
    except USER_ERRORS as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


#: CONFIG given as `env:NAME`: the resolved config's JSON is in environment variable NAME (how a
#: multi-node train job hands every pod the config the pipeline task resolved).
ENV_CONFIG_PREFIX = "env:"


def config_from_arg(config: str, overrides: list[str], run_id: str | None = None) -> RunConfig:
    """The config a stage command names: a file, or `env:NAME` (a resolved config's JSON)."""
    import os

    from components.core.config import ConfigError, from_pipeline

    if not config.startswith(ENV_CONFIG_PREFIX):
        return load_config(config, overrides, run_id=run_id)
    name = config[len(ENV_CONFIG_PREFIX) :]
    if name not in os.environ:
        raise ConfigError(
            f"{config}: environment variable {name} is not set; it must hold the "
            "resolved config's JSON (set it, or pass a config file)"
        )
    if overrides:
        raise ConfigError(
            f"{config}: --set applies to config files only; a resolved config is used as it is"
        )
    try:
        return from_pipeline(os.environ[name], run_id or "")
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"{config}: not a valid resolved config ({e})") from None


def stage_command(
    name: str, fn: StageFn, *, shardable: bool = False, serve: StageFn | None = None
) -> click.Command:
    @click.command(name=name, help=f"Run the {name} stage of one iteration (or serve a segment).")
    @click.argument("config", type=click.Path(dir_okay=False))
    @click.option("--run-id", default=None, help="Run id (default: from the config).")
    @click.option("--iteration", "-i", type=int, default=0, show_default=True)
    @click.option("--force", is_flag=True, help="Redo even if the output is committed.")
    @click.option("--set", "overrides", multiple=True, help="Override a config key: a.b=value")
    @click.option("--shard", type=int, default=0, show_default=True, hidden=not shardable)
    @click.option("--num-shards", type=int, default=1, show_default=True, hidden=not shardable)
    @click.option(
        "--segment",
        type=int,
        default=None,
        hidden=serve is None,
        help="Serve every iteration of this segment, warm (what a worker task runs).",
    )
    @click.option(
        "--attempt",
        default=None,
        hidden=True,
        help="With --segment: the pipeline run's attempt id (failure markers, plan).",
    )
    @click.option(
        "--retried",
        is_flag=True,
        hidden=True,
        help="With --segment: KFP retries this task (peers wait for it).",
    )
    def cmd(
        config: str,
        run_id: str | None,
        iteration: int,
        force: bool,
        overrides: tuple,
        shard: int,
        num_shards: int,
        segment: int | None,
        attempt: str | None,
        retried: bool,
    ) -> None:
        from components.core.config import ConfigError

        setup_logging()
        try:
            cfg = config_from_arg(config, list(overrides), run_id=run_id)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        kwargs = {"shard": shard, "num_shards": num_shards} if shardable else {}
        if not shardable and (shard, num_shards) != (0, 1):
            click.echo(f"error: the {name} stage is not sharded", err=True)
            sys.exit(2)
        if segment is not None:
            if serve is None:
                click.echo(f"error: the {name} stage has no --segment worker", err=True)
                sys.exit(2)
            result = run_stage(
                serve, cfg, segment=segment, attempt=attempt, retried=retried, **kwargs
            )
        else:
            result = run_stage(fn, cfg, iteration=iteration, force=force, **kwargs)
        click.echo(json.dumps(result, indent=2, default=str))

    return cmd


STAGE_MODULES = {
    "init": "components.model.run_setup",
    "generate": "components.generate.stage",
    "verify": "components.verify.stage",
    "train": "components.train.launch",
    "evaluate": "components.evaluate.stage",
}


def run_from_pipeline(stage: str, params: dict[str, str], **kwargs: Any) -> str:
    """What a pipeline component does: rebuild the effective config from the pipeline parameters
    (config_json, run_id, store, base_checkpoint, eval_sets), run one stage, return JSON."""
    import importlib

    from components.core.config import effective_config

    cfg = effective_config(**params)
    result = importlib.import_module(STAGE_MODULES[stage]).run(cfg, **kwargs)
    return json.dumps({k: v for k, v in result.items() if k != "metrics"}, default=str)


def serve_from_pipeline(stage: str, params: dict[str, str], **kwargs: Any) -> str:
    """What a worker component does: rebuild the effective config, serve one segment of one
    stage (components/core/warm.py), return JSON."""
    import importlib

    from components.core.config import effective_config
    from components.core.quick_exit import quick_exit_after_success

    setup_logging()
    served = quick_exit_after_success()
    cfg = effective_config(**params)
    result = importlib.import_module(STAGE_MODULES[stage]).serve(cfg, **kwargs)
    served.set()
    return json.dumps(result, default=str)


def segment_train_figures(params: dict[str, str], segment: int) -> dict[str, float]:
    """What a train worker shows in the KFP UI: the train and health figures of the newest
    checkpoint its segment committed (the segment's last, or the one after which the run
    stopped under its health rule); {} when it committed none."""
    from components.core.commit import read_manifest
    from components.core.config import effective_config
    from components.core.layout import RunLayout, committed_indices, store_for
    from components.core.warm import segment as segment_of

    cfg = effective_config(**params)
    store, layout, seg = store_for(cfg), RunLayout.of(cfg), segment_of(cfg, segment)
    done = [
        c for c in committed_indices(store, layout.checkpoints_dir) if seg.start < c <= seg.stop
    ]
    if not done:
        return {}
    stats = read_manifest(store, layout.checkpoint(done[-1]))["stats"]
    return {
        k: float(v)
        for k, v in stats.items()
        if isinstance(v, int | float) and k.startswith(("train/", "health/"))
    }
