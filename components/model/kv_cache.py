"""A KV cache that is written in place: transformers' DynamicLayer with preallocated room.

transformers' DynamicLayer grows by `torch.cat` at every decode step, so step t copies the whole
cache of every layer, a copy that grows with the rows and the positions. `reserve` swaps each plain
DynamicLayer of a prefilled cache for a `ReservedLayer` that holds buffers sized for every step to
come and writes each new key and value into them; attention reads a view of the filled positions, so
what the model computes is unchanged (same values, same mask sizes, same positions). Layers of any
other kind (sliding windows, quantized, linear attention) are left as they are. The room is taken at
the first step: rows x (longest prompt + max_new_tokens) per layer, the size `generate.transformers.batch_tokens`
plans a batch by, so a batch's cache needs no more memory than its plan says.
"""

from __future__ import annotations

from typing import Protocol

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

    def joined(self, other: DynamicLayer, lo: int, width: int, capacity: int) -> ReservedLayer:
        """This layer's columns [lo, length) and `other`'s rows (a prefill's keys and values)
        in new buffers of `capacity` columns, both right-aligned at column `width` (the columns
        before a row's own are zeros, which the mask hides)."""
        out = ReservedLayer.__new__(ReservedLayer)
        DynamicLayer.__init__(out)
        span, new = self.length - lo, other.keys.shape[-2]
        for name, mine, theirs in (
            ("key_buf", self.key_buf, other.keys),
            ("value_buf", self.value_buf, other.values),
        ):
            rows = mine.shape[0]
            buf = mine.new_zeros(rows + theirs.shape[0], mine.shape[1], capacity, mine.shape[-1])
            buf[:rows, :, width - span : width] = mine[:, :, lo : self.length]
            buf[rows:, :, width - new : width] = theirs
            setattr(out, name, buf)
        out.length, out.device, out.is_initialized = width, self.device, True
        out._expose()
        return out

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


class DecodeCache(Protocol):
    """The KV cache of a batch's decode, as the decode loop uses it, whichever kind it is: the
    growing cache (`GrowingCache`, here) or the static slab (graph_decode.py `GraphRun`)."""

    def step(self, feed: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        """One decode step of the active rows: each feeds its token `feed` [A] at its position
        `next_pos` [A]; returns their next logits [A, vocab]."""
        ...

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the active rows `keep` (ascending indices), in that order."""
        ...

    def worth_dropping(self, n_done: int, n_active: int) -> bool:
        """Whether dropping the `n_done` finished rows of `n_active` pays for its copy now."""
        ...

    def can_admit(self) -> bool:
        """Whether prefilled rows can join the rows decoding (`admit`, continuous batching)."""
        ...


class GrowingCache:
    """transformers' own cache, its layers reserved in place (`reserve`), and the attention mask
    of every step: all rows write the same column (`length`); row i attends from its first
    unpadded column on. Rows that finished can be dropped (`select`) and, with `admit`, new
    prefilled rows joined, right-aligned with the others (continuous batching)."""

    def __init__(
        self, model, cache_kwarg: str, past, attn: torch.Tensor, steps: int, *, mrope: bool
    ) -> None:
        self.model, self.cache_kwarg, self.past, self.mrope = model, cache_kwarg, past, mrope
        rows, width = attn.shape
        self.reserved = reserve(past, width + steps)
        self.movable = rows_movable(past)
        # The mask for all steps, allocated once: a step feeds a view of its first length + 1
        # columns.
        self.attn_all = torch.ones((rows, width + steps), dtype=attn.dtype, device=attn.device)
        self.attn_all[:, :width] = attn
        self.length = width

    def step(self, feed: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        step_pos = next_pos.unsqueeze(-1)
        out = self.model(
            input_ids=feed.unsqueeze(-1),
            attention_mask=self.attn_all[:, : self.length + 1],
            position_ids=step_pos.expand(3, -1, -1) if self.mrope else step_pos,
            use_cache=True,
            **{self.cache_kwarg: self.past},
        )
        self.past = getattr(out, self.cache_kwarg)
        self.length += 1
        return out.logits[:, -1, :]

    def select(self, keep: torch.Tensor) -> None:
        self.past.batch_select_indices(keep)
        self.attn_all = self.attn_all[keep]

    def worth_dropping(self, n_done: int, n_active: int) -> bool:
        """Once the finished rows are an eighth of the batch (a static batch would compute every
        row until its longest response ends; each drop copies the cache)."""
        return self.movable and 8 * n_done >= n_active

    def can_admit(self) -> bool:
        """Whether new rows can join: every layer is a ReservedLayer of keys and values."""
        return self.reserved and self.movable

    def span(self) -> int:
        """The columns from the first any row attends to the newest."""
        used = self.attn_all[:, : self.length].any(0)
        return self.length - int(used.int().argmax()) if bool(used.any()) else 0

    def admit(self, past, attn: torch.Tensor, steps: int) -> None:
        """Join prefilled rows (`past`, their left-padded mask `attn` [k, width]) after the
        active ones, every row right-aligned at the newest column; the columns no row attends to
        go, and every row gets room for `steps` more."""
        span, new = self.span(), attn.shape[1]
        lo, width = self.length - span, max(span, new)
        rows = self.attn_all.shape[0]
        for i, layer in enumerate(self.past.layers):
            self.past.layers[i] = layer.joined(past.layers[i], lo, width, width + steps)
        mask = torch.zeros(
            (rows + attn.shape[0], width + steps), dtype=attn.dtype, device=attn.device
        )
        mask[:rows, width - span : width] = self.attn_all[:, lo : self.length]
        mask[rows:, width - new : width] = attn
        mask[:, width:] = 1
        self.attn_all, self.length = mask, width
