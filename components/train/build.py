"""The train stage's DeepSpeed engine, built from the base checkpoint and a full train state.

A run's weights after `s` updates are the base (checkpoint 0: architecture, tokenizer, every
frozen weight) with the trainable parameters' fp32 masters of train state `s` (a LoRA run's:
the adapter's); its Adam moments, step and RNG come from the same state. `s = 0` is the base
itself with a fresh optimizer, which needs no state at all. The handoff checkpoints in between
are the sampler's copies (possibly bf16) and are never trained from.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

import torch

from components.core.commit import materialize, read_manifest
from components.core.config import RunConfig
from components.core.errors import Problems, StageError
from components.core.layout import RunLayout
from components.core.retention import reading
from components.core.store import Store
from components.model.checkpoint import device_and_dtype, load_policy, local_checkpoint
from components.model.vision import VisionProcessor, vision_tower
from components.train import state as train_state
from components.train.distributed import deepspeed_config, import_deepspeed, init_distributed
from components.train.policy import (
    AdapterOff,
    TokenizerFiles,
    enable_checkpointing,
    set_train_modes,
)
from components.train.update import steps_per_iteration


@dataclass
class Built:
    """An engine holding the policy after `state` updates, and what serves it."""

    engine: Any
    tokenizer: Any
    tokenizer_files: TokenizerFiles
    vision: Any
    ref_model: Any
    base_digest: str | None
    rank: int
    world: int
    device: str


def build(
    cfg: RunConfig, store: Store, layout: RunLayout, state: int, ref_model: Any = None
) -> Built:
    """A fresh engine at train state `state` (0: the base, a fresh optimizer). `ref_model`: the
    KL reference of an earlier build, reused (it never changes). The state is held against the
    retention policy from before the base loads until it is restored (RetiredError: it was
    retired before this worker got to it; choose another)."""
    if state == 0:
        return _build(cfg, store, layout, 0, ref_model, None)
    uri = layout.train_state(state)
    with reading(store, uri, "train"):
        reader = train_state.StateReader(materialize(store, uri), uri)
        try:
            return _build(cfg, store, layout, state, ref_model, reader)
        finally:
            reader.close()


def _build(cfg, store, layout, state, ref_model, reader) -> Built:
    t = cfg.train
    device, dtype = device_and_dtype(t.dtype)
    rank, world = init_distributed(device)
    if device == "cuda":  # one GPU per rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    torch.manual_seed(cfg.run.seed + state)
    base_uri = layout.checkpoint(0)
    base_dir = local_checkpoint(store, base_uri)
    # Loaded in fp32: under bf16 DeepSpeed casts the module and keeps fp32 master copies,
    # which are then set from these exact weights.
    model, tokenizer = load_policy(base_dir, dtype=torch.float32, device=device)
    base_digest = None
    if cfg.model.lora is not None:
        from components.model import adapter

        base_digest = adapter.base_digest(base_dir, read_manifest(store, base_uri))
        model = adapter.attach(model, cfg.model.lora)
    vision = VisionProcessor.of_checkpoint(base_dir, tokenizer, model.config)
    if vision is not None and t.freeze_vision and cfg.model.lora is None:
        # the tower and its merger stay as they are; only the language model trains
        tower = vision_tower(model)
        if tower is not None:
            tower.requires_grad_(False)
    if reader is not None:
        train_state.load_masters(model, reader)
    engine, ref_model = _engine(cfg, model, layout, store, device, dtype, world, ref_model)
    if reader is not None:
        step = train_state.restore(engine, reader, rank)
        expected = state * steps_per_iteration(t)
        if step != expected:
            raise StageError(
                f"{reader.uri} is at step {step}, expected {expected} (train.ppo_epochs x "
                "train.mini_batches changed mid-run?); start a new run"
            )
    return Built(
        engine,
        tokenizer,
        TokenizerFiles(base_dir),
        vision,
        ref_model,
        base_digest,
        rank,
        world,
        device,
    )


def _engine(cfg, model, layout, store, device, dtype, world, ref_model):
    """DeepSpeed around `model` (its weights already the policy's), and the KL reference."""
    t = cfg.train
    deepspeed = import_deepspeed()
    masters = (
        {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        if dtype != torch.float32
        else None
    )
    lora_ref = cfg.model.lora is not None and (t.kl_coef > 0 or t.kl_metric)
    if (t.kl_coef > 0 or t.kl_metric) and ref_model is None and not lora_ref:
        ref_model, _ = load_policy(
            local_checkpoint(store, layout.checkpoint(0)), dtype=dtype, device=device
        )
        ref_model.eval().requires_grad_(False)
    model.config.use_cache = False
    if t.gradient_checkpointing:
        from components.train.checks import check_checkpointing

        problems = Problems()
        check_checkpointing(cfg, problems, model.config)
        if problems.errors:
            raise StageError(str(problems.errors[0]))
        enable_checkpointing(model)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=deepspeed_config(t, world, dtype),
    )
    set_train_modes(
        engine.module,
        checkpointing=t.gradient_checkpointing,
        lora_dropout=cfg.model.lora.dropout if cfg.model.lora else 0.0,
    )
    if lora_ref:  # the reference is the base itself, adapter off: no second model
        ref_model = AdapterOff(engine.module)
    if masters is not None:
        from deepspeed.utils import safe_set_full_fp32_param

        for name, p in engine.module.named_parameters():
            if name in masters:
                safe_set_full_fp32_param(p, masters[name])
        del masters
    return engine, ref_model


def release(engine) -> None:
    """Drop an engine (the process group stays: it is per process)."""
    engine.destroy()
    gc.collect()
