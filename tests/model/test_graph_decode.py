"""Generate: the static decode step (graph_decode.py), run eagerly on the CPU.

On a GPU the same step is captured and replayed as CUDA graphs (tests/e2e/test_gpu.py); what
the CPU checks is that the step itself computes what the growing cache computes: the same
samples up to rounding, through left padding, finished rows dropped by buckets, and a slab
reused across batches and calls.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from components.model.backends import PromptRequest, SamplingSpec
from components.model.checkpoint import load_policy
from components.model.graph_decode import (
    GraphRun,
    buckets,
    graphable,
    slab_width,
    static_step_fits,
)
from components.model.hf_backend import TransformersBackend
from tests.support.invariance import assert_equal_up_to_rounding
from tests.support.sampling import (
    check_logprobs,
    collect,
    early_stop_spec,
    keyed_rows,
    varied_requests,
)


@pytest.fixture(scope="module")
def policy(tiny_assets):
    return load_policy(tiny_assets / "base")


def test_buckets_are_the_rows_then_powers_of_two_below():
    assert buckets(128) == [128, 64, 32, 16, 8, 4, 2, 1]
    assert buckets(100) == [100, 64, 32, 16, 8, 4, 2, 1]
    assert buckets(1) == [1]


def test_static_step_samples_what_the_growing_cache_samples(policy):
    """Same rows, same seeds: equal up to rounding (the contract across layouts), with rows
    finishing early, so finished rows leave the step at bucket boundaries."""
    model, tok = policy
    spec = early_stop_spec(tok, 4, 16)
    reqs = varied_requests(tok, spec.n)
    growing = collect(TransformersBackend(model, tok, batch_size=64), reqs, spec)
    static_backend = TransformersBackend(model, tok, batch_size=64, graphs=True)
    static = collect(static_backend, reqs, spec)
    assert_equal_up_to_rounding(
        keyed_rows(growing, reqs), keyed_rows(static, reqs), model, spec, 0, 0
    )
    lengths = {len(s.response_token_ids) for s in static.values()}
    assert min(lengths) < 4 and max(lengths) > 8, lengths  # rows did finish apart
    phases = static_backend.clock.take()
    assert phases["graph_captures"] == 0  # the CPU runs the static step eagerly


def test_static_step_drops_finished_rows_by_bucket(policy, monkeypatch):
    """The step shrinks to the smallest bucket that holds the rows still sampling, and only
    then: every drop moves to a smaller bucket."""
    model, tok = policy
    seen: list[tuple[int, int]] = []
    step = GraphRun.step

    def spy(self, feed, next_pos):
        seen.append((self.live, self.bucket))
        return step(self, feed, next_pos)

    monkeypatch.setattr(GraphRun, "step", spy)
    spec = early_stop_spec(tok, 8, 24)
    collect(
        TransformersBackend(model, tok, batch_size=64, graphs=True), varied_requests(tok, 8), spec
    )
    assert seen[0] == (56, 56)
    assert all(live <= bucket for live, bucket in seen)
    drops = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if a[0] != b[0]]
    assert drops, "no row was dropped: the test's stop tokens no longer end rows early"
    for (_, before), (live, after) in drops:
        assert after < before and after == min(b for b in buckets(56) if b >= live)


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 5)])
def test_static_step_keeps_the_logprob_contract(policy, temperature, top_p, top_k):
    model, tok = policy
    check_logprobs(
        TransformersBackend(model, tok, batch_size=8, graphs=True),
        policy,
        temperature,
        top_p,
        top_k,
    )


def test_slab_is_reused_while_batches_fit_it(policy):
    """A batch that fits the slab's rows and width reuses it (and, on a GPU, its graphs); a
    batch wider than the slab, or a new model object (PEFT's wrapper), gets a new one. Samples
    are the same either way."""
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    backend = TransformersBackend(model, tok, batch_size=64, graphs=True)
    reqs = varied_requests(tok, spec.n)
    first = collect(backend, reqs, spec)
    slab = backend.graphs.slab
    assert slab.width == 64 and slab.rows == len(reqs) * spec.n
    again = collect(backend, reqs[:3], spec)  # fewer rows, same width: the same slab
    assert backend.graphs.slab is slab
    same_rows(first, again, reqs, model, spec)
    wide = [PromptRequest(f"long{i}", [5 + i] * 120, [1, 2]) for i in range(3)]
    collect(backend, wide, spec)
    assert backend.graphs.slab is not slab and backend.graphs.slab.width == 128
    wider = backend.graphs.slab
    collect(backend, reqs[:3], spec)  # narrower, and the slab at most twice its own width
    assert backend.graphs.slab is wider

    class Wrapped(torch.nn.Module):  # what PEFT's get_peft_model puts around the model
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    backend.model = Wrapped(model)
    wrapped = collect(backend, reqs[:3], spec)
    assert backend.graphs.slab is not wider
    same_rows(first, wrapped, reqs, model, spec)


def same_rows(ref: dict, got: dict, reqs, model, spec) -> None:
    """`got`'s rows as `ref` sampled them, up to rounding (another batch layout)."""
    ref = {k: v for k, v in ref.items() if k in got}
    assert_equal_up_to_rounding(keyed_rows(ref, reqs), keyed_rows(got, reqs), model, spec, 0, 0)


def test_batches_that_alternate_wide_and_tall_share_one_slab(policy):
    """A wide batch of few rows, then a narrower one of more rows, then the wide one again: the
    second slab holds both (8 x 256 is twice the larger of 4 x 256 and 8 x 128), so the third
    batch reuses it instead of rebuilding it and recapturing its graphs."""
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    backend = TransformersBackend(model, tok, batch_size=64, graphs=True)
    wide = [PromptRequest(f"w{i}", [5 + i] * 190, [1, 2]) for i in range(2)]
    tall = [PromptRequest(f"t{i}", [9 + i] * 100, [1, 2]) for i in range(4)]
    collect(backend, wide, spec)
    assert (backend.graphs.slab.rows, backend.graphs.slab.width) == (4, 256)
    collect(backend, tall, spec)
    both = backend.graphs.slab
    assert (both.rows, both.width) == (8, 256)
    collect(backend, wide, spec)
    assert backend.graphs.slab is both
    # A third shape, 16 x 64, would make 16 x 256: four times its own slab and the largest of
    # the others'. It gets its own: growths do not chain.
    short = [PromptRequest(f"s{i}", [7 + i] * 40, [1, 2]) for i in range(8)]
    collect(backend, short, spec)
    assert (backend.graphs.slab.rows, backend.graphs.slab.width) == (16, 64)


def test_a_narrow_batch_after_a_wide_one_makes_its_own_slab_once(policy):
    """A slab four times as wide as a batch needs is not grown (growing it changes nothing and
    would rebuild it, and its graphs, every time): the batch gets its own, which the next narrow
    batch reuses."""
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    backend = TransformersBackend(model, tok, graphs=True)
    collect(backend, [PromptRequest(f"w{i}", [5 + i] * 190, [1, 2]) for i in range(2)], spec)
    assert (backend.graphs.slab.rows, backend.graphs.slab.width) == (4, 256)
    narrow = [PromptRequest(f"n{i}", [7 + i] * 40, [1, 2]) for i in range(2)]
    collect(backend, narrow, spec)
    own = backend.graphs.slab
    assert (own.rows, own.width) == (4, 64)
    collect(backend, narrow, spec)
    assert backend.graphs.slab is own


def test_token_budget_counts_the_slab_and_bounds_its_growth(policy):
    """`batch_tokens` bounds the cache a batch takes: on the static step a row takes the slab's
    width (a power of two, at least 64), so the same budget makes smaller batches than on the
    growing cache, and a slab grown to hold two shapes stays within it."""
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10)
    reqs = [PromptRequest(f"p{i}", [5] * n, [i, i + 100]) for i, n in enumerate([2, 3, 8, 20])]
    growing = TransformersBackend(model, tok, batch_size=64, batch_tokens=256)
    # 8 rows x (20 + 10) = 240 <= 256
    assert [len(b) for b in growing.plan_batches(reqs, spec)] == [4]
    static = TransformersBackend(model, tok, batch_size=64, batch_tokens=256, graphs=True)
    # 4 rows x 64 = 256; a third prompt makes 6 x 64 = 384 > 256
    assert [len(b) for b in static.plan_batches(reqs, spec)] == [2, 2]
    collect(static, reqs, spec)
    assert static.graphs.slab.rows * static.graphs.slab.width <= 256

    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    wide = [PromptRequest(f"w{i}", [5 + i] * 190, [1, 2]) for i in range(2)]
    tall = [PromptRequest(f"t{i}", [9 + i] * 100, [1, 2]) for i in range(4)]
    # 1024: 4 x 256 and 8 x 128 fit it, the slab holding both (8 x 256) does not; 2048 holds it
    grows = {1024: [(4, 256), (8, 128), (4, 256)], 2048: [(4, 256), (8, 256), (8, 256)]}
    for budget, shapes in grows.items():
        backend = TransformersBackend(model, tok, batch_tokens=budget, graphs=True)
        for batch, shape in zip((wide, tall, wide), shapes, strict=True):
            collect(backend, batch, spec)
            assert (backend.graphs.slab.rows, backend.graphs.slab.width) == shape, budget


