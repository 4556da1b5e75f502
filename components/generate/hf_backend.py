"""Transformers generation backend: batched, left-padded, KV-cached, per-sample seeded.

It runs its own decode loop over the model's forward (rather than `model.generate`) so that the
three things the trainer depends on are explicit: the per-token log-probability definition
(backends.LOGPROB_DEFINITION), per-sample random streams that do not depend on the batch, and the
stop rules. Sampling uses inverse-CDF draws from a per-sample uniform stream: sample `s` at step
`t` always consumes uniform `u[s, t]` from its own generator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from components.core.errors import UserError
from components.generate.backends import (
    BackendInfo,
    PromptRequest,
    Sample,
    SamplingSpec,
    cut_at_stop,
)
from components.generate.kv_cache import reserve, rows_movable


def filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k and the top-p nucleus with -inf.  # [B, V] -> [B, V]"""
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def sampling_probs(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """The distribution a sample is drawn from, in float64.  # [B, V] -> [B, V]

    float64 from float32 logits: the logits of one row differ in their last bits
    between batch layouts (padding width, batch size and thread count change the kernels'
    summation order), and a float32 cumulative sum over a large vocabulary adds its own
    layout-free but sizeable rounding. In float64 the CDF carries the logits' rounding only, so a
    draw moves between layouts only when its uniform lies within about 1e-7 of a CDF boundary.
    """
    scaled = logits.double() / spec.temperature
    return torch.softmax(filter_logits(scaled, spec.top_k, spec.top_p), dim=-1)


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one token per row with the given uniforms.  # probs [B, V], u [B] -> [B]"""
    cdf = probs.cumsum(-1)
    tok = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1), right=True)
    tok = tok.squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # Never pick a zero-probability token at the boundary of float round-off.
    bad = probs.gather(-1, tok.unsqueeze(-1)).squeeze(-1) <= 0
    if bad.any():
        tok = torch.where(bad, probs.argmax(-1), tok)
    return tok


#: Float64 elements per sampler chunk (16 MB): see `sample_step`.
SAMPLER_CHUNK_ELEMENTS = 1 << 21


