"""The interface every generation backend implements, and the rules they share.

Semantics shared by all backends (docs/contracts.md, "Sampling semantics"):

- `response_logprobs[t]` is log softmax(logits / temperature) of the sampled token, taken BEFORE
  top-k / top-p truncation (for temperature 0, greedy, the logits are not scaled). The trainer
  recomputes exactly this with teacher forcing. The definition string is `LOGPROB_DEFINITION` and
  goes into the generate manifest, so the trainer can refuse a mismatch.
- A response ends at an EOS token or one of `stop_token_ids` (kept in `response_token_ids`, not
  in the text), at a stop string (kept in both; the text is cut right after the stop string), or
  at max_new_tokens (finish_reason "length").
- Each sample's randomness derives from (run seed, iteration, prompt_id, sample_index), never
  from batch position, so another batching or sharding reproduces the same samples up to float
  rounding of the logits (docs/contracts.md, "Batch and shard invariance").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

LOGPROB_DEFINITION = "log_softmax(logits/temperature) of the sampled token, before top-k/top-p"


@dataclass(frozen=True)
class SamplingSpec:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a response like EOS does (kept in the token ids, not the text)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class PromptRequest:
    prompt_id: str
    prompt_token_ids: list[int]
    sample_seeds: list[int]
    """One seed per sample (len == n)."""
    images: tuple = ()
    """An image prompt's PIL images, in placeholder order (components/model/vision.py)."""
    vision: Any = None
    """Their `VisionInputs` (pixel values, grids), as the prompt's token ids were expanded for."""


@dataclass
class Sample:
    prompt_id: str
    sample_index: int
    response: str
    response_token_ids: list[int]
    response_logprobs: list[float]
    finish_reason: str


@dataclass
class BackendInfo:
    name: str
    version: str
    logprob_definition: str = LOGPROB_DEFINITION
    extra: dict = field(default_factory=dict)
    dtype: str = ""
    """The dtype the policy's logprobs were computed in (`float32`, `bfloat16`); "" unknown."""
    device: str = ""
    """Where they were computed (`cpu`, `cuda`); "" unknown."""


class Backend(Protocol):
    """What the engine (engine.py), generate, evaluate and the tools call on a backend: the
    transformers backend (hf_backend.py) and vLLM's (vllm_backend.py) implement all of it."""

    info: BackendInfo

    def generate(self, requests: list[PromptRequest], spec: SamplingSpec) -> Iterator[list[Sample]]:
        """Yield finished samples in batches (all n samples of a prompt come together)."""
        ...

    def load_weights(self, checkpoint_dir: Path) -> None:
        """A checkpoint's weights into the running engine, in place (same architecture)."""
        ...

    def receive(self, receiver: Any, version: int) -> tuple[Any, int]:
        """Policy `version` over the weight channel into the running engine: (what gives the
        received bytes' sha256s, the bytes received). ChannelError on any failure."""
        ...

    def set_adapter(self, adapter_dir: Path, base_digest: str) -> None:
        """Sample from now on with the LoRA adapter in `adapter_dir` on the loaded base."""
        ...

    def close(self) -> None:
        """Let the engine's memory go now (a new engine may start right after)."""
        ...


def sample_seed(seed: int, iteration: int, prompt_id: str, sample_index: int) -> int:
    """A 63-bit seed from (run seed, iteration, prompt_id, sample_index)."""
    key = f"{seed}/{iteration}/{prompt_id}/{sample_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut `text` right after the earliest stop string; (text, whether one was found)."""
    best = -1
    for s in stop:
        i = text.find(s)
        if i >= 0 and (best < 0 or i + len(s) < best):
            best = i + len(s)
    return (text[:best], True) if best >= 0 else (text, False)
