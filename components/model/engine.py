"""A generation backend that stays loaded across iterations (generate and evaluate workers).

`PolicyEngine.ensure(store, checkpoint_uri)` returns a backend holding that checkpoint's policy:

- the same checkpoint content as last time: nothing happens;
- new weights with the same config and tokenizer files (every checkpoint a run writes): the
  weights are loaded into the running engine in place (`backend.load_weights`), with no new
  process, model construction or engine start;
- anything else (first use, another architecture or tokenizer): a full load.

What happened and how long it took goes into the step's timeline and manifest.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.commit import content_digest, read_manifest
from components.core.config import GenerateSection
from components.core.layout import RunLayout
from components.core.retention import reading
from components.core.store import Store
from components.model.adapter import (
    ADAPTER_CONFIG,
    base_digest,
    check_base,
    is_adapter_dir,
)
from components.model.backends import Backend
from components.model.checkpoint import (
    device_and_dtype,
    load_policy,
    local_checkpoint,
    sampler_dtype_name,
)

WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def make_backend(
    gen: GenerateSection, ckpt_dir: Path, seed: int, *, max_lora_rank: int | None = None
) -> tuple[Backend, Any]:
    """The configured backend and its tokenizer; `max_lora_rank`: the policy is `ckpt_dir` (a
    base) with LoRA adapters of up to that rank (vLLM starts with LoRA enabled)."""
    from components.model.vision import VisionProcessor, is_vision_config

    if gen.backend == "vllm":
        from transformers import AutoConfig

        from components.model.vllm_backend import VLLMBackend

        config = AutoConfig.from_pretrained(ckpt_dir)
        vision = is_vision_config(config)
        b = VLLMBackend(
            str(ckpt_dir),
            tensor_parallel_size=gen.vllm.tensor_parallel_size,
            gpu_memory_utilization=gen.vllm.gpu_memory_utilization,
            max_model_len=gen.vllm.max_model_len,
            enable_prefix_caching=gen.vllm.enable_prefix_caching,
            dtype=sampler_dtype_name("vllm", gen.dtype),
            seed=seed,
            max_lora_rank=max_lora_rank,
            max_images_per_prompt=gen.max_images_per_prompt if vision else None,
        )
        b.vision = VisionProcessor.of_checkpoint(ckpt_dir, b.tokenizer, config)
        if b.vision is not None:
            from components.model.vision import placeholder_ids

            b.placeholder_ids = placeholder_ids(config)
        return b, b.tokenizer
    from components.model.hf_backend import TransformersBackend

    device, dtype = device_and_dtype(gen.dtype)
    model, tokenizer = load_policy(ckpt_dir, dtype=dtype, device=device)
    backend = TransformersBackend(
        model,
        tokenizer,
        batch_size=gen.transformers.batch_size,
        batch_tokens=gen.transformers.batch_tokens,
        device=device,
        vision=VisionProcessor.of_checkpoint(ckpt_dir, tokenizer, model.config),
        graphs=gen.transformers.cuda_graphs and str(device).startswith("cuda"),
        continuous=gen.transformers.continuous_batching,
    )
    backend.warm_up()
    return backend, tokenizer


@dataclass
class LoadInfo:
    action: str
    """`reuse`, `weights` (loaded in place) or `load` (a new engine)."""
    seconds: float
    bytes: int
    start: float
    end: float

    def stats(self) -> dict[str, Any]:
        out = {"policy_load": self.action, "policy_load_s": self.seconds}
        if self.action != "reuse" and self.seconds > 0:
            out["policy_load_bytes_per_s"] = self.bytes / self.seconds
        return out


CONFIG_FILES = ("config.json", "generation_config.json")
VOLATILE_KEYS = ("transformers_version", "dtype", "torch_dtype", "_name_or_path", "use_cache")
"""Keys a re-save changes without changing the model (the saving library's version, the dtype
the weights were held in): a run's first trained checkpoint differs from its base in them."""


def _signature(manifest: dict[str, Any], ckpt_dir: Path) -> dict[str, Any]:
    """What must not change for new weights to load in place: the model and generation configs
    (parsed, without volatile keys) and every other non-weight file (the tokenizer) by sha256."""
    out: dict[str, Any] = {}
    for f in manifest["files"]:
        path = f["path"]
        if path.endswith(WEIGHT_SUFFIXES):
            continue
        if path in CONFIG_FILES:
            try:
                config = json.loads((ckpt_dir / path).read_text())
            except (OSError, ValueError):
                out[path] = f["sha256"]
                continue
            if isinstance(config, dict):
                for key in VOLATILE_KEYS:
                    config.pop(key, None)
            out[path] = config
        else:
            out[path] = f["sha256"]
    return out