def sample_step(
    logits: torch.Tensor, u: torch.Tensor, spec: SamplingSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: each row's token and its log-probability (LOGPROB_DEFINITION).
    # logits [B, V], u [B] float64 -> tokens [B] long, logprobs [B] float32

    Rows go through `sample_rows` in even chunks of at most 16 MB of float64 (42 rows at a 49k
    vocabulary). Every operation is per row, so the result is the same as in one piece, bit for
    bit (tested at a vocabulary over PyTorch's parallel grain with two threads); but a [128, 49152] float64 temporary is 50 MB, which the allocator maps fresh from the
    kernel and faults in page by page. Measured on SmolLM2-135M (2-core CPU, bf16, 128 rows, 48
    new tokens): the sampler's share of the generate stage fell from 0.80 s to 0.54 s of about
    6 s (alone, on one `[128, 49152]` input: 50 ms against 14 ms). On a GPU, whose allocator keeps
    its blocks, the rows go in one piece.
    """
    rows = max(1, SAMPLER_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    if logits.shape[0] <= rows or logits.device.type != "cpu":  # GPU allocators cache: no faults
        return sample_rows(logits, u, spec)
    # Even chunks (sizes differ by at most one): never a chunk of one row after larger ones. A
    # one-row reduction over a long row is split across threads, which adds in another order
    # than the per-row reduction of a multi-row tensor (the last bits of a logprob would move).
    chunks = -(-logits.shape[0] // rows)
    parts = [
        sample_rows(x, v, spec)
        for x, v in zip(logits.tensor_split(chunks), u.tensor_split(chunks), strict=True)
    ]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def sample_rows(
    logits: torch.Tensor, u: torch.Tensor, spec: SamplingSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_step` on rows that fit one chunk.
    # logits [B, V], u [B] float64 -> tokens [B] long, logprobs [B] float32

    The draw is `sample_inverse_cdf(sampling_probs(logits, spec), u)` without the normalized
    distribution: in float64, the CDF is the running sum of exp(logit/T - max) and the uniform is
    scaled by its total, which is the same draw (the scale cancels) in a third of the passes
    over a [B, V] tensor. The log-probability comes from the same float64 sums (before top-k /
    top-p): log p = logit/T - max - log(total). At a 49k vocabulary and 128 rows the sampler's
    passes over the logits were a quarter of a CPU decode step.
    """
    s = logits.to(torch.float64, copy=True)
    if spec.temperature > 0:
        s.div_(spec.temperature)
    m = s.amax(-1, keepdim=True)
    if spec.temperature == 0:
        tok = s.argmax(-1)
        lse = m + torch.sub(s, m).exp_().sum(-1, keepdim=True).log_()
    else:
        kept = filter_logits(s, spec.top_k, spec.top_p)
        if kept is s:
            cdf = torch.sub(s, m).exp_().cumsum_(-1)
            lse = m + cdf[:, -1:].log()
        else:
            lse = torch.logsumexp(s, -1, keepdim=True)
            cdf = torch.sub(kept, kept.amax(-1, keepdim=True)).exp_().cumsum_(-1)
        total = cdf[:, -1:]
        tok = torch.searchsorted(cdf, u.to(cdf.dtype).unsqueeze(-1) * total, right=True)
        tok = tok.squeeze(-1).clamp(max=s.shape[-1] - 1)
        # Never pick a zero-probability token at the boundary of float round-off.
        at = cdf.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        before = cdf.gather(-1, (tok - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
        bad = (torch.where(tok > 0, at - before, at)) <= 0
        if bad.any():
            tok = torch.where(bad, kept.argmax(-1), tok)
    lp = (s.gather(-1, tok.unsqueeze(-1)) - lse).squeeze(-1)
    return tok, lp.float()


def sample_uniforms(seeds: list[int], steps: int) -> torch.Tensor:
    """One float64 uniform per (sample, step), each sample from its own generator.  # [B, T]"""
    return torch.stack(
        [
            torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
            for s in seeds
        ]
    )


def draw_margin(logits: torch.Tensor, u: float, spec: SamplingSpec) -> float:
    """How far one draw is from changing: the smallest relative perturbation of its inputs that
    could pick another token.  # logits [V] (float32, one step of one sample), u in [0, 1)

    The minimum of three distances, each relative (so one tolerance serves every vocabulary):
    the uniform's distance to the nearest CDF boundary (in probability mass); with top-k, the gap
    between the k-th and (k+1)-th logit over the logit scale; with top-p, the distance of the
    nucleus's cumulative mass from `top_p`. Greedy: the gap between the two largest logits.
    Two layouts can draw different tokens only where this is at the level of float rounding
    (docs/contracts.md, "Batch and shard invariance").
    """
    logits = logits.double()
    scale = float(logits.abs().max()) or 1.0
    top2 = torch.topk(logits, 2).values
    if spec.temperature == 0:
        return float(top2[0] - top2[1]) / scale
    margins = []
    scaled = logits / spec.temperature
    if spec.top_k and spec.top_k < logits.numel():
        kk = torch.topk(scaled, spec.top_k + 1).values
        margins.append(float(kk[-2] - kk[-1]) / (scale / spec.temperature))
    if spec.top_p < 1.0:
        p = torch.softmax(scaled, -1).sort(descending=True).values
        margins.append(float((p.cumsum(-1) - p - spec.top_p).abs().min()))
    probs = sampling_probs(logits[None], spec)[0]
    cdf = probs.cumsum(-1)
    target = u * float(cdf[-1])
    margins.append(float((cdf[probs > 0] - target).abs().min()))
    return min(margins)


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
            from components.core.vision import placeholder_ids

            self.eos_ids |= placeholder_ids(model)
        self.cache_kwarg = cache_kwarg(model)
        self.last_logits_only = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
        weight = next(model.parameters())
        self.info = BackendInfo(
            "transformers",
            transformers.__version__,
            dtype=str(weight.dtype).removeprefix("torch."),
            device=weight.device.type,
        )

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

    def weight_loader(self, source: str) -> InPlace:
        """Weights into the running model one tensor at a time, from any source (a checkpoint's
        files, the weight channel's buckets)."""
        return InPlace(self.model, source)

    def generate(self, requests: list[PromptRequest], spec: SamplingSpec) -> Iterator[list[Sample]]:
        # Sort by prompt length to cut padding; whole prompts per batch, so every prompt's n
        # samples are yielded together.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_token_ids))
        for batch in self.plan_batches([requests[i] for i in order], spec):
            yield self._generate_batch(batch, spec)

    def plan_batches(
        self, ordered: list[PromptRequest], spec: SamplingSpec
    ) -> list[list[PromptRequest]]:
        """Consecutive prompts (sorted by length) per batch, bounded by batch_size sequences and,
        when set, by batch_tokens = sequences x (longest prompt + max_new_tokens). A prompt's n
        samples always stay together."""
        batches: list[list[PromptRequest]] = []
        cur: list[PromptRequest] = []
        width = 0
        for r in ordered:
            rows = (len(cur) + 1) * spec.n
            new_width = max(width, len(r.prompt_token_ids))
            over_rows = rows > max(self.batch_size, spec.n)
            over_tokens = (
                self.batch_tokens is not None
                and rows * (new_width + spec.max_new_tokens) > self.batch_tokens
            )
            if cur and (over_rows or over_tokens):
                batches.append(cur)
                cur, new_width = [], len(r.prompt_token_ids)
            cur.append(r)
            width = new_width
        if cur:
            batches.append(cur)
        return batches

    def _prefill(self, ids, attn, pos, n: int, vision=None):
        """The prompts' forward: (KV cache, last position's logits) for every row. Rows come in
        runs of `n` copies of one prompt; each run is computed once and its cache repeated,
        unless the model's cache cannot be repeated (kv_cache.rows_movable): then every row.
        `pos` is [B, P], or [3, B, P] for M-RoPE; `vision`: each row's VisionInputs (image
        prompts), whose pixel values go in for the rows computed."""
        from components.core.vision import VisionInputs

        rows = slice(None, None, n) if n > 1 else slice(None)
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
        from components.core.vision import VisionInputs, rope_index

        per_prompt = VisionInputs.cat([r.vision for r in batch])
        pos3 = rope_index(self.model, ids[::n], attn[::n], per_prompt)[0]
        pos3 = pos3.to(self.device).repeat_interleave(n, dim=1)
        vision = np.array([r.vision for r in batch for _ in range(n)], dtype=object)
        # Each row's next position: one past its largest (its last token is text, the same in
        # all three sections). Not `pos + delta`: transformers 4.x measures its delta against
        # the padded length, 5.x against the row's own, so a left-padded row would be off.
        return pos3, pos3.amax(dim=(0, 2)) + 1, vision

    @torch.inference_mode()
    def _generate_batch(self, batch: list[PromptRequest], spec: SamplingSpec) -> list[Sample]:
        # A prompt's n rows are consecutive: _prefill computes each run of them once.
        rows = [(r, j) for r in batch for j in range(spec.n)]
        prompts = [r.prompt_token_ids for r, _ in rows]
        B, P, T = len(rows), max(len(p) for p in prompts), spec.max_new_tokens
        pad = self.tokenizer.pad_token_id
        ids = torch.full((B, P), pad, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, P - len(p) :] = 1
        uniforms = sample_uniforms([r.sample_seeds[j] for r, j in rows], T)
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        pos, next_pos, vision = self._positions(batch, ids, attn, pos, spec.n)
        mrope = pos.dim() == 3
        # The mask for all steps, allocated once; step t feeds a view of its first P+t+1 columns.
        attn_all = torch.ones((B, P + T), dtype=attn.dtype, device=self.device)
        attn_all[:, :P] = attn
        # Prefill, once per prompt: its n samples share it, so the cache and the last logits are
        # repeated n times after (prefilling every row was n times the work, as much as the whole
        # decode for short answers). Only the last position's logits are needed: at a 49k
        # vocabulary the head over every prompt position is most of the prefill's work.
        past, logits = self._prefill(ids, attn, pos, spec.n, vision)
        # Room for every step's keys and values, written in place (kv_cache.py).
        reserve(past, P + T)

        eos = torch.tensor(
            sorted(self.eos_ids | set(spec.stop_token_ids)), dtype=torch.long, device=self.device
        )
        window = stop_window(spec.stop)
        dev = self.device
        tokens = torch.full((B, T), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((B, T), dtype=torch.float32, device=dev)
        lengths = torch.zeros(B, dtype=torch.long, device=dev)
        finished = torch.zeros(B, dtype=torch.bool, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        uniforms = uniforms.to(dev)
        # The rows still sampling (`act`, indices into the batch): the per-step tensors (logits,
        # mask, positions, uniforms, the KV cache) hold these rows only. Finished rows are dropped
        # from them once they are an eighth of the rows: a static batch otherwise computes every
        # row until its longest response ends (with real models' response lengths, most of the
        # decode work went to rows that were done).
        act = torch.arange(B, device=dev)
        compact = rows_movable(past)
        for t in range(T):
            tok, lp = sample_step(logits, uniforms[:, t], spec)
            live = ~finished[act]
            tokens[act, t] = torch.where(live, tok, pad)
            logps[act, t] = torch.where(live, lp, 0.0)
            lengths[act] += live
            hit_eos = torch.isin(tok, eos) & live
            finished[act] = finished[act] | hit_eos
            stopped[act] = stopped[act] | hit_eos
            if spec.stop:
                # Text-level, per row, over the last tokens only (`stop_in_tail`): a stop string
                # that completes at this step lies within them (every earlier step was checked),
                # and decoding the whole response each step costs O(T^2) per row.
                for i in act[live & ~hit_eos].tolist():
                    if stop_in_tail(self.tokenizer, tokens[i], t + 1, spec.stop, window):
                        finished[i] = True
                        stopped[i] = True
            if bool(finished.all()) or t == T - 1:
                break
            done = finished[act]
            if compact and 8 * int(done.sum()) >= len(act):
                keep = torch.nonzero(~done).flatten()
                past.batch_select_indices(keep)
                act, tok, done = act[keep], tok[keep], done[keep]
                attn_all, next_pos, uniforms = attn_all[keep], next_pos[keep], uniforms[keep]
            feed = torch.where(done, pad, tok)
            step_pos = next_pos.unsqueeze(-1)
            out = self.model(
                input_ids=feed.unsqueeze(-1),
                attention_mask=attn_all[:, : P + t + 1],
                position_ids=step_pos.expand(3, -1, -1) if mrope else step_pos,
                use_cache=True,
                **{self.cache_kwarg: past},
            )
            past, logits = getattr(out, self.cache_kwarg), out.logits[:, -1, :]
            next_pos = next_pos + 1

        samples = []
        tokens, logps, lengths, stopped = tokens.cpu(), logps.cpu(), lengths.cpu(), stopped.cpu()
        for i, (req, j) in enumerate(rows):
            n = int(lengths[i])
            tok_ids = tokens[i, :n].tolist()
            text = self.tokenizer.decode(tok_ids, skip_special_tokens=True)
            if spec.stop:
                text = cut_at_stop(text, spec.stop)[0]
            samples.append(
                Sample(
                    prompt_id=req.prompt_id,
                    sample_index=j,
                    response=text,
                    response_token_ids=tok_ids,
                    response_logprobs=logps[i, :n].tolist(),
                    finish_reason="stop" if bool(stopped[i]) else "length",
                )
            )
        return samples


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


def stop_window(stop: tuple[str, ...]) -> int:
    """Tokens first decoded when looking for a stop string that completes at the newest token.

    Most tokens decode to at least one character; special tokens (skipped) and the bytes of a
    character split across byte-level BPE tokens do not, so twice the longest stop string's
    length plus a margin usually suffices, and `stop_in_tail` widens it where it does not."""
    return 2 * max((len(s) for s in stop), default=0) + 8


def stop_in_tail(tokenizer, row, end: int, stop: tuple[str, ...], window: int) -> bool:
    """Whether the text of ``row[:end]`` contains a stop string, decoding only its last tokens.

    Starts from the last `window` tokens and widens the window (to the whole row at most) until
    its text holds the longest stop string plus the newest token's text: special tokens decode to
    nothing and a character split across byte-level BPE tokens takes several, so a fixed count
    of tokens can hold fewer characters than a stop string that completed at the newest token
    (a run of skipped special tokens inside "\n\n", a stop string of CJK characters). The
    replacement characters of a character cut at the window's start do not count."""
    longest = max(len(s) for s in stop)
    need = longest + len(tokenizer.decode(row[end - 1 : end], skip_special_tokens=True))
    lo = max(0, end - window)
    while True:
        text = tokenizer.decode(row[lo:end], skip_special_tokens=True)
        if lo == 0 or len(text.lstrip("\ufffd")) >= need:
            return cut_at_stop(text, stop)[1]
        lo = max(0, lo - max(window, end - lo))  # double the window


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
