"""`rlvr check CONFIG`: the whole run, checked before any stage does work.

It runs every stage's own checks (the stages run them again for their section when they start)
and reports every problem at once, each naming the file, row or key and the fix:

- the train section: algorithm names, option keys, the objective on a test batch;
- evaluation settings: ks, data-source filters;
- the store: reachable and writable;
- the base checkpoint: config.json, whole safetensors files, a loadable tokenizer with a pad token;
- every dataset, scanned whole: columns, null or empty prompts, missing ground truths, prompt
  lengths against `generate.max_prompt_tokens` and the model's context;
- the verifiers: every spec resolves, every data_source has one, each is called once on a
  sample row under the verify deadline.

`rlvr run` runs all of it first; `compile` and `submit` run what does not need the inputs (they
may live where only the cluster can read them) and warn about local paths a pod cannot see.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from components.core.config import RunConfig
from components.core.errors import Problems
from components.core.hub import HubError, is_hub, materialize
from components.core.preflight import check_store, scan_dataset
from components.core.schemas import SchemaError, read_parquet
from components.core.store import StoreError, get_store, is_s3
from components.model.checkpoint import check_checkpoint_dir


def _eval_settings(cfg: RunConfig, problems: Problems) -> None:
    from components.evaluate.metrics import default_ks

    for ev in cfg.data.eval:
        try:
            default_ks(ev.n, [*cfg.evaluate.ks, *ev.ks])
        except ValueError as e:
            problems.error(f"config data.eval[{ev.name}].ks / evaluate.ks (n={ev.n})", str(e))


def _read(uri: str, cfg: RunConfig, problems: Problems, key: str) -> pa.Table | None:
    try:
        path = materialize(uri)[0] if is_hub(uri) else uri
        return read_parquet(get_store(path, cfg.run.s3_endpoint_url), path)
    except HubError as e:
        problems.error(f"config {key}", str(e))
    except (SchemaError, StoreError) as e:
        problems.error(f"config {key} ({uri})", str(e).removeprefix(f"{uri}: "))
    except FileNotFoundError:
        problems.error(f"config {key}", f"{uri} does not exist")
    return None


def local_paths(cfg: RunConfig) -> list[tuple[str, str]]:
    """(config key, path) of the store and every input that exists on this machine only: a
    cluster's pods cannot reach them (object-store and Hub URIs they can)."""
    entries = [
        ("run.store", cfg.run.store),
        ("model.base", cfg.model.base),
        ("data.train", cfg.data.train),
    ]
    entries += [(f"data.eval.{i}.path", e.path) for i, e in enumerate(cfg.data.eval)]
    entries += [
        (f"data.eval[{s.name}].include_path", s.include_path)
        for s in cfg.data.lm_eval
        if s.include_path
    ]
    return [(key, uri) for key, uri in entries if not is_s3(uri) and not is_hub(uri)]


def _local_path_advice(cfg: RunConfig) -> list[tuple[str, str]]:
    """(config key, what is wrong and what to do) per ``local_paths`` entry."""
    out = []
    for key, path in local_paths(cfg):
        if key == "run.store":
            out.append(
                (
                    key,
                    f"is a local path ({path}): pods on a cluster cannot reach it; use "
                    "an object store URI (s3://bucket/prefix) for a pipeline that runs "
                    "there",
                )
            )
        elif key.endswith(".include_path"):
            out.append(
                (
                    key,
                    f"is a directory on this machine ({path}): the evaluate pods read it at "
                    "the same path, so mount it there (a volume) or build it into the "
                    "evaluate image",
                )
            )
        else:
            out.append((key, f"is a local path ({path}): upload it and give its URI"))
    return out


def local_path_warnings(cfg: RunConfig) -> list[str]:
    """One line per input or store a cluster cannot reach (`rlvr compile` prints them)."""
    return [f"{key} {advice}" for key, advice in _local_path_advice(cfg)]


def _local_paths_for_a_cluster(cfg: RunConfig, problems: Problems) -> None:
    for key, advice in _local_path_advice(cfg):
        problems.warn(f"config {key}", advice)


