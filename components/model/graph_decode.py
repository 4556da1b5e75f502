"""Decode steps replayed as CUDA graphs over a static KV cache (the transformers backend, GPU).

A small model's decode step is host-bound on a GPU: at 135M parameters and 128 rows an H200
computes under a tenth of the step, the rest is Python and kernel launches (docs/gpu.md). A CUDA
graph records one step's kernels once and replays them with a single launch. A graph fixes every
tensor's address and shape, so the step must read and write fixed buffers, which is what this
module provides:

- a `Slab`: per layer, key and value buffers [rows, kv heads, width, head dim]; the step's
  inputs (each row's token and position) and an additive attention mask over the whole width;
  and `write_at`, the cache column this step writes, as a device tensor;
- `SlabLayer`: a transformers cache layer over the slab that writes the step's keys and values
  at `write_at` (`index_copy_`) and hands attention the whole width. Columns not yet written, and
  a row's left padding, are masked with the dtype's minimum, so they weigh exp(min - max) = 0:
  the step computes what the growing cache computes, over more (zero-weight) columns;
- one graph per row bucket: the batch's rows, then the powers of two below. Finished rows leave
  the step only when the live ones fit a smaller bucket: they are moved to the front, and the
  smaller bucket's graph runs on them.

The slab (and its graphs) outlives a batch: a batch whose rows and width fit the slab reuses it
(widths are powers of two, so a slab serves batches up to twice as narrow), and new weights are
copied into the parameters in place, so every graph stays valid; a new model object (PEFT's
wrapper put on after the engine's warm-up) gets a new slab. On a CPU (tests) the same static
step runs eagerly. A failed capture is logged once and recorded in the stage's `stats.phases`
(`graphs_off`), and the engine's batches go back to the growing cache. Only architectures whose decoder takes a 4D additive mask
as given take the static step (`static_step_fits`); others keep the growing cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

log = logging.getLogger(__name__)

#: The narrowest slab; widths are powers of two from here, so that batches of different prompt
#: widths (every iteration brings new ones) share one slab and its graphs.
MIN_WIDTH = 64

#: Architectures whose decoder takes a 4D additive mask as given (transformers' masking_utils
#: returns it as is) and whose positions are the position ids: the static step's mask and
#: positions mean there what they mean to it. Others keep the growing cache: ALiBi models
#: (Bloom, Falcon) build their bias from a 2D mask, and a mixture of experts' routing reads
#: the device, which a capture cannot.
STATIC_STEP_MODELS = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "granite", "olmo2"}
)
ATTENTION = ("sdpa", "eager")
"""Attention implementations that take the 4D mask (flash attention wants a 2D padding mask)."""


def static_step_fits(model) -> str | None:
    """None where `model` can take the static step; else why not."""
    config = model.config
    kind, attention = config.model_type, getattr(config, "_attn_implementation", None)
    if kind not in STATIC_STEP_MODELS:
        return f"model type {kind!r} is not one the static step is known to fit"
    if attention not in ATTENTION:
        return f"attention {attention!r} takes no 4D mask (sdpa and eager do)"
    return None


def slab_width(need: int) -> int:
    """The width of a slab made for a batch that needs `need` columns: a power of two."""
    return max(MIN_WIDTH, 1 << (need - 1).bit_length())


class SlabLayer(DynamicLayer):
    """One layer's keys and values in the slab (views of its first rows, full width), written in
    place at the column `write_at` holds."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, write_at: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.write_at = keys, values, write_at
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.write_at, key_states)
        self.values.index_copy_(2, self.write_at, value_states)
        return self.keys, self.values

    def get_seq_length(self, *args) -> int:
        # Read by transformers 4.x only to make default cache positions, which the layer ignores
        # (the step passes its positions and a 4D mask). A graph bakes the value in.
        return self.keys.shape[-2]


@dataclass
class Slab:
    """Fixed buffers for up to `rows` rows of `width` cache columns, and the graphs over them."""

    rows: int
    width: int
    keys: list[torch.Tensor]  # per layer [rows, kv heads, width, head dim]
    values: list[torch.Tensor]
    ids: torch.Tensor  # [rows, 1] the token each row feeds
    pos: torch.Tensor  # [rows, 1] its position
    mask: torch.Tensor  # [rows, 1, 1, width] additive: 0 where attended, the dtype's minimum else
    write_at: torch.Tensor  # [1] the column this step writes
    largest: int  # the largest own slab (rows x slab_width) of the batches it was made for
    graphs: dict[int, tuple[Any, torch.Tensor]] = field(default_factory=dict)
    """{bucket rows: (CUDA graph, its logits output [bucket, vocab])}"""

    @classmethod
    def like(cls, layers: list, rows: int, width: int, largest: int) -> Slab:
        """Empty buffers shaped after a prefilled cache's layers."""
        k0 = layers[0].keys
        dev = k0.device

        def buf(t: torch.Tensor) -> torch.Tensor:
            return t.new_zeros(rows, t.shape[1], width, t.shape[-1])

        return cls(
            rows=rows,
            width=width,
            keys=[buf(layer.keys) for layer in layers],
            values=[buf(layer.values) for layer in layers],
            ids=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            pos=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            mask=torch.full(
                (rows, 1, 1, width), torch.finfo(k0.dtype).min, dtype=k0.dtype, device=dev
            ),
            write_at=torch.zeros(1, dtype=torch.long, device=dev),
            largest=largest,
        )

    def fits(self, layers: list, rows: int, need: int) -> bool:
        """Whether a batch of `rows` rows needing `need` columns can use this slab: it holds
        them, and is at most twice as wide as the batch's own would be (attention reads the
        whole width)."""
        return (
            rows <= self.rows and need <= self.width <= 2 * slab_width(need) and self.holds(layers)
        )

    def holds(self, layers: list) -> bool:
        """Whether the slab's buffers are shaped for these layers' keys and values."""
        return len(layers) == len(self.keys) and all(
            layer.keys.dtype == k.dtype
            and (layer.keys.shape[1], layer.keys.shape[3]) == (k.shape[1], k.shape[3])
            for layer, k in zip(layers, self.keys, strict=True)
        )


