"""One iteration's inputs to the train stage, read and checked before anything is written.

The scored rollouts of iteration i, what generate recorded about how they were sampled (its
temperature, its logprobs' definition), and the checks between them and the config: staleness
within `train.max_staleness`, logprobs defined as the trainer computes them where an option needs
that; and where the iteration's old logprobs come from, decided once (`decide_old_logprobs`).
Both a new update and a replayed one (a resume, components/train/stage.py) read their inputs
here, so a replay sees exactly what the original update saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
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


class OldLogprobs(Enum):
    """Where PPO's old logprobs come from in one iteration (train.old_logprobs)."""

    ROLLOUT = "rollout"
    """The sampler's, as the rollouts record them: no no-grad pass."""
    RECOMPUTE = "recompute"
    """The trainer's own no-grad pass over every rollout, before any update."""


class Why(Enum):
    """Why an iteration's old logprobs come from where they do: `train.old_logprobs` names the
    source, or `auto` takes the sampler's where they equal the trainer's to float precision and
    names the first thing that keeps them from being so."""

    ASKED = "train.old_logprobs names the source"
    OTHER_DEFINITION = "the rollouts' logprobs are not defined as the trainer computes them"
    STALE = "an older checkpoint sampled some of the rollouts"
    SAMPLER_BACKEND = "a sampler other than transformers computed them"
    SAMPLER_DTYPE = "the sampler did not compute them in float32"
    SAMPLER_DEVICE = "the sampler ran on another kind of device than the trainer"
    TRAINER_DTYPE = "the trainer is not float32"
    LORA = "LoRA changes the trainer's forward"
    TOOLS = "tools or an environment change what the forward sees"
    ROLLOUT_CORRECTION = "rollout correction compares the sampler's with the trainer's own"
    FORKING_TOKENS = "forking tokens need the trainer's own entropy"
    EQUAL = "the sampler's equal the trainer's to float precision"


@dataclass(frozen=True)
class OldLogprobsChoice:
    """One iteration's old-logprobs source and why. With `check` (auto took the sampler's), the
    trainer's own pass over one micro-batch checks them first, and past the tolerance they are
    recomputed after all (components/train/update.py)."""

    source: OldLogprobs
    why: Why
    check: bool = False


RECOMPUTE = OldLogprobsChoice(OldLogprobs.RECOMPUTE, Why.ASKED)
"""train.old_logprobs: recompute."""


def auto_refusals(cfg: RunConfig, sampled: dict[str, Any], staleness_max: float) -> list[Why]:
    """What keeps the sampler's logprobs from being the trainer's to float precision, in the
    order `auto` names them: rollouts of this very checkpoint whose logprobs the transformers
    sampler computed (as its manifest records, `sampled`: the generate stats) in float32 on the
    trainer's own kind of device, a float32 trainer, and nothing that changes the forward (LoRA,
    tools) or needs the trainer's own pass (rollout correction compares the two; forking tokens
    need its entropy). Empty: they are."""
    from components.model.checkpoint import device_and_dtype

    t, g = cfg.train, cfg.generate
    device, dtype = device_and_dtype(t.dtype)
    refusals = {
        Why.OTHER_DEFINITION: sampled.get("logprob_definition") != LOGPROB_DEFINITION,
        Why.STALE: staleness_max != 0,
        Why.SAMPLER_BACKEND: sampled.get("backend") != "transformers",
        Why.SAMPLER_DTYPE: sampled.get("dtype") != "float32",
        Why.SAMPLER_DEVICE: sampled.get("device") != device,
        Why.TRAINER_DTYPE: dtype != torch.float32,
        Why.LORA: cfg.model.lora is not None,
        Why.TOOLS: bool(g.tools or g.environment),
        Why.ROLLOUT_CORRECTION: t.rollout_correction is not None,
        Why.FORKING_TOKENS: t.forking_top_rho is not None,
    }
    return [why for why, refuses in refusals.items() if refuses]


def decide_old_logprobs(
    cfg: RunConfig, sampled: dict[str, Any], staleness_max: float
) -> OldLogprobsChoice:
    """This iteration's old-logprobs source (train.old_logprobs): `recompute` and `rollout` as
    asked (`rollout` refused where the rollouts' logprobs are not the trainer's definition);
    `auto` the sampler's, checked, where nothing in `auto_refusals` keeps them from being the
    trainer's, else recomputed for the first reason listed."""
    mode = cfg.train.old_logprobs
    if mode == "recompute":
        return RECOMPUTE
    if mode == "rollout":
        require_trainer_logprobs(
            sampled.get("logprob_definition"),
            "old_logprobs: rollout",
            "Set train.old_logprobs: recompute (or auto)",
        )
        return OldLogprobsChoice(OldLogprobs.ROLLOUT, Why.ASKED)
    refusals = auto_refusals(cfg, sampled, staleness_max)
    if refusals:
        return OldLogprobsChoice(OldLogprobs.RECOMPUTE, refusals[0])
    return OldLogprobsChoice(OldLogprobs.ROLLOUT, Why.EQUAL, check=True)


@dataclass
class IterationInputs:
    """What one update of iteration `iteration` reads."""

    iteration: int
    rollouts: Rollouts
    staleness: dict[str, float]
    temperature: float
    definition: str | None
    """How the sampler defined the rollouts' logprobs (its manifest's `logprob_definition`)."""
    old_logprobs: OldLogprobsChoice

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
        old = decide_old_logprobs(cfg, sampled, staleness["train/staleness_max"])
        return cls(i, ro, staleness, temperature, definition, old)
