"""Set a run up in the store: the resolved config, the base policy and the datasets, copied in.

    rlvr stage init CONFIG --run-id ID

A run is self-contained: `checkpoints/00000` is a copy of `model.base` and `data/` holds copies
of the train and eval sets, each committed with `_SUCCESS`, so every later stage reads only from
the run directory. `run.yaml` records the resolved config; a rerun with a different config
keeps the committed inputs (they are the run's) and rewrites run.yaml.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from components.core.commit import OutputDir
from components.core.config import RunConfig
from components.core.errors import Problems
from components.core.hub import HubError, is_hub, materialize
from components.core.layout import RunLayout, store_for
from components.core.preflight import scan_dataset
from components.core.schemas import SchemaError, read_dataset, read_parquet
from components.core.store import StoreError, get_store
from components.model.checkpoint import check_checkpoint_dir, import_checkpoint

log = logging.getLogger("rlvr.init")


def _local(src: str) -> tuple[str, dict[str, str]]:
    """Where to read an input from, and what the manifest says of its origin: a Hub input
    is downloaded once (``components.core.hub``) and recorded with its revision."""
    if is_hub(src):
        path, revision = materialize(src)
        return path, {"source": src, "revision": revision}
    return src, {"source": src}


def _copy_dataset(cfg: RunConfig, src: str, out: OutputDir) -> None:
    path, origin = _local(src)
    src_store = get_store(path, cfg.run.s3_endpoint_url)
    data = src_store.read_bytes(path)
    out.begin(force=True)
    out.put_bytes(data, Path(path).name if not path.endswith("/") else "data.parquet")
    out.commit({**origin, "rows": read_dataset(src_store, path).num_rows})


#: Set (to "1") by `rlvr run` for its init task when `rlvr check` passed in the same process just
#: before: the base checkpoint's load check (transformers, torch and the tokenizer: seconds of CPU
#: beside the workers' start-up) is not repeated. Never set for a cluster run.
INPUTS_CHECKED_ENV = "RLVR_INPUTS_CHECKED"


def run(cfg: RunConfig, iteration: int = 0, *, force: bool = False) -> dict[str, Any]:
    """Copy the base checkpoint and datasets into the run (idempotent). Every input that will
    be copied is checked first, whole (every dataset row, the checkpoint's config, weights and
    tokenizer), so a bad one fails init with every problem named and nothing copied; the
    checkpoint's load check is skipped where `rlvr run` has just made it (INPUTS_CHECKED_ENV)."""
    store, layout = store_for(cfg), RunLayout.of(cfg)
    datasets = [("train", cfg.data.train, OutputDir(store, layout.train_data, "init"))]
    datasets += [
        (f"eval/{ev.name}", ev.path, OutputDir(store, layout.eval_data(ev.name), "init"))
        for ev in cfg.data.eval
    ]
    todo = [(name, src, out) for name, src, out in datasets if force or not out.is_committed()]
    base = OutputDir(store, layout.checkpoint(0), "init")
    copy_base = force or not base.is_committed()

    problems = Problems()
    for _name, src, _out in todo:
        try:
            path, _origin = _local(src)
            scan_dataset(
                read_parquet(get_store(path, cfg.run.s3_endpoint_url), path), src, problems
            )
        except (SchemaError, StoreError, HubError) as e:
            problems.error(src, str(e).removeprefix(f"{src}: "))
    check_base = copy_base and os.environ.get(INPUTS_CHECKED_ENV) != "1"
    if check_base and "://" not in cfg.model.base:
        check_checkpoint_dir(Path(cfg.model.base), f"model.base ({cfg.model.base})", problems)
    elif check_base and is_hub(cfg.model.base):
        try:
            local, _rev = materialize(cfg.model.base)
            check_checkpoint_dir(Path(local), f"model.base ({cfg.model.base})", problems)
        except HubError as e:
            problems.error("model.base", str(e))
    problems.raise_if_any("init: inputs")

    store.write_text(layout.run_yaml, cfg.to_yaml())
    done = {name: False for name, _, _ in datasets}
    for name, src, out in todo:
        _copy_dataset(cfg, src, out)
        done[name] = True
    done["checkpoint"] = copy_base
    if copy_base:
        import_checkpoint(cfg.model.base, base, cfg.run.s3_endpoint_url)
    log.info("run %s set up at %s (%s)", cfg.run_id, layout.root, done)
    return {"root": layout.root, "copied": done}
