"""Which pipeline a command builds (`rlvr compile / submit --pipeline train|eval|stage`)."""

from collections.abc import Callable

from components.core.config import RunConfig
from components.core.errors import UserError
from pipelines.evaluation import build_eval_pipeline, build_stage_pipeline
from pipelines.train import build_train_pipeline

PIPELINES = ("train", "eval", "stage")


def build(
    cfg: RunConfig, pipeline: str, *, stage: str | None = None, iteration: int = 0
) -> Callable:
    if pipeline == "train":
        return build_train_pipeline(cfg)
    if pipeline == "eval":
        return build_eval_pipeline(cfg)
    if pipeline == "stage":
        if not stage:
            raise UserError("--pipeline stage needs --stage NAME (and --iteration I)")
        return build_stage_pipeline(cfg, stage, iteration)
    raise UserError(f"unknown pipeline {pipeline!r}; valid: {', '.join(PIPELINES)}")
