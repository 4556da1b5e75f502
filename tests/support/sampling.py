"""Sampling requests on the tiny tokenizer, and the logprob contract checked against the model:
every sampled token's logprob is log_softmax(logits / T) of a teacher-forced pass."""

from __future__ import annotations

import torch

from components.model.backends import PromptRequest, SamplingSpec, sample_seed


def requests(tok, n, count=6):
    out = []
    for i in range(count):
        ids = tok(f"{i}+{3 * i}=", add_special_tokens=False)["input_ids"]
        out.append(PromptRequest(f"p{i}", ids, [sample_seed(0, 0, f"p{i}", j) for j in range(n)]))
    return out


def collect(backend, reqs, spec):
    return {(s.prompt_id, s.sample_index): s for b in backend.generate(reqs, spec) for s in b}


def check_logprobs(backend, policy, temperature, top_p, top_k):
    model, tok = policy
    spec = SamplingSpec(n=3, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=10)
    reqs = requests(tok, 3)
    out = collect(backend, reqs, spec)
    worst = 0.0
    for r in reqs:
        for j in range(3):
            s = out[(r.prompt_id, j)]
            ids = torch.tensor([r.prompt_token_ids + s.response_token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(r.prompt_token_ids) - 1 : -1] / temperature
            lp = torch.log_softmax(logits, -1).gather(
                -1, torch.tensor(s.response_token_ids)[:, None]
            )
            worst = max(
                worst, (lp.squeeze(-1) - torch.tensor(s.response_logprobs)).abs().max().item()
            )
    assert worst < 1e-4


def varied_requests(tok, n: int, count: int = 7) -> list[PromptRequest]:
    """Prompts of different lengths (so rows are left-padded), n samples each."""
    out = []
    for i in range(count):
        text = f"{i}+{3 * i}=" + "1+" * (i % 4)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(PromptRequest(f"p{i}", ids, [sample_seed(0, 0, f"p{i}", j) for j in range(n)]))
    return out


def keyed_rows(samples: dict, reqs: list[PromptRequest]) -> dict:
    """Samples as the rows `assert_equal_up_to_rounding` compares (with their prompts)."""
    prompt_ids = {r.prompt_id: r.prompt_token_ids for r in reqs}
    return {k: {**s.__dict__, "prompt_token_ids": prompt_ids[k[0]]} for k, s in samples.items()}


def early_stop_spec(tok, n: int, max_new_tokens: int) -> SamplingSpec:
    """Plain sampling where a seventh of the vocabulary ends a response: rows finish at
    different steps, so the decode drops them, bucket by bucket."""
    return SamplingSpec(
        n=n,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        stop_token_ids=tuple(range(0, len(tok), 7)),
    )
