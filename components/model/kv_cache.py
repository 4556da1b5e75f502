"""A KV cache that is written in place: transformers' DynamicLayer with preallocated room.

transformers' DynamicLayer grows by `torch.cat` at every decode step, so step t copies the whole
cache of every layer, a copy that grows with the rows and the positions. `reserve` swaps each plain
DynamicLayer of a prefilled cache for a `ReservedLayer` that holds buffers sized for every step to
come and writes each new key and value into them; attention reads a view of the filled positions, so
what the model computes is unchanged (same values, same mask sizes, same positions). Layers of any
other kind (sliding windows, quantized, linear attention) are left as they are. The room is taken at
the first step: rows x (longest prompt + max_new_tokens) per layer, the size `generate.batch_tokens`
plans a batch by, so a batch's cache needs no more memory than its plan says.
"""

from __future__ import annotations

import torch
from transformers import cache_utils
from transformers.cache_utils import DynamicLayer

#: Layers whose state is more than keys and values (conv and recurrent states of linear
#: attention, in transformers 5): transformers' own row selection leaves those states behind.
_STATEFUL = tuple(
    getattr(cache_utils, name)
    for name in ("LinearAttentionCacheLayerMixin",)
    if hasattr(cache_utils, name)
)


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of buffers with room for `capacity`
    positions; `update` writes in place instead of concatenating."""

    def __init__(self, layer: DynamicLayer, capacity: int) -> None:
        super().__init__()
        keys, values = layer.keys, layer.values
        batch, heads, length, dim = keys.shape
        self.key_buf = keys.new_empty(batch, heads, max(capacity, length), dim)
        self.value_buf = values.new_empty(
            batch, values.shape[1], max(capacity, length), values.shape[-1]
        )
        self.key_buf[:, :, :length] = keys
        self.value_buf[:, :, :length] = values
        self.length = length
        self.device = keys.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys = self.key_buf[:, :, : self.length]
        self.values = self.value_buf[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.key_buf.shape[-2]:  # past the reservation: grow like DynamicLayer
            self.key_buf = torch.cat([self.keys, key_states], dim=-2)
            self.value_buf = torch.cat([self.values, value_states], dim=-2)
        else:
            self.key_buf[:, :, self.length : end] = key_states
            self.value_buf[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buf, self.value_buf = self.key_buf[indices], self.value_buf[indices]
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.key_buf = self.key_buf.repeat_interleave(repeats, dim=0)
        self.value_buf = self.value_buf.repeat_interleave(repeats, dim=0)
        self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.key_buf.device))

    def crop(self, tokens: int) -> None:
        """Drop positions: `tokens` < 0 removes that many (transformers 5); `tokens` >= 0 keeps
        that many (transformers 4.x's `crop(max_length)`)."""
        keep = self.length + tokens if tokens < 0 else min(tokens, self.length)
        if keep < 0:
            raise ValueError(f"crop({tokens}) on a cache of {self.length} positions")
        self.length = keep
        self._expose()

    def offload(self) -> None:
        self.key_buf = self.key_buf.to("cpu", non_blocking=True)
        self.value_buf = self.value_buf.to("cpu", non_blocking=True)
        self._expose()

    def prefetch(self) -> None:
        if self.key_buf.device != self.device:
            self.key_buf = self.key_buf.to(self.device, non_blocking=True)
            self.value_buf = self.value_buf.to(self.device, non_blocking=True)
            self._expose()

    def reset(self) -> None:
        """Empty, keeping the buffers (for reuse at the same batch size)."""
        self.length = 0
        self._expose()


def rows_movable(cache) -> bool:
    """Whether every layer of `cache` holds keys and values only, so that its rows can be
    repeated (a shared prefill) and selected (dropping finished rows) by transformers' own
    `batch_repeat_interleave` / `batch_select_indices`. Layers with conv or recurrent states
    (hybrid and linear-attention models) cannot: their states would keep the old rows."""
    layers = getattr(cache, "layers", None)
    if not layers or not hasattr(cache, "batch_repeat_interleave"):
        return False
    return all(
        isinstance(layer, DynamicLayer) and not isinstance(layer, _STATEFUL) for layer in layers
    )


def reserve(cache, capacity: int) -> bool:
    """Swap the plain DynamicLayers of a prefilled cache for ReservedLayers with room for
    `capacity` positions. Returns whether every layer was swapped (a cache of another kind, or
    a transformers version without per-layer caches, is left as it is)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    swapped = 0
    for i, layer in enumerate(layers):
        keys = getattr(layer, "keys", None)
        if type(layer) is DynamicLayer and isinstance(keys, torch.Tensor) and keys.dim() == 4:
            layers[i] = ReservedLayer(layer, capacity)
            swapped += 1
    return swapped == len(layers)