def _weight_bytes(manifest: dict[str, Any]) -> int:
    return sum(f["bytes"] for f in manifest["files"] if f["path"].endswith(".safetensors"))


class PolicyEngine:
    """Holds one backend (transformers or vLLM) and the identity of the policy it serves."""

    def __init__(self, gen: GenerateSection, seed: int) -> None:
        self.gen, self.seed = gen, seed
        self.backend: Any = None
        self.tokenizer: Any = None
        self.digest: str | None = None
        self.signature: dict[str, str] | None = None
        self._bases: dict[str, tuple[str, Path, str]] = {}

    def _base(self, store: Store, base_uri: str) -> tuple[str, Path, str]:
        """(content digest, local directory, base digest) of a LoRA run's base, looked up once
        per engine: checkpoint 0 is written once, so each next adapter reads nothing of it."""
        if base_uri not in self._bases:
            base_dir = Path(local_checkpoint(store, base_uri))
            self._bases[base_uri] = (
                content_digest(store, base_uri),
                base_dir,
                base_digest(base_dir, read_manifest(store, base_uri)),
            )
        return self._bases[base_uri]

    def ensure(
        self, store: Store, checkpoint_uri: str, who: str = "generate"
    ) -> tuple[Any, Any, LoadInfo]:
        """A backend holding the checkpoint's policy (module doc); while it loads, the
        checkpoint is held against the retention policy (components/core/retention.py)."""
        t0 = time.time()
        digest = content_digest(store, checkpoint_uri)
        if self.backend is not None and digest == self.digest:
            return self.backend, self.tokenizer, LoadInfo("reuse", 0.0, 0, t0, t0)
        with reading(store, checkpoint_uri, who) as manifest:
            action = self._load(store, checkpoint_uri, manifest)
        self.digest = digest
        t1 = time.time()
        return (
            self.backend,
            self.tokenizer,
            LoadInfo(action, t1 - t0, _weight_bytes(manifest), t0, t1),
        )

    def receive(
        self, store: Store, base_uri: str, receiver, version: int, who: str = "generate"
    ) -> tuple[Any, Any, LoadInfo, Any]:
        """Policy `version` over the weight channel (components/model/channel.py), into the
        loaded backend in place (an empty engine first loads the run's base from the store: the
        architecture). Also returns what will give the received bytes' sha256s (`.digests()`),
        which the caller checks against the store's commit before it trusts them
        (`received`). ChannelError: load the checkpoint from the store (the weights may be half
        replaced, so the engine forgets what it holds)."""
        t0 = time.time()
        if self.backend is None:
            self.ensure(store, base_uri, who)
        self.digest = None
        received, nbytes = self.backend.receive(receiver, version)
        t1 = time.time()
        load = LoadInfo("broadcast", t1 - t0, nbytes, t0, t1)
        return self.backend, self.tokenizer, load, received

    def received(self, digest: str) -> None:
        """The channel's weights are those of the committed checkpoint with this digest."""
        self.digest = digest

    def _load(self, store: Store, checkpoint_uri: str, manifest: dict[str, Any]) -> str:
        """Load a checkpoint: its weights in place where only they changed, else a new backend;
        returns which (`weights`, `load`)."""
        ckpt_dir = local_checkpoint(store, checkpoint_uri)
        signature = _signature(manifest, Path(ckpt_dir))
        if is_adapter_dir(ckpt_dir):  # model.lora: the run's base with this adapter
            base_uri = RunLayout.base_beside(checkpoint_uri)
            signature["base"], base_dir, digest_of_base = self._base(store, base_uri)
            check_base(ckpt_dir, digest_of_base)
            if self.backend is None or signature != self.signature:
                self.close()
                rank = json.loads((Path(ckpt_dir) / ADAPTER_CONFIG).read_text())["r"]
                self.backend, self.tokenizer = make_backend(
                    self.gen, base_dir, self.seed, max_lora_rank=rank
                )
                action = "load"
            else:
                action = "weights"
            self.backend.set_adapter(Path(ckpt_dir), digest_of_base)
        elif self.backend is not None and signature == self.signature:
            self.backend.load_weights(Path(ckpt_dir))
            action = "weights"
        else:
            self.close()
            self.backend, self.tokenizer = make_backend(self.gen, ckpt_dir, self.seed)
            action = "load"
        self.signature = signature
        return action

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
        self.backend = self.tokenizer = self.digest = self.signature = None
