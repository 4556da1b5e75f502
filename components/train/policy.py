"""The policy module in the train stage: the modes of its passes (dropout off, gradient
checkpointing), the KL reference under model.lora, and a LoRA adapter's weights out of DeepSpeed
into a PEFT checkpoint."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from components.core.commit import OutputDir
from components.core.errors import StageError
from components.core.timing import Timeline
from components.model.checkpoint import write_checkpoint
from components.model.engine import WEIGHT_SUFFIXES


def enable_checkpointing(model) -> None:
    """`train.gradient_checkpointing`: transformers' non-reentrant activation checkpointing on
    every decoder layer (non-reentrant: the recomputed forward needs no input that requires
    grad, so a frozen base under LoRA works as it is). transformers 5 names it
    `activation_checkpointing_enable`; 4.x (the GPU images) `gradient_checkpointing_enable`."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def set_train_modes(model, *, checkpointing: bool, lora_dropout: float) -> None:
    """The policy's module modes for the gradient passes.

    Eval everywhere, as the stage has always trained: no dropout in the base, so the first
    step's ratio to recomputed old logprobs is exactly 1 and train's logprobs equal an fp32
    generate's within the logprob contract. Two
    flags are turned on where asked, each on its own modules only: the decoder layers' own
    `training` flag under gradient checkpointing (transformers checkpoints a layer only in
    training mode; its attention and dropout children stay in eval), and LoRA's dropout
    modules when `model.lora.dropout > 0` (PEFT applies it only in training mode)."""
    model.eval()
    if checkpointing:
        for m in model.modules():
            if getattr(m, "gradient_checkpointing", False):
                m.training = True
    if lora_dropout > 0:
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Dropout) and ".lora_dropout." in f".{name}.":
                m.training = True


@contextlib.contextmanager
def eval_modes(model) -> Iterator[None]:
    """Every module in eval for a no-grad pass, and each module's own mode restored after
    (`model.train(was_training)` would flatten the per-module flags of set_train_modes)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


class AdapterOff:
    """The KL reference under model.lora: the policy's own base with the adapter disabled
    (`PeftModel.disable_adapter`), in eval mode for the call; no second copy of the model."""

    def __init__(self, peft_model) -> None:
        self.peft_model = peft_model
        self.training = False

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def modules(self):
        return iter(())

    def parameters(self):
        return self.peft_model.parameters()

    def __call__(self, *args, **kwargs):
        model = self.peft_model
        with eval_modes(model), torch.no_grad(), model.disable_adapter():
            return model(*args, **kwargs)


def fp32_masters(engine) -> dict[str, torch.Tensor]:
    """DeepSpeed's fp32 master weights of the trained parameters by name under bf16 (what a
    checkpoint saves, not the rounded bf16 weights); empty in fp32, where the parameters are the
    masters. A frozen parameter (a LoRA base) has none."""
    if not engine.bfloat16_enabled():
        return {}
    from deepspeed.utils import safe_get_full_fp32_param

    masters = {
        n: safe_get_full_fp32_param(p)
        for n, p in engine.module.named_parameters()
        if p.requires_grad
    }
    missing = [n for n, v in masters.items() if v is None]
    if missing:
        raise StageError(f"DeepSpeed exposes no fp32 master for {missing[:3]}; cannot save exactly")
    return masters


def _gathered(engine, params: list[torch.nn.Parameter]):
    """Under ZeRO-3, `params` gathered whole on every rank for the block; else nothing to do."""
    if engine.zero_optimization_stage() != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def adapter_state_dict(engine) -> dict[str, torch.Tensor]:
    """The LoRA adapter's weights on CPU in fp32 (model.lora), gathered from ZeRO-3 partitions
    when needed (the adapter's parameters only: the frozen base stays partitioned); under bf16,
    DeepSpeed's fp32 masters, so small updates survive and a resumed run continues exactly."""
    from peft import get_peft_model_state_dict

    model = engine.module
    masters = fp32_masters(engine)
    with _gathered(engine, [p for p in model.parameters() if p.requires_grad]):
        state = {**model.state_dict(), **masters}
        # the adapter alone: with the output head adapted PEFT would add the head's base weights
        # ("save_embedding_layers"), the largest matrix of the model
        state = get_peft_model_state_dict(model, state_dict=state, save_embedding_layers=False)
        return {k: v.detach().float().cpu().clone().contiguous() for k, v in state.items()}


class TokenizerFiles:
    """Saves a checkpoint's tokenizer files by copying them from the checkpoint trained from,
    byte for byte: every checkpoint of a run then carries the base's tokenizer files unchanged
    (a re-save through transformers adds keys), so a warm generate engine sees the same tokenizer
    and takes each new checkpoint as weights only (components/model/engine.py)."""

    # the model's own files: written for each checkpoint (an adapter's config and base too)
    SKIP = (
        "config.json",
        "generation_config.json",
        "_SUCCESS",
        "adapter_config.json",
        "rlvr_base.json",
    )

    def __init__(self, source: Path) -> None:
        self.source = Path(source)

    def save_pretrained(self, path) -> None:
        for f in sorted(self.source.iterdir()):
            if f.is_file() and f.name not in self.SKIP and not f.name.endswith(WEIGHT_SUFFIXES):
                shutil.copyfile(f, Path(path) / f.name)


def write_adapter_checkpoint(
    model,
    tokenizer,
    weights: dict[str, torch.Tensor],
    out: OutputDir,
    stats: dict,
    inputs: dict,
    timeline: Timeline,
    commit_start: float,
    *,
    base_digest: str,
    base_uri: str,
) -> dict[str, float]:
    """A LoRA run's handoff (model.lora): the adapter alone in PEFT's format, with the base's
    tokenizer files; the manifest records the save throughput and the step's timeline. (A
    whole policy's handoff is streamed instead: components/train/handoff.py.)"""

    class _Saver:
        """Lets write_checkpoint save the adapter's gathered weights."""

        generation_config = None

        def save_pretrained(self, path, **kwargs):
            from components.model.adapter import write_adapter

            write_adapter(model, weights, Path(path), base_digest, base_uri)

    t0 = time.time()
    nbytes = sum(v.numel() * v.element_size() for v in weights.values())

    saved: dict[str, float] = {}

    def finish(stats: dict) -> dict:
        seconds = time.time() - t0
        timeline.add("commit", commit_start, time.time())
        saved.update(
            {
                "train/checkpoint_bytes": float(nbytes),
                "train/checkpoint_save_bytes_per_s": nbytes / seconds if seconds > 0 else 0.0,
            }
        )
        stats.update(saved, timeline=timeline.record())
        return stats

    write_checkpoint(_Saver(), tokenizer, out, stats, inputs, before_commit=finish)
    return saved  # what the manifest got (write_checkpoint hands `finish` a copy of `stats`)
