"""Runs inside each vLLM worker process: load a checkpoint directory's weights in place, or
receive them over rlvr's weight channel.

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

    def receive_weights(
        self,
        root: str,
        endpoint_url: str | None,
        version: int,
        first_rank: int,
        receivers: int,
        bucket_mb: int,
        timeout_s: float,
    ) -> int:
        """Take policy `version` from train's weight channel (components/model/channel.py): this
        worker is rank `first_rank` + its own tensor-parallel rank of the channel's group, gets
        every tensor whole, and the model's `load_weights` keeps its own shard of each. Returns
        the bytes received."""
        from components.core.store import get_store
        from components.model.channel import Receiver, Settings

        receiver = getattr(self, "_rlvr_receiver", None)
        if receiver is None:
            settings = Settings(
                get_store(root, endpoint_url),
                root,
                receivers=receivers,
                bucket_mb=bucket_mb,
                timeout_s=timeout_s,
                device="cuda",
            )
            receiver = Receiver(settings, rank=first_rank + int(getattr(self, "rank", 0)))
            self._rlvr_receiver = receiver
        model = self.model_runner.model  # type: ignore[attr-defined]

        class Sink:
            def start(self, names: list[str]) -> None:
                pass

            def put(self, name: str, tensor) -> None:
                model.load_weights(weights=[(name, tensor)])

        self._rlvr_received = receiver.receive(version, Sink())
        return receiver.last_bytes

    def received_digests(self) -> dict[str, str]:
        """The sha256s of what `receive_weights` last received (hashed while vLLM samples)."""
        return self._rlvr_received.digests()
