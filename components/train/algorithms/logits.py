"""Log-probabilities and entropy from logits, chunked over rows.

Part of the algorithm library: read components/train/algorithms/__init__.py first (the
contract every function keeps, the shapes)."""

from __future__ import annotations

import torch
from torch import Tensor

# ----------------------------------------------------------------------------------------------
# Logits -> per-token quantities
# ----------------------------------------------------------------------------------------------


def _row_chunks(x: Tensor, chunk_size: int | None) -> list[Tensor]:
    if chunk_size is None:
        return [x]
    if not chunk_size >= 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    return list(torch.split(x, chunk_size, dim=0))


def _compute_dtype(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Entropy of the softmax distribution at every position, numerically stable.

    Formula: ``H = logsumexp(z) - sum_v softmax(z)_v * z_v``.
    Rows (B*L positions) are processed ``chunk_size`` at a time to bound the temporary memory;
    fp16/bf16 logits are upcast to float32 per chunk (the result is float32 then).
    Paper: none (entropy metric / bonus; the forking-token paper arXiv:2506.01939 ranks by it).
    verl: ``verl.utils.torch_functional.entropy_from_logits``. Gradients flow (entropy bonus).
    Shapes: logits [B, L, V] -> [B, L].
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in _row_chunks(flat, chunk_size):
        z = _compute_dtype(chunk)
        lse = torch.logsumexp(z, dim=-1)
        probs = torch.exp(z - lse.unsqueeze(-1))
        # -inf logits (masked vocabulary) have p = 0 and contribute 0, not 0 * -inf = NaN.
        z_seen = torch.where(probs > 0, z, torch.zeros((), dtype=z.dtype, device=z.device))
        parts.append(lse - (probs * z_seen).sum(dim=-1))
    return torch.cat(parts).reshape(lead)


def logprobs_from_logits(
    logits: Tensor, tokens: Tensor, *, chunk_size: int | None = 1024
) -> Tensor:
    """Log-probability of ``tokens`` under ``softmax(logits)``, without a full log_softmax.

    Formula: ``log p(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}`` (gather, then subtract).
    Only the logsumexp per row is kept, never a [B, L, V] log_softmax; rows are chunked by
    ``chunk_size``; fp16/bf16 logits are upcast to float32 per chunk (result float32).
    ``tokens`` must be valid vocabulary ids everywhere (padding included). Paper: none.
    verl: ``verl.utils.torch_functional.logprobs_from_logits`` (``_v2`` variant).
    Shapes: logits [B, L, V], tokens [B, L] int64 -> [B, L].
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1, 1)
    parts = []
    for chunk, tok in zip(
        _row_chunks(flat, chunk_size), _row_chunks(flat_tokens, chunk_size), strict=True
    ):
        z = _compute_dtype(chunk)
        picked = torch.gather(z, -1, tok).squeeze(-1)
        parts.append(picked - torch.logsumexp(z, dim=-1))
    return torch.cat(parts).reshape(lead)


def _head_chunk(
    h: Tensor, weight: Tensor, tok: Tensor, temperature: float, with_entropy: bool, ent_grad: bool
) -> tuple[Tensor, Tensor]:
    """One chunk of `logprobs_from_hidden`: logits, then the picked token's log-probability and
    (optionally) the entropy.  # h [C, H], weight [V, H], tok [C] -> ([C], [C])"""
    z = torch.nn.functional.linear(h, weight).float()
    if temperature > 0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    lp = torch.gather(z, -1, tok.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lp, lp.new_zeros(())
    zz, ll = (z, lse) if ent_grad else (z.detach(), lse.detach())
    probs = torch.exp(zz - ll.unsqueeze(-1))
    z_seen = torch.where(probs > 0, zz, torch.zeros((), dtype=zz.dtype, device=zz.device))
    return lp, ll - (probs * z_seen).sum(dim=-1)


def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """Log-probabilities (and entropy) of ``tokens`` from the final hidden states and the output
    projection, a chunk of positions at a time, never holding all positions' logits.

    Formula: ``z = h W^T / T``; ``log p(y) = z_y - logsumexp(z)``; ``H = logsumexp(z) - sum_v
    softmax(z)_v z_v`` (as `logprobs_from_logits` / `entropy_from_logits` on ``z``). Each chunk's
    logits are recomputed in the backward pass (activation checkpointing) instead of kept, so
    the memory for the vocabulary is ``chunk_tokens x V`` floats a few times, not ``B x L x V``
    several times: at a 49k vocabulary a 4k-token micro-batch otherwise keeps about 0.8 GB per
    [tokens, V] float32 copy (the logits, their temperature-scaled copy, the softmax, and their
    gradients). The same idea as Liger's fused linear cross-entropy, without a fused kernel.
    The entropy carries gradients only with ``entropy_grad``. Paper: none.
    Shapes: hidden [B, L, H], weight [V, H], tokens [B, L] int64 -> ([B, L], [B, L] | None).
    """
    if not chunk_tokens >= 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens!r}")
    lead = hidden.shape[:-1]
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_tok = tokens.reshape(-1)
    lps, ents = [], []
    checkpoint = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for s in range(0, flat.shape[0], chunk_tokens):
        args = (
            flat[s : s + chunk_tokens],
            weight,
            flat_tok[s : s + chunk_tokens],
            temperature,
            with_entropy,
            entropy_grad,
        )
        if checkpoint:
            lp, ent = torch.utils.checkpoint.checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    lp = torch.cat(lps).reshape(lead) if lps else flat.new_zeros(lead, dtype=torch.float32)
    if not with_entropy:
        return lp, None
    ent = torch.cat(ents).reshape(lead) if ents else flat.new_zeros(lead, dtype=torch.float32)
    return lp, ent