def check_run(cfg: RunConfig, *, inputs: bool = True, for_cluster: bool = False) -> Problems:
    """Every problem of a run config; `inputs=False` skips what needs the datasets, checkpoint
    and store (compile / submit)."""
    from components.core.tracking import check_tracking
    from components.train.checks import check_lora, check_train
    from components.verify.checks import check_verifier_specs, check_verify

    problems = Problems()
    check_train(cfg, problems)
    check_lora(cfg, problems)
    _eval_settings(cfg, problems)
    if cfg.data.lm_eval:  # every task resolves and its data can be read (a few seconds)
        from components.evaluate.lm_eval_suite import check_suites

        check_suites(cfg, problems, inputs=inputs, for_cluster=for_cluster)
    check_tracking(cfg, problems, for_cluster=for_cluster)
    if for_cluster:
        _local_paths_for_a_cluster(cfg, problems)
    if not inputs:
        check_verifier_specs(cfg, problems)
        return problems

    check_store(get_store(cfg.run.store, cfg.run.s3_endpoint_url), cfg.run.store, problems)
    datasets = _datasets(cfg, problems)
    _check_policy(cfg, datasets, problems, for_cluster=for_cluster)
    check_verify(cfg, datasets, problems)
    if "train" in datasets:
        from components.generate.checks import check_curriculum

        check_curriculum(cfg, problems, datasets["train"][1])
    return problems


def _datasets(cfg: RunConfig, problems: Problems) -> dict[str, tuple[str, pa.Table]]:
    """The train and eval sets that read without an error ({name: (uri, table)}), each
    scanned, and each eval set's `data_sources` matched against its rows."""
    datasets: dict[str, tuple[str, pa.Table]] = {}
    for name, uri, key in [
        ("train", cfg.data.train, "data.train"),
        *((e.name, e.path, f"data.eval[{e.name}].path") for e in cfg.data.eval),
    ]:
        table = _read(uri, cfg, problems, key)
        if table is None:
            continue
        before = len(problems.errors)
        scan_dataset(table, uri, problems)
        if len(problems.errors) == before:
            datasets[name] = (uri, table)
    for ev in cfg.data.eval:
        if ev.data_sources and ev.name in datasets:
            uri, table = datasets[ev.name]
            if not pc.any(pc.is_in(table.column("data_source"), pa.array(ev.data_sources))).as_py():
                problems.error(
                    f"config data.eval[{ev.name}].data_sources",
                    f"{ev.data_sources} matches no row of {uri}",
                )
    return datasets


def _check_policy(
    cfg: RunConfig,
    datasets: dict[str, tuple[str, pa.Table]],
    problems: Problems,
    *,
    for_cluster: bool,
) -> None:
    """The base model, and what depends on it: the prompts against its tokenizer and context,
    image prompts against its processor, LoRA targets, gradient checkpointing. A base on S3 is
    only checked for a config.json; the image prompts are then checked on their own."""
    from components.generate.image_checks import check_images

    base = cfg.model.base
    if is_hub(base):
        try:
            base = materialize(base)[0]  # checked like a local directory below
        except HubError as e:
            problems.error("config model.base", str(e))
            base = ""
    loaded: dict[str, Any] = {}
    if base and is_s3(base):
        try:
            get_store(base, cfg.run.s3_endpoint_url).read_text(base.rstrip("/") + "/config.json")
        except StoreError as e:
            problems.error("config model.base", f"{base} has no readable config.json ({e})")
    elif base and check_checkpoint_dir(
        Path(base), f"config model.base ({base})", problems, loaded=loaded
    ):
        _check_against_policy(cfg, datasets, problems, Path(base), loaded, for_cluster)
        return
    check_images(cfg, datasets, None, None, None, problems)  # the images on their own


def _check_against_policy(
    cfg: RunConfig,
    datasets: dict[str, tuple[str, pa.Table]],
    problems: Problems,
    base: Path,
    loaded: dict[str, Any],
    for_cluster: bool,
) -> None:
    from components.generate.checks import check_generate, check_local_dtype
    from components.generate.image_checks import check_images
    from components.train.checks import check_checkpointing, check_lora_targets

    if not for_cluster:
        check_local_dtype(cfg, problems)
    model_config, tokenizer = loaded["config"], loaded["tokenizer"]
    check_generate(cfg, tokenizer, model_config, datasets, problems)
    check_images(cfg, datasets, model_config, base, tokenizer, problems)
    check_lora_targets(cfg, problems, model_config)
    check_checkpointing(cfg, problems, model_config)


def run_check(cfg: RunConfig, *, inputs: bool = True, for_cluster: bool = False) -> float:
    """Check and raise one PreflightError with every error (exit 2 from the CLI); warnings are
    printed. Returns the seconds it took."""
    import sys

    t0 = time.perf_counter()
    problems = check_run(cfg, inputs=inputs, for_cluster=for_cluster)
    for w in problems.warnings:
        print(f"warning: {w}", file=sys.stderr)
    problems.raise_if_any("the run config does not check out")
    return time.perf_counter() - t0
