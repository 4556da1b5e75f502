"""Generate: continuous batching in the transformers backend (components/model/batching.py).

A finished row's room goes to the next prompt, whose prefill joins the rows decoding (right-
aligned in the growing cache). Each sample draws from its own stream, so with the policy fixed
the samples are static batching's up to the rounding of the logits (docs/contracts.md, "Batch
and shard invariance"); what changes is which rows share a step and when a prompt is yielded.
"""

from __future__ import annotations

import pytest
import torch

from components.model.backends import SamplingSpec
from components.model.batching import Continuous, Planned
from components.model.checkpoint import load_policy
from components.model.hf_backend import TransformersBackend
from components.model.kv_cache import GrowingCache
from tests.support.invariance import assert_equal_up_to_rounding
from tests.support.sampling import collect, early_stop_spec, keyed_rows, varied_requests


@pytest.fixture(scope="module")
def policy(tiny_assets):
    return load_policy(tiny_assets / "base")


def test_admission_rules_by_hand():
    # 16 rows of n = 4: four prompts at the start, then one whenever a prompt's rows are free
    # (16 // 8 = 2 < 4, so a whole prompt's 4 is the bar), never more than remain.
    c = Continuous(prompts=6, n=4, rows=16)
    assert c.take(0) == 4 and c.next == 4
    assert not c.wants(13)  # 3 free: not a prompt's worth
    assert c.wants(12) and c.take(12) == 1
    assert c.take(0) == 1 and c.next == 6 and not c.wants(0)  # all 6 joined
    # at 64 rows the bar is an eighth of them: 8 free rows, two prompts of 4
    wide = Continuous(prompts=100, n=4, rows=64)
    wide.take(0)
    assert not wide.wants(60) and wide.wants(56) and wide.take(56) == 2
    # static batching: the next batch only once the last has finished
    p = Planned([3, 2])
    assert p.take(0) == 3 and p.take(5) == 0 and not p.wants(0)
    assert p.take(0) == 2 and p.next == 5 and p.take(0) == 0


def test_continuous_samples_equal_static_batching(policy, monkeypatch):
    """Same policy, same seeds: every sample equals static batching's up to rounding, though
    prompts joined rows mid-decode (admit ran), and each prompt's n samples come together."""
    model, tok = policy
    spec = early_stop_spec(tok, 4, 20)
    reqs = varied_requests(tok, spec.n, count=9)
    static = collect(TransformersBackend(model, tok, batch_size=64), reqs, spec)

    joins: list[int] = []
    admit = GrowingCache.admit

    def spy(self, past, attn, steps):
        joins.append(attn.shape[0])
        return admit(self, past, attn, steps)

    monkeypatch.setattr(GrowingCache, "admit", spy)
    backend = TransformersBackend(model, tok, batch_size=8, continuous=True)
    yielded = list(backend.generate(reqs, spec))
    assert joins, "no prompt joined mid-decode: the stop tokens no longer end rows early"
    for batch in yielded:  # whole prompts only
        ids = [s.prompt_id for s in batch]
        assert all(ids.count(i) == spec.n for i in set(ids))
    got = {(s.prompt_id, s.sample_index): s for b in yielded for s in b}
    assert_equal_up_to_rounding(keyed_rows(static, reqs), keyed_rows(got, reqs), model, spec, 0, 0)
    assert backend.clock.take()["decode_steps"] > 0


def test_continuous_with_stop_strings_and_greedy(policy):
    """Greedy rows (no draw can differ) with a stop string, through joins: the very same
    tokens and texts as static batching."""
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=12, stop=("1",))
    reqs = varied_requests(tok, spec.n)
    static = collect(TransformersBackend(model, tok, batch_size=64), reqs, spec)
    cont = collect(TransformersBackend(model, tok, batch_size=4, continuous=True), reqs, spec)
    assert {k: (s.response, s.response_token_ids, s.finish_reason) for k, s in cont.items()} == {
        k: (s.response, s.response_token_ids, s.finish_reason) for k, s in static.items()
    }


def test_admit_right_aligns_rows_and_trims_unused_columns(policy):
    """The cache after a join: old rows keep their attended columns, the new rows sit
    right-aligned after a left padding, columns no row attends to are gone, and a step after
    the join computes what each row computes alone."""
    model, tok = policy
    prompt_a = tok("1+2+3+4=", add_special_tokens=False)["input_ids"]
    prompt_b = tok("5=", add_special_tokens=False)["input_ids"]

    def prefill(ids):
        x = torch.tensor([ids])
        out = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=True)
        return out.past_key_values, out.logits[:, -1], torch.ones_like(x)

    from components.model.hf_backend import cache_kwarg

    past, _, attn = prefill(prompt_a)
    cache = GrowingCache(model, cache_kwarg(model), past, attn, 8, mrope=False)
    feed = torch.tensor([5])
    cache.step(feed, torch.tensor([len(prompt_a)]))
    past_b, _, attn_b = prefill(prompt_b)
    cache.admit(past_b, attn_b, 8)
    width = len(prompt_a) + 1
    assert cache.length == width and cache.attn_all.shape == (2, width + 8)
    assert cache.attn_all[1, : width - len(prompt_b)].sum() == 0
    assert cache.attn_all[1, width - len(prompt_b) :].all() and cache.attn_all[0].all()
    logits = cache.step(torch.tensor([7, 7]), torch.tensor([width, len(prompt_b)]))
    for row, ids in ((0, [*prompt_a, 5, 7]), (1, [*prompt_b, 7])):
        alone = model(input_ids=torch.tensor([ids])).logits[0, -1]
        # the same positions and keys over extra zero-weight columns: float32 rounding only
        torch.testing.assert_close(logits[row], alone, atol=1e-4, rtol=1e-4)
    # Row a leaves: the columns before b's first are attended by no row, so the next join
    # trims them (b's prompt and two steps are its whole span).
    cache.select(torch.tensor([1]))
    past_c, _, attn_c = prefill(prompt_b)
    cache.admit(past_c, attn_c, 8)
    span = len(prompt_b) + 1
    assert cache.length == span and cache.attn_all.shape == (2, span + 8)
    assert cache.attn_all[0, :span].all()  # b: its prompt and its step, nothing before
    assert cache.attn_all[1, :span].tolist() == [0, 1, 1]  # c right-aligned after a pad
    logits = cache.step(torch.tensor([3, 4]), torch.tensor([len(prompt_b) + 1, len(prompt_b)]))
    for row, ids in ((0, [*prompt_b, 7, 3]), (1, [*prompt_b, 4])):
        alone = model(input_ids=torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(logits[row], alone, atol=1e-4, rtol=1e-4)


def test_the_config_key_reaches_the_backend(tiny_assets):
    from components.core.config import GenerateSection
    from components.model.engine import make_backend

    on, _ = make_backend(
        GenerateSection(transformers={"continuous_batching": True}), tiny_assets / "base", 0
    )
    off, _ = make_backend(GenerateSection(), tiny_assets / "base", 0)
    assert on.continuous and not off.continuous
