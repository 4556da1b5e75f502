"""The policy handoff: each iteration's new weights, in the dtype generate samples in, streamed
from the DeepSpeed engine into a Hugging Face checkpoint one tensor at a time.

Generate and evaluate read nothing but these weights, so they are written in the sampler's
dtype (`train.handoff.dtype`, auto: bf16 where generate samples in bf16, half the bytes of the
fp32 masters). A sampler casting an fp32 checkpoint at load rounds exactly as the cast here
does, so what it samples is unchanged. The fp32 masters and the Adam moments go to the full
train state every `train.state_every` iterations (components/train/state.py).

Every rank walks the same plan in the same order (a ZeRO-3 parameter's gather, DeepSpeed's
fp32 master under bf16, are collectives); rank 0 alone writes, each tensor as soon as it is
whole, so neither the model nor the checkpoint is ever held whole in memory
(components/model/weights.py). The files are HF's (`model.safetensors`, sharded with an index past
2 GB, under the names `save_pretrained` uses: components/model/checkpoint.py `saved_names`), and
the same weights always give the same bytes: `WeightPlan.write(None)` hashes what would be
written, which checks a replayed update against the checkpoint the original run committed.

With the weight channel (components/model/channel.py) the plan is walked twice: once to
broadcast (generate starts sampling as soon as the last bucket is in), then once to write the
checkpoint, while generate samples. One pass doing both would hold generate back until the
files were on disk; the second gather costs little beside either (NVLink and memory bandwidth).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.core.commit import OutputDir
from components.core.errors import StageError
from components.model import weights as weight_files
from components.model.checkpoint import check_hf_dir, saved_names
from components.model.weights import (
    INDEX_NAME,
    Entry,
    FileInfo,
    index_json,
    plan_order,
    shard_plan,
    write_files,
)

METADATA = {"format": "pt"}


@dataclass(frozen=True)
class Source:
    """Where one saved tensor comes from in the engine."""

    name: str
    """Its name in the module's state dict."""
    value: Any
    """The parameter or buffer."""
    master: bool
    """Take DeepSpeed's fp32 master (a trained parameter under bf16), not the rounded weight."""
    gather: bool
    """A ZeRO-3 partitioned parameter: gathered whole for the moment it is copied."""

    def full(self, dtype: torch.dtype, *, keep: bool) -> torch.Tensor | None:
        """The whole tensor on the CPU in `dtype` (None where not `keep`). Every rank calls it
        for every source in the same order: the master's gather and ZeRO-3's are collectives."""
        if self.master:
            from deepspeed.utils import safe_get_full_fp32_param

            t = safe_get_full_fp32_param(self.value)
            if t is None:
                raise StageError(
                    f"DeepSpeed exposes no fp32 master for {self.name}; cannot save exactly"
                )
            return t.detach().to(dtype).cpu() if keep else None
        if self.gather:
            import deepspeed

            with deepspeed.zero.GatheredParameters([self.value], modifier_rank=None):
                return self.value.detach().to(dtype, copy=True).cpu() if keep else None
        return self.value.detach().to(dtype).cpu() if keep else None


