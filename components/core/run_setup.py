"""Set a run up in the store: the resolved config, the base policy and the datasets, copied in.

    rlvr stage init CONFIG --run-id ID

A run is self-contained: `checkpoints/00000` is a copy of `model.base` and `data/` holds copies
of the train and eval sets, each committed with `_SUCCESS`, so every later stage reads only from
the run directory. `run.yaml` records the resolved config; a rerun with a different config
keeps the committed inputs (they are the run's) and rewrites run.yaml.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components.core.checkpoint import import_checkpoint
from components.core.commit import OutputDir
from components.core.config import RunConfig
from components.core.layout import RunLayout, store_for
from components.core.schemas import read_dataset
from components.core.store import get_store

log = logging.getLogger("rlvr.init")


def _copy_dataset(cfg: RunConfig, src: str, out: OutputDir, force: bool) -> bool:
    if out.is_committed() and not force:
        return False
    src_store = get_store(src, cfg.run.s3_endpoint_url)
    table = read_dataset(src_store, src)  # validate before touching the run
    data = src_store.read_bytes(src)
    out.begin(force=True)
    out.put_bytes(data, Path(src).name if not src.endswith("/") else "data.parquet")
    out.commit({"source": src, "rows": table.num_rows})
    return True


def run(cfg: RunConfig, iteration: int = 0, *, force: bool = False) -> dict[str, Any]:
    """Copy the base checkpoint and datasets into the run (idempotent)."""
    del iteration  # init has no iteration; the argument keeps the stage signature uniform
    store, layout = store_for(cfg), RunLayout.of(cfg)
    store.write_text(layout.run_yaml, cfg.to_yaml())
    done = {
        "train": _copy_dataset(
            cfg, cfg.data.train, OutputDir(store, layout.train_data, "init"), force
        )
    }
    for ev in cfg.data.eval:
        out = OutputDir(store, layout.eval_data(ev.name), "init")
        done[f"eval/{ev.name}"] = _copy_dataset(cfg, ev.path, out, force)
    base = OutputDir(store, layout.checkpoint(0), "init")
    done["checkpoint"] = not base.is_committed() or force
    if done["checkpoint"]:
        import_checkpoint(cfg.model.base, base, cfg.run.s3_endpoint_url)
    log.info("run %s set up at %s (%s)", cfg.run_id, layout.root, done)
    return {"root": layout.root, "copied": done}
