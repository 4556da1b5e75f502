"""One iteration's inputs to the train stage, read and checked before anything is written.

The scored rollouts of iteration i, what generate recorded about how they were sampled (its
temperature, its logprobs' definition), and the checks between them and the config: staleness
within `train.max_staleness`, logprobs defined as the trainer computes them where an option needs
that. Both a new update and a replayed one (a resume, components/train/stage.py) read their
inputs here, so a replay sees exactly what the original update saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from components.core.commit import committed_files, committed_parts, read_manifest
from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout
from components.core.schemas import read_records
from components.core.store import Store
from components.model.backends import LOGPROB_DEFINITION
from components.train.batching import Rollouts


def generation_stats(store: Store, rollouts_uri: str) -> dict[str, Any]:
    """The generate manifest stats (of the first shard when sharded: settings are shared)."""
    return read_manifest(store, committed_parts(store, rollouts_uri)[0])["stats"]


def check_staleness(table, iteration: int, max_staleness: int, source: str) -> dict[str, float]:
    """Refuse rollouts sampled by a policy more than `max_staleness` checkpoints behind; return
    the staleness metrics."""
    versions = np.asarray(table.column("policy_version").to_numpy(zero_copy_only=False), np.int64)
    lag = iteration - versions
    if lag.size and (lag.max() > max_staleness or lag.min() < 0):
        worst = int(versions[np.argmax(np.abs(lag - max_staleness / 2))])
        raise StageError(
            f"{source}: rollouts were sampled by checkpoint {worst:05d}, but iteration {iteration} "
            f"trains checkpoint {iteration:05d} and train.max_staleness={max_staleness} allows "
            f"checkpoints {max(0, iteration - max_staleness):05d}..{iteration:05d}; regenerate "
            "them (rlvr stage generate --force) or raise train.max_staleness"
        )
    return {
        "train/staleness_mean": float(lag.mean()) if lag.size else 0.0,
        "train/staleness_max": float(lag.max()) if lag.size else 0.0,
    }


def require_trainer_logprobs(definition: str | None, setting: str, fix: str) -> None:
    """A StageError unless the rollouts' logprobs are defined as the trainer computes them,
    which `train.<setting>` needs."""
    if definition != LOGPROB_DEFINITION:
        raise StageError(
            f"train.{setting} needs rollout logprobs defined as the trainer computes them "
            f"({LOGPROB_DEFINITION!r}); the rollouts record {definition!r}. {fix}"
        )


def old_logprobs_from_rollout(
    cfg: RunConfig, sampled: dict[str, Any], staleness_max: float
) -> bool:
    """Whether this iteration's old logprobs are the sampler's (train.old_logprobs). `auto`
    takes them only where they are the trainer's to float precision: rollouts of this very
    checkpoint whose logprobs the transformers sampler computed (as its manifest records,
    `sampled`: the generate stats) in float32 on the trainer's own kind of device, a float32
    trainer, and nothing that changes the forward (LoRA, tools) or needs the trainer's own pass
    (rollout correction compares the two; forking tokens need its entropy)."""
    from components.model.checkpoint import device_and_dtype

    t, g = cfg.train, cfg.generate
    definition = sampled.get("logprob_definition")
    if t.old_logprobs == "recompute":
        return False
    if definition != LOGPROB_DEFINITION:
        if t.old_logprobs == "rollout":
            require_trainer_logprobs(
                definition, "old_logprobs: rollout", "Set train.old_logprobs: recompute (or auto)"
            )
        return False
    if t.old_logprobs == "rollout":
        return True
    device, dtype = device_and_dtype(t.dtype)
    return (
        staleness_max == 0
        and sampled.get("backend") == "transformers"
        and sampled.get("dtype") == "float32"
        and sampled.get("device") == device
        and dtype == torch.float32
        and cfg.model.lora is None
        and not (g.tools or g.environment)
        and t.rollout_correction is None
        and t.forking_top_rho is None
    )


@dataclass
class IterationInputs:
    """What one update of iteration `iteration` reads."""

    iteration: int
    rollouts: Rollouts
    staleness: dict[str, float]
    temperature: float
    definition: str | None
    """How the sampler defined the rollouts' logprobs (its manifest's `logprob_definition`)."""
    old_from_rollout: bool

    @classmethod
    def read(cls, cfg: RunConfig, store: Store, layout: RunLayout, i: int) -> IterationInputs:
        t = cfg.train
        scored_parts = committed_files(store, layout.scored(i), ".parquet")
        table = read_records(store, scored_parts, "scored")
        if table.num_rows == 0:
            raise StageError(f"{layout.scored(i)} holds no scored rollouts")
        staleness = check_staleness(table, i, t.max_staleness, layout.scored(i))
        ro = Rollouts.from_table(table, layout.scored(i))
        sampled = generation_stats(store, layout.rollouts(i))
        temperature = float(
            sampled.get("sampling", {}).get("temperature", cfg.generate.temperature)
        )
        definition = sampled.get("logprob_definition")
        if t.rollout_correction is not None:
            require_trainer_logprobs(
                definition,
                "rollout_correction",
                "Regenerate with a matching backend, or turn rollout_correction off",
            )
        old = old_logprobs_from_rollout(cfg, sampled, staleness["train/staleness_max"])
        return cls(i, ro, staleness, temperature, definition, old)