def graphable(cache) -> bool:
    """Whether a prefilled cache can move onto a slab: every layer a plain full-attention
    DynamicLayer of keys and values [batch, heads, length, dim] (not a sliding window, not a
    quantized or linear-attention layer, whose masks or states the slab does not keep)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(
        type(layer) is DynamicLayer
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and layer.keys.dim() == 4
        for layer in layers
    )


def buckets(rows: int) -> list[int]:
    """The row counts graphs are captured for: `rows`, then the powers of two below it."""
    out, b = [rows], 1
    while b < rows:
        out.append(b)
        b *= 2
    return sorted(set(out), reverse=True)


class GraphDecoder:
    """The static decode step of one backend: a slab kept across batches, a graph per bucket.
    `capture=False` (a CPU) runs the same step eagerly, as does the rest of a batch whose
    capture failed; later batches then take the growing cache (`usable`)."""

    def __init__(self, cache_kwarg: str, *, capture: bool, budget: int | None = None) -> None:
        self.model = None  # the model the slab's graphs were captured with
        self.cache_kwarg = cache_kwarg
        self.capture = capture
        self.budget = budget
        """`generate.transformers.batch_tokens`: a slab grown to hold two batch shapes stays within it (the
        backend plans each batch's own slab within it)."""
        self.slab: Slab | None = None
        self.pool = None  # the graphs' shared memory pool
        self.off: str | None = None
        """Why capture was given up (a failed capture or a replay that differs), else None."""
        self.declined: str | None = None
        """Why the model's batches cannot take the static step (its cache layers or positions,
        seen at a prefill), else None."""
        self.captures = 0

    def usable(self) -> bool:
        """Whether batches should take the static step: unless declined, on a CPU always
        (tests), on a GPU while graphs are on. Without them the eager static step is slower than
        the growing cache (attention over the slab's whole width, new layer objects every
        step)."""
        return self.declined is None and (not self.capture or self.off is None)

    def decline(self, why: str) -> None:
        """The model's prefilled cache cannot move onto a slab: its batches take the growing
        cache from now on (and are planned for it)."""
        self.declined = why
        self.release()

    def release(self) -> None:
        """Let the slab and its graphs go (graphs off, or the static step declined), so the
        growing cache that takes their place does not sit beside them in memory."""
        if self.slab is None:
            return
        self.slab = self.pool = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def start(self, model, cache, attn: torch.Tensor, width: int, steps: int) -> GraphRun:
        """A batch's decode by `model` on the slab, from its prefilled `cache` (left-padded
        prompts of `width` columns, `attn` their [rows, width] mask), with room for `steps`
        more. The prefill's keys and values are copied in and let go."""
        layers, rows = cache.layers, attn.shape[0]
        need = width + steps
        s = self.slab
        own = rows * slab_width(need)  # the batch's own slab
        if s is None or model is not self.model or not s.fits(layers, rows, need):
            rows_cap, width_cap, largest = self._new_shape(model, layers, rows, need)
            self.release()  # its graphs go with it
            self.slab = s = Slab.like(layers, rows_cap, width_cap, largest)
            self.model = model
        s.largest = max(s.largest, own)
        for layer, k, v in zip(layers, s.keys, s.values, strict=True):
            k[:rows, :, :width].copy_(layer.keys)
            v[:rows, :, :width].copy_(layer.values)
            # a stale column is masked, but a non-finite value there would still give 0 x inf
            k[:rows, :, width:].zero_()
            v[:rows, :, width:].zero_()
        s.mask[:rows].fill_(torch.finfo(s.mask.dtype).min)
        s.mask[:rows, 0, 0, :width].masked_fill_(attn.bool(), 0)
        run = GraphRun(self, cache, rows, width)
        self._bind(cache, run.bucket)
        return run

    def _new_shape(self, model, layers: list, rows: int, need: int) -> tuple[int, int, int]:
        """(rows, width, largest own slab) of the slab made for a batch the current slab does
        not fit: the batch's own, or, where batches alternate a wide and a tall shape (a token
        budget, multi-turn rollouts), which would otherwise rebuild the slab and recapture
        every time, one that holds both. That one must fit the batch (at most twice its own
        width), be at most twice the largest own slab of the batches it holds (so growths do
        not chain past it) and stay within the budget."""
        own = (rows, slab_width(need), rows * slab_width(need))
        s = self.slab
        if s is None or model is not self.model or not s.holds(layers):
            return own
        grown = max(s.rows, rows), max(s.width, own[1])
        area, largest = grown[0] * grown[1], max(s.largest, own[2])
        if (
            grown[1] <= 2 * own[1]
            and area <= 2 * largest
            and (self.budget is None or area <= self.budget)
        ):
            return (*grown, largest)
        return own

    def forward(self, cache, bucket: int) -> torch.Tensor:
        """The step's logits [bucket, vocab] on the slab's first `bucket` rows: a graph's replay,
        captured on first use, or the eager step."""
        s = self.slab
        if self.capture and self.off is None:
            if bucket in s.graphs:
                graph, logits = s.graphs[bucket]
                graph.replay()
                return logits
            if self._capture(cache, bucket):
                return s.graphs[bucket][1]  # the capture's check replayed this step already
        return self._eager(cache, bucket)

    def _bind(self, cache, bucket: int) -> None:
        """Point the cache's layers at the slab's first `bucket` rows."""
        s = self.slab
        for i in range(len(cache.layers)):
            cache.layers[i] = SlabLayer(s.keys[i][:bucket], s.values[i][:bucket], s.write_at)

    def _eager(self, cache, bucket: int) -> torch.Tensor:
        s = self.slab
        self._bind(cache, bucket)
        out = self.model(
            input_ids=s.ids[:bucket],
            attention_mask=s.mask[:bucket],
            position_ids=s.pos[:bucket],
            use_cache=True,
            **{self.cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    def _capture(self, cache, bucket: int) -> bool:
        """Record the step for `bucket` rows: a warm-up on a side stream (it writes this step's
        keys and values, which the replay writes again), the capture, and one replay, checked to
        give the warm-up's logits. A failure turns graphs off for this backend (False)."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                expected = self._eager(cache, bucket).clone()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                logits = self._eager(cache, bucket)
            graph.replay()
            if not torch.allclose(logits.float(), expected.float(), rtol=1e-2, atol=1e-2):
                raise RuntimeError("the replayed step's logits differ from the eager step's")
        except Exception as e:  # any failure: the eager static step is always correct
            self.off = f"{type(e).__name__}: {e}"[:300]
            log.warning("CUDA graphs off for generate's decode (eager steps): %s", self.off)
            return False
        # Graphs share one memory pool: safe because they never run at once, and each replay's
        # logits are read before the next replay (which may reuse their memory).
        self.pool = graph.pool()
        self.slab.graphs[bucket] = (graph, logits)
        self.captures += 1
        return True

    def take_stats(self) -> dict[str, Any]:
        """For the stage's `stats.phases`: the graphs captured since the last call, and why
        graphs are off where they are."""
        out: dict[str, Any] = {"graph_captures": self.captures}
        self.captures = 0
        off = self.declined or self.off
        return out | ({"graphs_off": off} if off else {})


class GraphRun:
    """One batch's decode on the slab (a kv_cache.DecodeCache): rows 0..live-1 are the batch's active rows, in the
    order of the backend's `act`; the step runs on the smallest bucket that holds them."""

    def __init__(self, decoder: GraphDecoder, cache, rows: int, width: int) -> None:
        self.decoder = decoder
        self.cache = cache
        self.width = width
        self.ladder = buckets(decoder.slab.rows)
        self.live = rows
        self.bucket = self.bucket_for(rows)
        self.t = 0  # the steps taken

    def bucket_for(self, rows: int) -> int:
        return min(b for b in self.ladder if b >= rows)

    def can_admit(self) -> bool:
        """Rows join the slab only at a batch's start (continuous batching takes the growing
        cache)."""
        return False

    def worth_dropping(self, n_done: int, n_active: int) -> bool:
        """Whether dropping the finished rows moves the step to a smaller bucket; otherwise the
        finished rows ride along, masked by their pad tokens (a drop would only cost its copy)."""
        return self.bucket_for(max(n_active - n_done, 1)) < self.bucket

    def step(self, feed: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        """The next step: each active row feeds `feed` at `next_pos`, written to the column after
        the last one written. Returns the next logits of the active rows [live, vocab]."""
        s, k = self.decoder.slab, self.live
        col = self.width + self.t
        self.t += 1
        s.ids[:k, 0].copy_(feed)
        s.pos[:k, 0].copy_(next_pos)
        s.mask[:k, 0, 0, col] = 0
        s.write_at.fill_(col)
        return self.decoder.forward(self.cache, self.bucket)[:k]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` (ascending indices of the active rows), moved to the front."""
        s, k = self.decoder.slab, len(keep)
        for buf in (*s.keys, *s.values, s.mask):
            buf[:k] = buf[keep]  # the gather copies first, so the rows may overlap
        self.live = k
        self.bucket = self.bucket_for(k)