class WeightPlan:
    """The handoff's files and where each tensor comes from, for one engine and dtype. Tied
    weights (lm_head = embed_tokens) appear once, under their first name, as save_pretrained
    stores them; floating buffers are cast to the handoff dtype as a model loaded in it has
    them."""

    def __init__(self, engine, dtype: torch.dtype) -> None:
        model = engine.module
        params = dict(model.named_parameters())  # tied parameters once, under their first name
        taken = {id(q) for q in params.values()}
        zero3 = engine.zero_optimization_stage() == 3
        bf16 = engine.bfloat16_enabled()
        sources: list[Source] = []
        shapes: dict[str, tuple[int, ...]] = {}
        for name, value in model.state_dict(keep_vars=True).items():
            p = params.get(name)
            if p is None and id(value) in taken:
                continue  # a tied alias of a parameter already taken under its first name
            is_param = p is not None
            sources.append(
                Source(name, value, is_param and bf16 and p.requires_grad, is_param and zero3)
            )
            shapes[name] = tuple(getattr(value, "ds_shape", value.shape))
        rename = saved_names(model, [s.name for s in sources])
        self.dtype = dtype
        self.sources = {rename[s.name]: s for s in sources}
        entries = [
            Entry(
                rename[s.name],
                dtype if s.value.dtype.is_floating_point else s.value.dtype,
                shapes[s.name],
            )
            for s in sources
        ]
        self.plan = shard_plan(entries, weight_files.MAX_SHARD_BYTES)
        self.nbytes = sum(e.nbytes for e in entries)

    def tensors(self, *, keep: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """(saved name, whole tensor) in the plan's order; without `keep` the collectives run
        and nothing is yielded (the ranks that do not write)."""
        for e in plan_order(self.plan):
            t = self.sources[e.name].full(e.dtype, keep=keep)
            if keep:
                yield e.name, t

    def send(self, sender, version: int, *, keep: bool = True) -> bool:
        """Broadcast every tensor over the weight channel (components/model/channel.py), before
        anything is written: the receivers sample while the files are written. Every rank
        takes part in the gathers; rank 0 (`keep`) sends, unless it has no `sender` (it could
        not listen). True when every receiver got everything."""
        if not keep or sender is None:
            for _ in self.tensors(keep=False):
                pass
            return False
        files = [(name, len(entries)) for name, entries in self.plan.items()]
        sender.begin(version, plan_order(self.plan), files, METADATA)
        for name, tensor in self.tensors(keep=True):
            sender.put(name, tensor)
        return sender.end()

    def write(self, directory: Path | None, *, keep: bool = True) -> dict[str, FileInfo]:
        """Write the weight files into `directory` (None: hash only); a rank without `keep`
        takes part in the gathers and writes nothing."""
        if not keep:
            for _ in self.tensors(keep=False):
                pass
            return {}
        files = write_files(directory, self.plan, self.tensors(keep=True), METADATA)
        index = index_json(self.plan)
        if index is not None:
            if directory is not None:
                (Path(directory) / INDEX_NAME).write_bytes(index)
            files[INDEX_NAME] = FileInfo(len(index), hashlib.sha256(index).hexdigest())
        return files


def write_config(config, directory: Path, dtype: torch.dtype) -> None:
    """config.json as save_pretrained writes it for weights in `dtype`, with the KV cache on
    (training turns it off)."""
    c = copy.deepcopy(config)
    c.use_cache = True
    c.dtype = dtype
    c.save_pretrained(directory)


def write_handoff(
    plan: WeightPlan,
    module,
    tokenizer_files,
    out: OutputDir,
    *,
    keep: bool,
    finish: Callable[[dict[str, float]], dict[str, Any]],
    inputs: dict[str, str],
    channel: bool = False,
    sender=None,
    version: int = 0,
    timeline=None,
) -> dict[str, float]:
    """Stream the engine's weights into checkpoint `out` and commit it (rank 0, `keep`); the
    other ranks take part in the gathers. `finish` turns the save's figures into the manifest's
    stats once every file is in place (the step's timeline then has its commit span). Returns
    the figures. `channel`: this version goes over the weight channel first (the same on every
    rank: each takes part in its gathers), rank 0's `sender` broadcasting it (a `send` span)."""
    if channel:
        t0 = time.time()
        plan.send(sender, version, keep=keep)
        if timeline is not None:
            timeline.add("send", t0, time.time())
    if not keep:
        plan.write(None, keep=False)
        return {}
    t0 = time.time()
    out.begin(force=True)
    tmp = out.scratch_dir()
    try:
        weights = plan.write(tmp)
        write_config(module.config, tmp, plan.dtype)
        if getattr(module, "generation_config", None) is not None:
            module.generation_config.save_pretrained(tmp)
        tokenizer_files.save_pretrained(tmp)
        check_hf_dir(tmp, out.uri)
        for p in sorted(tmp.iterdir()):
            info = weights.get(p.name)
            out.put_file(p, p.name, sha256=info.sha256 if info else None, move=True)
        seconds = time.time() - t0
        figures = {
            "train/checkpoint_bytes": float(plan.nbytes),
            "train/checkpoint_save_bytes_per_s": plan.nbytes / seconds if seconds > 0 else 0.0,
        }
        out.commit(finish(figures), inputs)
        return figures
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
