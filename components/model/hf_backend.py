"""Transformers generation backend: batched, left-padded, KV-cached, per-sample seeded.

It runs its own decode loop over the model's forward (rather than `model.generate`) so that the
three things the trainer depends on are explicit: the per-token log-probability definition
(backends.LOGPROB_DEFINITION), per-sample random streams that do not depend on the batch, and the
stop rules. Each step's tokens are drawn by token_sampling.py (inverse-CDF draws from a
per-sample uniform stream: sample `s` at step `t` always consumes uniform `u[s, t]` from its own
generator).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from components.core.errors import UserError
from components.model import device_turn
from components.model.backends import (
    BackendInfo,
    PromptRequest,
    Sample,
    SamplingSpec,
    cut_at_stop,
)
from components.model.batching import (
    Continuous,
    DecodeState,
    Planned,
    stop_window,
)
from components.model.graph_decode import GraphDecoder, graphable, slab_width, static_step_fits
from components.model.kv_cache import DecodeCache, GrowingCache, rows_movable
from components.model.profiling import PhaseClock
from components.model.token_sampling import sample_step, sample_uniforms


class TransformersBackend:
    """Generation with a Hugging Face causal LM on CPU or one GPU."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 64,
        batch_tokens: int | None = None,
        device: str = "cpu",
        vision=None,
        graphs: bool = False,
        continuous: bool = False,
    ) -> None:
        import transformers

        if tokenizer.pad_token_id is None:
            raise UserError(
                "the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the eos token) "
                "in the checkpoint's tokenizer_config.json"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        self.device = device
        self.vision = vision
        """A vision-language policy's `VisionProcessor` (image prompts), else None."""
        self.eos_ids = _eos_ids(model, tokenizer)
        if vision is not None:  # a sampled image placeholder ends the response (the trainer
            # could not feed it back as text: the model takes it for an image's place)
            from components.model.vision import placeholder_ids

            self.eos_ids |= placeholder_ids(model)
        self.cache_kwarg = cache_kwarg(model)
        unfit = static_step_fits(model) if graphs else None
        self.graphs = (
            GraphDecoder(
                self.cache_kwarg, capture=str(device).startswith("cuda"), budget=batch_tokens
            )
            if graphs and unfit is None
            else None
        )
        """Decode steps on a static cache, replayed as CUDA graphs on a GPU (graph_decode.py;
        eager on a CPU, where tests check it), else None: the growing cache (kv_cache.py)."""
        self.graphs_unfit = unfit
        """Why graphs were asked for and not taken (the model), for `stats.phases`."""
        self.continuous = continuous
        """Continuous batching (batching.py): a finished row's room goes to the next prompt."""
        self.clock = PhaseClock(device)
        """Seconds per phase of the calls so far (`clock.take()`: the stage's `stats.phases`)."""
        self.before_forward = device_turn.waiter()
        """Called before every forward: a local evaluation worker's wait for its turn on the
        device it shares with generate and train (components/model/device_turn.py), else None."""
        self.last_logits_only = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
        weight = next(model.parameters())
        self.info = BackendInfo(
            "transformers",
            transformers.__version__,
            dtype=str(weight.dtype).removeprefix("torch."),
            device=weight.device.type,
        )

    def warm_up(self) -> None:
        """One short sampling call (a one-token prompt, two steps), at the engine's start: a
        process's first forward on a GPU loads kernels and libraries (half a second on an H200),
        which otherwise lands in the first iteration's sampling, not in the engine's load. Draws
        are seeded per sample, so nothing sampled later changes."""
        spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=2)
        for _ in self.generate(
            [PromptRequest("warm-up", [self.tokenizer.pad_token_id], [0])], spec
        ):
            pass
        self.clock.take()

    def load_weights(self, checkpoint_dir: Path) -> None:
        """Load a checkpoint's weights into the running model, in place (a warm engine taking a
        new policy). Every parameter must be set, except those tied to one that is (lm_head to
        the embeddings); config and tokenizer are the caller's to check (PolicyEngine)."""
        from safetensors import safe_open

        # Streamed: one tensor at a time from the file straight into its parameter, so loading
        # needs no second copy of the model in memory.
        loader = self.weight_loader(f"checkpoint {checkpoint_dir}")
        for f in sorted(Path(checkpoint_dir).glob("*.safetensors")):
            with safe_open(str(f), framework="pt", device="cpu") as st:
                keys = list(st.keys())
                loader.start(keys)
                for key in keys:
                    loader.put(key, st.get_tensor(key))
        loader.finish()

    def receive(self, receiver, version: int) -> tuple[object, int]:
        """Policy `version` over the weight channel (components/model/channel.py), one tensor
        at a time into the running model; returns what gives the bytes' sha256s, and the bytes."""
        loader = self.weight_loader(f"policy {version} over the weight channel")
        received = receiver.receive(version, loader)
        loader.finish()
        return received, receiver.last_bytes

    def set_adapter(self, adapter_dir: Path, base_digest: str) -> None:
        """Sample from now on with the LoRA adapter in `adapter_dir` on the loaded base (of
        `base_digest`): PEFT's model on the first one, then each new adapter's weights in place."""
        from components.model.adapter import load_adapter, load_adapter_weights

        if hasattr(self.model, "peft_config"):
            load_adapter_weights(self.model, adapter_dir)
        else:
            self.model = load_adapter(self.model, adapter_dir, base_digest).eval()

    def close(self) -> None:
        """Nothing outlives the model object (a GPU's memory goes with it)."""

    def weight_loader(self, source: str) -> InPlace:
        """Weights into the running model one tensor at a time, from any source (a checkpoint's
        files, the weight channel's buckets)."""
        return InPlace(self.model, source)

    def generate(self, requests: list[PromptRequest], spec: SamplingSpec) -> Iterator[list[Sample]]:
        # Sorted by prompt length to cut padding; whole prompts join the decode, so every
        # prompt's n samples are yielded together (batching.py).
        ordered = sorted(requests, key=lambda r: len(r.prompt_token_ids))
        if self.continuous:
            rows = self._continuous_rows(ordered, spec)
            admission: Planned = Continuous(len(ordered), spec.n, rows)
        else:
            admission = Planned([len(b) for b in self.plan_batches(ordered, spec)])
            rows = spec.n * max(admission.sizes, default=0)
        yield from self._sample(ordered, spec, admission, rows)

    def plan_batches(
        self, ordered: list[PromptRequest], spec: SamplingSpec
    ) -> list[list[PromptRequest]]:
        """Consecutive prompts (sorted by length) per batch, bounded by batch_size sequences and,
        when set, by batch_tokens = sequences x the cache columns a row takes: longest prompt +
        max_new_tokens, rounded up to the slab's power of two where the static step runs (its
        cache is that wide). A prompt's n samples always stay together."""
        batches: list[list[PromptRequest]] = []
        cur: list[PromptRequest] = []
        width = 0
        for r in ordered:
            rows = (len(cur) + 1) * spec.n
            new_width = max(width, len(r.prompt_token_ids))
            over_rows = rows > max(self.batch_size, spec.n)
            over_tokens = (
                self.batch_tokens is not None
                and rows * self._columns(new_width + spec.max_new_tokens) > self.batch_tokens
            )
            if cur and (over_rows or over_tokens):
                batches.append(cur)
                cur, new_width = [], len(r.prompt_token_ids)
            cur.append(r)
            width = new_width
        if cur:
            batches.append(cur)
        return batches

    def _columns(self, need: int) -> int:
        """The KV cache columns a row that needs `need` of them takes: the slab's width where
        batches take the static step (graph_decode.py), else `need`."""
        return slab_width(need) if self.graphs is not None and self.graphs.usable() else need

    def _prefill(self, ids, attn, pos, n: int, vision=None):
        """The prompts' forward: (KV cache, last position's logits) for every row. Rows come in
        runs of `n` copies of one prompt; each run is computed once and its cache repeated,
        unless the model's cache cannot be repeated (kv_cache.rows_movable): then every row.
        `pos` is [B, P], or [3, B, P] for M-RoPE; `vision`: each row's VisionInputs (image
        prompts), whose pixel values go in for the rows computed."""
        from components.model.vision import VisionInputs

        rows = slice(None, None, n) if n > 1 else slice(None)
        if self.before_forward is not None:
            self.before_forward()
        extra = {}
        if vision is not None:
            picked = VisionInputs.cat(vision[rows])
            if picked is not None:
                extra = picked.kwargs(self.device, next(self.model.parameters()).dtype)
        out = self.model(
            input_ids=ids[rows],
            attention_mask=attn[rows],
            position_ids=pos[..., rows, :],
            use_cache=True,
            **self.last_logits_only,
            **extra,
        )
        past, logits = getattr(out, self.cache_kwarg), out.logits[:, -1, :]
        if n == 1:
            return past, logits
        if rows_movable(past):
            past.batch_repeat_interleave(n)
            return past, logits.repeat_interleave(n, dim=0)
        del out, past, logits
        return self._prefill(ids, attn, pos, 1, vision)

    def _positions(self, batch: list[PromptRequest], ids, attn, pos, n: int):
        """(prefill positions, each row's next position, each row's VisionInputs) of a batch:
        text positions for a text policy; M-RoPE positions for image prompts (computed once per
        prompt), whose decode positions run on from the prompt's largest."""
        if self.vision is None or all(r.vision is None for r in batch):
            return pos, pos[:, -1] + 1, None
        from components.model.vision import VisionInputs, rope_index

        per_prompt = VisionInputs.cat([r.vision for r in batch])
        pos3 = rope_index(self.model, ids[::n], attn[::n], per_prompt)[0]
        pos3 = pos3.to(self.device).repeat_interleave(n, dim=1)
        vision = np.array([r.vision for r in batch for _ in range(n)], dtype=object)
        # Each row's next position: one past its largest (its last token is text, the same in
        # all three sections). Not `pos + delta`: transformers 4.x measures its delta against
        # the padded length, 5.x against the row's own, so a left-padded row would be off.
        return pos3, pos3.amax(dim=(0, 2)) + 1, vision

    def _continuous_rows(self, ordered: list[PromptRequest], spec: SamplingSpec) -> int:
        """The rows continuous batching decodes at once: batch_size, and within batch_tokens.
        A join right-aligns every row at the newest column and gives each room for
        max_new_tokens more, and the oldest row may have drawn almost max_new_tokens already, so
        a row may take the longest prompt + twice max_new_tokens columns."""
        rows = max(self.batch_size, spec.n)
        if self.batch_tokens is not None and ordered:
            width = len(ordered[-1].prompt_token_ids) + 2 * spec.max_new_tokens
            rows = min(rows, self.batch_tokens // width)
        return max(spec.n, rows - rows % spec.n)

    @torch.inference_mode()
    def _sample(
        self, ordered: list[PromptRequest], spec: SamplingSpec, admission: Planned, slots: int
    ) -> Iterator[list[Sample]]:
        """Decode the call's rows as `admission` lets them join; yield each prompt's samples
        once all n have finished (batching.py)."""
        n = spec.n
        state = DecodeState.empty(slots, spec.max_new_tokens, self._pad(), self.device)
        eos = torch.tensor(
            sorted(self.eos_ids | set(spec.stop_token_ids)), dtype=torch.long, device=self.device
        )
        left, ready = [n] * len(ordered), []
        while True:
            first = admission.next
            if k := admission.take(len(state.act)):
                with attention_kernels(self.device), self.clock("prefill"):
                    self._join(state, ordered[first : first + k], first, spec)
            if not len(state.act):
                break
            with attention_kernels(self.device), self.clock("decode"):
                gone = self._decode(state, spec, eos, admission)
            for row in gone:
                left[row // n] -= 1
                if not left[row // n]:
                    ready.append(row // n)
            if ready and admission.flush(len(state.act)):
                with self.clock("detokenize"):
                    samples = self._samples(ordered, sorted(ready), state, spec)
                ready = []
                yield samples
        self._note_graphs()

    def _pad(self) -> int:
        return self.tokenizer.pad_token_id

    def _note_graphs(self) -> None:
        """Into the call's phases: the graphs this call captured, or why graphs are off."""
        notes = self.clock.notes
        if self.graphs is not None:
            stats = self.graphs.take_stats()
            notes["graph_captures"] = notes.get("graph_captures", 0) + stats["graph_captures"]
            if "graphs_off" in stats:
                notes["graphs_off"] = stats["graphs_off"]
        if self.graphs_unfit:
            notes["graphs_off"] = self.graphs_unfit

    def _join(
        self, state: DecodeState, batch: list[PromptRequest], first: int, spec: SamplingSpec
    ) -> None:
        """Prompts `first`.. of the call join the decode: left-padded to the longest, prefilled
        once each (its n samples share it), into the KV cache with room for every step, and
        their first step's logits."""
        n, T = spec.n, spec.max_new_tokens
        rows = [(r, j) for r in batch for j in range(n)]
        prompts = [r.prompt_token_ids for r, _ in rows]
        P = max(len(p) for p in prompts)
        ids, attn = left_pad(prompts, P, self._pad())
        uniforms = sample_uniforms([r.sample_seeds[j] for r, j in rows], T)
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        pos, next_pos, vision = self._positions(batch, ids, attn, pos, n)
        g = self.graphs
        if g is not None and not g.usable():
            g.release()  # graphs went off (a failed capture): the slab goes before the prefill
        # Only the last position's logits are needed, so the output head (a large matmul at a
        # large vocabulary) runs on that position alone.
        past, logits = self._prefill(ids, attn, pos, n, vision)
        if state.cache is not None:  # continuous batching: beside the rows decoding
            state.cache.admit(past, attn, T)
        else:
            state.cache = self._cache(past, attn, T, mrope=pos.dim() == 3)
        state.join(
            list(range(first * n, (first + len(batch)) * n)),
            uniforms.to(self.device),
            logits,
            next_pos,
        )

    def _cache(self, past, attn, steps: int, *, mrope: bool) -> DecodeCache:
        """The decode's KV cache from a prefill: the static step's slab where it runs
        (graph_decode.py), else the growing cache (kv_cache.py). M-RoPE positions (image prompts)
        and continuous batching take the growing cache; a cache the slab cannot keep is the
        model's, so its batches decline the slab for good."""
        g = self.graphs
        if g is None or not g.usable():
            return GrowingCache(self.model, self.cache_kwarg, past, attn, steps, mrope=mrope)
        if not graphable(past):
            g.decline("cache layers the slab does not keep (sliding window, quantized, ...)")
        elif mrope or self.continuous:
            why = "M-RoPE positions (image prompts)" if mrope else "continuous batching"
            self.clock.notes.setdefault("graphs_off", why)
        else:
            return g.start(self.model, past, attn, attn.shape[1], steps)  # graph_decode.py
        return GrowingCache(self.model, self.cache_kwarg, past, attn, steps, mrope=mrope)

    def _decode(self, state: DecodeState, spec: SamplingSpec, eos, admission: Planned) -> list:
        """Sample step after step until every active row has finished, or prompts may join;
        returns the rows that left."""
        window = stop_window(spec.stop)
        left: list = []
        while True:
            tok, lp = sample_step(state.logits, state.draws(), spec)
            open_rows = state.record(tok, lp, eos)
            if spec.stop:
                state.check_stop(self.tokenizer, open_rows, spec.stop, window)
            state.advance()
            done = state.finished[state.act]
            # The step's one read back to the host (on a GPU each waits for the queue to
            # drain): every row has finished when every active one has (a row leaves the
            # active ones only once finished).
            n_done, n_active = int(done.sum()), len(state.act)
            if n_done == n_active:
                return left + state.retire_all()
            joining = admission.wants(n_active - n_done) and state.cache.can_admit()
            if n_done and (joining or state.cache.worth_dropping(n_done, n_active)):
                tok, gone = state.drop_finished(tok, done)
                done, left = torch.zeros_like(tok, dtype=torch.bool), left + gone
            self._step(state, torch.where(done, state.pad, tok))
            if joining or (left and admission.streams):
                return left

    def _step(self, state: DecodeState, feed: torch.Tensor) -> None:
        """The forward of one step on the active rows: `feed` (each row's newest token, pad for
        a finished row) in, the next step's logits out."""
        if self.before_forward is not None:
            self.before_forward()
        self.clock.steps += 1
        state.logits = state.cache.step(feed, state.next_pos)
        state.next_pos = state.next_pos + 1

    def _samples(
        self, ordered: list[PromptRequest], prompts: list[int], state: DecodeState, spec
    ) -> list[Sample]:
        """The samples of `prompts` (indices into the call's), from the rows that left: each
        row's tokens decoded and cut at a stop string."""
        samples = []
        for p in prompts:
            for j in range(spec.n):
                tok_ids, logps, stopped = state.left.pop(p * spec.n + j)
                text = self.tokenizer.decode(tok_ids, skip_special_tokens=True)
                if spec.stop:
                    text = cut_at_stop(text, spec.stop)[0]
                samples.append(
                    Sample(
                        prompt_id=ordered[p].prompt_id,
                        sample_index=j,
                        response=text,
                        response_token_ids=tok_ids,
                        response_logprobs=logps,
                        finish_reason="stop" if stopped else "length",
                    )
                )
        return samples


def attention_kernels(device: str):
    """The SDPA kernels sampling may use: on a GPU, every one but cuDNN's, which builds an
    execution plan for each new key length and so costs a millisecond of host time per layer at
    every decode step of every iteration (each brings prompts of new lengths); measured on an
    H200, 55-68 ms a step with it, 22-31 without (docs/gpu.md)."""
    from contextlib import nullcontext

    if not str(device).startswith("cuda"):
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def left_pad(prompts: list[list[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, attention mask) of prompts left-padded to `width`.  # -> [B, width] x 2"""
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, width - len(p) :] = 1
    return ids, attn


class InPlace:
    """Tensors into a loaded model's parameters, by the names a checkpoint saves them under
    (`start` learns them, `put` copies one, `finish` checks every parameter was set but those
    tied to one that was)."""

    def __init__(self, model, source: str) -> None:
        self.state = model.state_dict()  # views of the parameters and buffers
        self.source = source
        self.names: dict[str, str | None] = {}
        self.seen: set[str] = set()
        self.unexpected: list[str] = []

    def start(self, keys: list[str]) -> None:
        self.names.update(saved_names(keys, self.state))

    def put(self, saved: str, tensor: torch.Tensor) -> None:
        name = self.names.get(saved)
        if name is None:
            self.unexpected.append(saved)
            return
        if tensor.shape != self.state[name].shape:
            raise ValueError(
                f"{self.source}: {name} has shape {tuple(tensor.shape)}, the loaded model "
                f"{tuple(self.state[name].shape)}"
            )
        with torch.no_grad():
            self.state[name].copy_(tensor)
        self.seen.add(name)

    def finish(self) -> None:
        loaded = {self.state[k].data_ptr() for k in self.seen}
        untied = [
            k for k in self.state if k not in self.seen and self.state[k].data_ptr() not in loaded
        ]
        if self.unexpected or untied:
            raise ValueError(
                f"{self.source} does not fit the loaded model: missing {untied[:3]}, "
                f"unexpected {self.unexpected[:3]}"
            )


def saved_names(keys: list[str], state: dict) -> dict[str, str | None]:
    """{name in the file: name in the loaded model, or None}. transformers saves some models
    under their original checkpoint names (a Qwen2-VL's `model.layers.*` is the loaded model's
    `model.language_model.layers.*`, its `visual.*` is `model.visual.*`): a name not in the model
    maps to the one model name that ends with it less its first component, where exactly one
    does, never a name another key already took; the caller checks shapes and completeness."""
    out: dict[str, str | None] = {k: (k if k in state else None) for k in keys}
    taken = {v for v in out.values() if v is not None}
    missing = [k for k in keys if out[k] is None]
    if not missing:
        return out
    free = [s for s in state if s not in taken]
    for k in missing:
        tail = "." + k.split(".", 1)[-1]
        hits = [s for s in free if s.endswith(tail)]
        if len(hits) == 1 and hits[0] not in taken:
            out[k] = hits[0]
            taken.add(hits[0])
    return out


def cache_kwarg(model) -> str:
    """The name under which this transformers version passes and returns the KV cache: `cache`
    (transformers >= 5.2x, which warns on the old name) or `past_key_values` (4.x, the GPU
    images' pin). Read from the model class's forward signature, under a PEFT wrapper too."""
    return "cache" if _accepts(model, "cache") else "past_key_values"


def _accepts(model, name: str) -> bool:
    """Whether the model class's forward takes keyword `name` (under a PEFT wrapper too)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return name in inspect.signature(type(base).forward).parameters


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    if not ids:
        raise UserError(
            "neither the tokenizer nor generation_config defines an eos token id; set eos_token "
            "in the checkpoint's tokenizer_config.json or eos_token_id in its generation_config.json"
        )
    return ids
