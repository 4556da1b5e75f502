"""Token sampling: the pure functions from a decode step's logits to its drawn tokens.

Top-k / top-p filtering, the float64 sampling distribution, the inverse-CDF draw from a
per-sample uniform (sample `s` at step `t` always consumes `u[s, t]` from its own generator, so a
draw does not depend on the batch), each token's log-probability (backends.LOGPROB_DEFINITION),
and `draw_margin`, how close a draw is to changing. They are apart from the decode loop
(hf_backend.py) because they are math on tensors only: tests and the invariance benchmark call
them on their own, without a model.
"""

from __future__ import annotations

import torch

from components.model.backends import SamplingSpec


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

    On a CPU, rows go through `sample_rows` in even chunks of at most 16 MB of float64 (42 rows
    at a 49k vocabulary): a larger float64 temporary (a [128, 49152] one is 50 MB) is mapped
    fresh from the kernel and faulted in page by page at every step, while a small one is reused
    from the allocator's cache. Every operation is per row, so the result is the same as in one
    piece, bit for bit (tested at a vocabulary over PyTorch's parallel grain with two threads).
    On a GPU, whose allocator keeps its blocks, the rows go in one piece.
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
    top-p): log p = logit/T - max - log(total).
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
        # On a CPU the check is cheaper than the argmax pass it saves; on a GPU `any()` would
        # wait for the queue to drain at every step, so the fallback is computed always.
        if logits.device.type != "cpu" or bad.any():
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