def test_slab_widths_are_powers_of_two():
    assert [slab_width(n) for n in (1, 64, 65, 128, 129, 1000)] == [64, 64, 128, 128, 256, 1024]


def test_models_the_static_step_does_not_fit_keep_the_growing_cache(policy, monkeypatch):
    """ALiBi models build their bias from a 2D mask, flash attention wants one too: they keep
    the growing cache, and the stage's phases say why graphs are off."""
    model, tok = policy

    def fake(kind: str, attention: str):
        return SimpleNamespace(
            config=SimpleNamespace(model_type=kind, _attn_implementation=attention)
        )

    assert static_step_fits(fake("llama", "sdpa")) is None
    assert "bloom" in static_step_fits(fake("bloom", "sdpa"))
    assert "flash_attention_2" in static_step_fits(fake("qwen2", "flash_attention_2"))
    monkeypatch.setattr(model.config, "model_type", "bloom")
    backend = TransformersBackend(model, tok, graphs=True)
    assert backend.graphs is None
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4)
    collect(backend, varied_requests(tok, 2, count=2), spec)
    assert "bloom" in backend.clock.take()["graphs_off"]


def test_only_plain_full_attention_caches_take_the_static_step(policy):
    """A sliding-window or other special layer keeps the growing cache (its mask differs)."""
    model, tok = policy
    ids = torch.tensor([tok("1+1=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    assert graphable(cache)

    class Windowed(DynamicLayer):
        pass

    special = Windowed()
    special.keys, special.values = cache.layers[0].keys, cache.layers[0].values
    cache.layers[0] = special
    assert not graphable(cache)


def test_a_cache_the_slab_cannot_keep_declines_the_static_step(policy, monkeypatch):
    """Seen at the first prefill: that batch and every later one take the growing cache, are
    planned for it (the token budget counts their own widths again), and the stage's phases say
    why graphs are off."""
    model, tok = policy
    monkeypatch.setattr("components.model.hf_backend.graphable", lambda cache: False)
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10)
    reqs = [PromptRequest(f"p{i}", [5] * n, [i, i + 100]) for i, n in enumerate([2, 3, 8, 20])]
    backend = TransformersBackend(model, tok, batch_tokens=256, graphs=True)
    assert [len(b) for b in backend.plan_batches(reqs, spec)] == [2, 2]  # slab widths
    got = collect(backend, reqs, spec)
    assert "cache layers" in backend.clock.take()["graphs_off"]
    assert backend.graphs.slab is None and not backend.graphs.usable()
    assert [len(b) for b in backend.plan_batches(reqs, spec)] == [4]  # their own widths
    same_rows(collect(TransformersBackend(model, tok), reqs, spec), got, reqs, model, spec)
