"""Runs inside each vLLM worker process: load a checkpoint directory's weights in place.

vLLM instantiates `CheckpointLoader` as a mixin of its worker class (`LLM(...,
worker_extension_cls=...)`), so `self.model_runner` is the worker's. `LLM.collective_rpc(
"load_checkpoint", args=(dir,))` calls it on every worker (each tensor-parallel rank loads its
own shard of every tensor through the model's `load_weights`). This module imports nothing from
vLLM, so it is importable (and its logic testable) without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def iter_safetensors(checkpoint_dir: str) -> Iterator[tuple[str, object]]:
    """(name, tensor) for every tensor of every *.safetensors file, one file open at a time."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint_dir} holds no *.safetensors weights")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, st.get_tensor(name)


class CheckpointLoader:
    """Worker extension: `load_checkpoint(dir)` loads new weights into the served model."""

    model_runner: object

    def load_checkpoint(self, checkpoint_dir: str) -> int:
        loaded = self.model_runner.model.load_weights(weights=iter_safetensors(checkpoint_dir))  # type: ignore[attr-defined]
        return len(loaded) if loaded is not None else 0
