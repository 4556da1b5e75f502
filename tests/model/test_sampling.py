"""Generate: the transformers backend's logprobs, seeding and stop rules, and the stage."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from components.core.commit import read_manifest
from components.core.store import LocalStore
from components.generate.prompt_sampler import select_indices
from components.model.backends import PromptRequest, SamplingSpec, cut_at_stop
from components.model.checkpoint import load_policy
from components.model.hf_backend import TransformersBackend
from components.model.token_sampling import filter_logits, sample_inverse_cdf
from tests.support.invariance import assert_equal_up_to_rounding
from tests.support.sampling import check_logprobs, collect, requests


@pytest.fixture(scope="module")
def policy(tiny_assets):
    return load_policy(tiny_assets / "base")


@pytest.fixture(params=["transformers", "vllm"])
def make_backend(request, policy, tiny_assets):
    """The shared backend contract: every test taking this runs against both backends."""
    model, tok = policy
    if request.param == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            pytest.skip("vllm backend needs the vllm package and a CUDA GPU (CPU CI: skipped)")
        from components.model.vllm_backend import VLLMBackend

        backend = VLLMBackend(
            str(tiny_assets / "base"), gpu_memory_utilization=0.2, dtype="float32"
        )
        return lambda batch_size=64: backend
    return lambda batch_size=64: TransformersBackend(model, tok, batch_size=batch_size)


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0)])
def test_contract_logprobs_match_teacher_forcing(make_backend, policy, temperature, top_p, top_k):
    """Both backends: response_logprobs = log_softmax(logits/T) of each sampled token."""
    check_logprobs(make_backend(8), policy, temperature, top_p, top_k)


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.7, 0.9, 0), (1.3, 1.0, 5)])
def test_logprobs_are_taken_before_truncation(policy, temperature, top_p, top_k):
    """Transformers backend: the definition holds with top-p/top-k (taken before truncation)."""
    model, tok = policy
    check_logprobs(TransformersBackend(model, tok, batch_size=8), policy, temperature, top_p, top_k)


def test_samples_do_not_depend_on_batching(policy):
    model, tok = policy
    spec = SamplingSpec(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    reqs = requests(tok, 4)
    big = collect(TransformersBackend(model, tok, batch_size=64), reqs, spec)
    small = collect(TransformersBackend(model, tok, batch_size=4), reqs[2:], spec)
    prompt_ids = {r.prompt_id: r.prompt_token_ids for r in reqs}

    def rows(samples):
        return {k: {**s.__dict__, "prompt_token_ids": prompt_ids[k[0]]} for k, s in samples.items()}

    ref = {k: v for k, v in rows(big).items() if k in small}
    assert_equal_up_to_rounding(ref, rows(small), model, spec, 0, 0)
    # Different sample seeds give different samples.
    assert len({tuple(s.response_token_ids) for s in big.values()}) > len(reqs)


def test_contract_greedy_is_argmax(make_backend, policy):
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=5)
    r = requests(tok, 2, count=1)[0]
    out = collect(make_backend(), [r], spec)
    assert out[("p0", 0)].response_token_ids == out[("p0", 1)].response_token_ids
    ids = list(r.prompt_token_ids)
    for t in out[("p0", 0)].response_token_ids:
        with torch.no_grad():
            assert int(model(torch.tensor([ids])).logits[0, -1].argmax()) == t
        ids.append(t)


def test_contract_stop_strings_and_eos(make_backend, policy):
    model, tok = policy
    reqs = requests(tok, 4)
    spec = SamplingSpec(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12)
    backend = make_backend()
    free = collect(backend, reqs, spec)
    # Pick a character that appears mid-response in some sample and stop on it.
    s0 = next(s for s in free.values() if len(s.response) >= 3)
    stop = s0.response[1]
    out = collect(backend, reqs, SamplingSpec(**{**spec.__dict__, "stop": (stop,)}))
    for key, s in out.items():
        if stop in free[key].response:
            assert s.finish_reason == "stop" and s.response.endswith(stop)
            assert s.response == free[key].response[: free[key].response.index(stop) + 1]
        assert len(s.response_token_ids) == len(s.response_logprobs)
    for s in free.values():
        if s.finish_reason == "stop":  # ended at EOS: kept in token ids, not in text
            assert s.response_token_ids[-1] == tok.eos_token_id
        else:
            assert len(s.response_token_ids) == spec.max_new_tokens


def test_filter_and_sampling_helpers():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert torch.isinf(filter_logits(logits, 2, 1.0)[0, 2:]).all()
    p = torch.softmax(logits, -1)[0]
    # top_p=0.8: 0.644 < 0.8 so the second token (cumulative 0.881) is kept, the rest dropped.
    kept = ~torch.isinf(filter_logits(logits, 0, 0.8)[0])
    assert kept.tolist() == [True, True, False, False] and p[0] < 0.8 < p[0] + p[1]
    probs = torch.tensor([[0.25, 0.25, 0.5, 0.0]] * 3)
    assert sample_inverse_cdf(probs, torch.tensor([0.1, 0.3, 0.99])).tolist() == [0, 1, 2]
    assert cut_at_stop("abc</a>def", ("</a>", "d")) == ("abc</a>", True)


def test_sampling_spec_rejects_bad_options():
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingSpec(n=0, temperature=1, top_p=1, top_k=0, max_new_tokens=1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingSpec(n=1, temperature=-1, top_p=1, top_k=0, max_new_tokens=1)


def test_select_indices_walks_epochs_without_repeats():
    # 10 rows, 4 per iteration: 2 iterations per epoch, 8 distinct prompts each epoch.
    for epoch in range(3):
        a, b = (select_indices(10, 4, seed=3, iteration=2 * epoch + k) for k in (0, 1))
        assert len(a) == len(b) == 4 and not set(a) & set(b)
    assert select_indices(10, 4, 3, 0) != select_indices(10, 4, 3, 2)  # reshuffled per epoch
    assert select_indices(10, 4, 3, 1) == select_indices(10, 4, 3, 1)  # deterministic
    assert sorted(select_indices(8, 4, 0, 0) + select_indices(8, 4, 0, 1)) == list(range(8))
    with pytest.raises(ValueError, match="prompts_per_iteration"):
        select_indices(3, 4, 0, 0)


def test_stage_writes_rollouts_contract(cfg):
    from components.core.layout import RunLayout
    from components.generate.stage import run
    from components.model import run_setup

    run_setup.run(cfg)
    result = run(cfg, 0)
    stats = result["stats"]
    assert stats["samples"] == 6 * 4 and stats["prompts"] == 6 and stats["skipped_prompts"] == 0
    assert (
        stats["backend"] == "transformers" and "before top-k/top-p" in stats["logprob_definition"]
    )
    uri = RunLayout.of(cfg).rollouts(0)
    table = pq.read_table(f"{uri}/part-00000.parquet")
    assert table.schema.metadata[b"rlvr.schema"] == b"rollouts"
    rows = table.to_pylist()
    assert {(r["prompt_id"], r["sample_index"]) for r in rows} == {
        (p, j) for p in {r["prompt_id"] for r in rows} for j in range(4)
    }
    for r in rows:
        assert len(r["response_token_ids"]) == len(r["response_logprobs"])
        assert r["checkpoint"].endswith("checkpoints/00000") and r["finish_reason"] in (
            "stop",
            "length",
        )
    assert run(cfg, 0)["skipped"] is True  # idempotent
    assert read_manifest(LocalStore(), uri)["stats"]["iteration"] == 0


def test_long_prompts_are_skipped_and_counted(cfg, caplog):
    from components.generate.stage import run
    from components.model import run_setup

    cfg.generate.max_prompt_tokens = 3
    run_setup.run(cfg)
    with pytest.raises(ValueError, match="all 6 prompts are longer than"):
        run(cfg, 0)  # every prompt is longer than 3 tokens: nothing to generate
    cfg.generate.max_prompt_tokens = 5
    stats = run(cfg, 0, force=True)["stats"]
    assert stats["skipped_prompts"] + stats["prompts"] == 6
    assert stats["skipped_prompts"] > 0 and "skipping prompt train-" in caplog.text


def test_missing_checkpoint_fails_before_work(cfg):
    from components.core.commit import NotCommittedError
    from components.generate.stage import run

    with pytest.raises(NotCommittedError, match="checkpoints/00000 is not committed"):
        run(cfg, 0)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_shards_union_equals_unsharded_up_to_rounding(cfg, threads):
    """S shards together hold exactly the unsharded rows, with samples equal up to float
    rounding of another batch layout (and another thread count), and the same rewards."""
    from components.core.commit import NotCommittedError, committed_files
    from components.core.layout import RunLayout
    from components.core.schemas import read_records
    from components.generate.rollouts import spec_from
    from components.generate.stage import run
    from components.model import run_setup
    from components.verify.stage import run as verify

    def rows(c, what):
        store, layout = LocalStore(), RunLayout.of(c)
        uri = layout.rollouts(0) if what == "rollouts" else layout.scored(0)
        t = read_records(store, committed_files(store, uri, ".parquet"), what)
        return {(r["prompt_id"], r["sample_index"]): r for r in t.to_pylist()}

    cfg.data.prompts_per_iteration = 12
    run_setup.run(cfg)
    run(cfg, 0)
    verify(cfg, 0)
    whole, whole_scored = rows(cfg, "rollouts"), rows(cfg, "scored")
    sharded = cfg.model_copy(deep=True)
    sharded.run.run_id = "sharded"
    sharded.generate.transformers.batch_size = (
        8  # another batch layout as well as another shard layout
    )
    run_setup.run(sharded)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for s in range(2):  # the reader refuses an incomplete set of shards
            run(sharded, 0, shard=s, num_shards=3)
        with pytest.raises(NotCommittedError, match=r"shards \[2\] of 3 are not committed"):
            verify(sharded, 0)
        stats = run(sharded, 0, shard=2, num_shards=3)["stats"]
    finally:
        torch.set_num_threads(before)
    assert stats["shard"] == 2 and stats["num_shards"] == 3
    for s in range(2):
        verify(sharded, 0, shard=s, num_shards=2)
    got, got_scored = rows(sharded, "rollouts"), rows(sharded, "scored")
    model, _ = load_policy(RunLayout.of(cfg).checkpoint(0))
    spec = spec_from(cfg.generate, cfg.run.seed)
    diverged = assert_equal_up_to_rounding(whole, got, model, spec, cfg.run.seed, 0)
    for key, r in whole_scored.items():  # the same tokens score the same
        if key not in diverged:
            assert (got_scored[key]["reward"], got_scored[key]["response"]) == (
                r["reward"],
                r["response"],
            )
    with pytest.raises(ValueError, match="0 <= shard < num_shards"):
        run(sharded, 0, shard=3, num_shards=3)


def test_draw_margin_finds_near_ties():
    """draw_margin is the distance to the nearest decision boundary of each sampling rule."""
    from components.model.token_sampling import draw_margin, sampling_probs

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1)
    cdf = sampling_probs(logits[None], spec)[0].cumsum(-1)
    # A uniform right on the first boundary is a tie; one in the middle of a bin is far from it.
    assert draw_margin(logits, float(cdf[0]), spec) < 1e-12
    mid = float(cdf[0] + cdf[1]) / 2
    assert draw_margin(logits, mid, spec) == pytest.approx(float(cdf[1] - cdf[0]) / 2, rel=1e-9)
    # top-k: the k-th and (k+1)-th logits 1e-7 apart (relative to the largest logit) is a tie.
    tied = torch.tensor([2.0, 1.0, 1.0 - 2e-7, -1.0], dtype=torch.float64)
    k2 = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=2, max_new_tokens=1)
    assert draw_margin(tied, mid, k2) == pytest.approx(1e-7, rel=1e-3)
    # top-p: a nucleus whose mass before a token sits exactly at top_p is a tie.
    p = torch.softmax(logits.double(), -1)
    at = SamplingSpec(n=1, temperature=1.0, top_p=float(p[0]), top_k=0, max_new_tokens=1)
    assert draw_margin(logits, mid, at) < 1e-9
    # greedy: the gap between the two largest logits, relative.
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=1)
    assert draw_margin(logits, 0.5, greedy) == pytest.approx(0.5)


def test_stop_token_ids_end_responses_like_eos(policy):
    model, tok = policy
    reqs = requests(tok, 4)
    spec = SamplingSpec(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12)
    free = collect(TransformersBackend(model, tok), reqs, spec)
    s0 = next(s for s in free.values() if len(s.response_token_ids) >= 4)
    stop_id = s0.response_token_ids[2]
    stopped = SamplingSpec(**{**spec.__dict__, "stop_token_ids": (stop_id,)})
    got = collect(TransformersBackend(model, tok), reqs, stopped)[(s0.prompt_id, s0.sample_index)]
    first = s0.response_token_ids.index(stop_id)
    assert got.response_token_ids == s0.response_token_ids[: first + 1]
    assert got.finish_reason == "stop"


def test_batches_by_token_budget(policy):
    model, tok = policy
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10)
    lengths = [2, 3, 8, 20]
    reqs = [PromptRequest(f"p{i}", [5] * n, [i, i + 100]) for i, n in enumerate(lengths)]
    backend = TransformersBackend(model, tok, batch_size=64, batch_tokens=60)
    plan = backend.plan_batches(reqs, spec)
    # 2 prompts x 2 samples x (3 + 10) = 52 <= 60; adding the 8-token one: 6 x 18 = 108 > 60
    assert [[r.prompt_id for r in b] for b in plan] == [["p0", "p1"], ["p2"], ["p3"]]
    rowwise = TransformersBackend(model, tok, batch_size=4).plan_batches(reqs, spec)
    assert [len(b) for b in rowwise] == [2, 2]
    # Samples do not depend on the plan.
    a = collect(backend, reqs, spec)
    b = collect(TransformersBackend(model, tok, batch_size=64), reqs, spec)
    assert {k: v.response_token_ids for k, v in a.items()} == {
        k: v.response_token_ids for k, v in b.items()
    }


def test_tokenizer_without_pad_token_fails_before_work(policy):
    import copy

    model, tok = policy
    bare = copy.deepcopy(tok)
    bare.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        TransformersBackend(model, bare)


def test_load_weights_in_place_equals_a_fresh_load(tiny_assets, tmp_path):
    """A warm engine taking another checkpoint's weights (streamed into its parameters, the tied
    lm_head included) computes exactly what a fresh load computes; a checkpoint of another shape
    is refused by name."""
    from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

    tok = build_tokenizer()
    other = build_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=7)
    save_checkpoint(other, tok, tmp_path / "other")
    model, tok = load_policy(tiny_assets / "base")
    backend = TransformersBackend(model, tok)
    backend.load_weights(tmp_path / "other")
    fresh, _ = load_policy(tmp_path / "other")
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(backend.model(ids).logits, fresh(ids).logits)
    assert (
        backend.model.lm_head.weight.data_ptr()
        == backend.model.model.embed_tokens.weight.data_ptr()
    )
    wider = build_model(tok, hidden_size=48, num_layers=2, num_heads=2, seed=0)
    save_checkpoint(wider, tok, tmp_path / "wider")
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight has shape \(\d+, 48\)"):
        backend.load_weights(tmp_path / "wider")


def test_stop_in_tail_agrees_with_a_full_decode():
    """The generate loop looks for stop strings in the text of its last tokens only; it must stop
    at the same step as a decode of the whole response would: across a run of special tokens
    (skipped, no characters: they held a window of 2 * len(stop) + 8 tokens without the start
    of "\\n\\n"), and across characters split over byte-level tokens."""
    from transformers import AutoTokenizer

    from components.model.backends import cut_at_stop
    from components.model.batching import stop_in_tail, stop_window
    from tests.support.models import smollm2_gguf

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    cases = [
        (enc("x = 5\n") + [start] * 12 + enc("\nmore"), ("\n\n",)),
        (enc("ok") + [start] * 40 + enc(" then Answer: 7"), ("Answer:",)),
        (enc("前文答案是答案是答案是答案是！后文"), ("答案是答案是答案是答案是！",)),
        (enc("🙂🙂🙂🙂🙂🙂🙂🙂🙂 done"), ("🙂🙂🙂🙂🙂🙂🙂🙂🙂",)),
    ]
    for ids, stop in cases:
        row = torch.tensor(ids)
        full = next(
            (
                e
                for e in range(1, len(ids) + 1)
                if cut_at_stop(tok.decode(ids[:e], skip_special_tokens=True), stop)[1]
            ),
            None,
        )
        tail = next(
            (
                e
                for e in range(1, len(ids) + 1)
                if stop_in_tail(tok, row, e, stop, stop_window(stop))
            ),
            None,
        )
        assert tail == full, (stop, tok.decode(ids), tail, full)


@pytest.mark.parametrize(
    "temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.0, 1.0, 0)]
)
def test_sample_step_is_the_inverse_cdf_draw_and_its_logprob(temperature, top_p, top_k):
    """sample_step draws what sample_inverse_cdf(sampling_probs) draws (greedy: the argmax), and
    its logprob is log_softmax(logits/T) of that token before truncation, computed here in
    float64. Tolerance: the step's float64 result rounded to float32 (1 ulp at |logp| < 16)."""
    from components.model.token_sampling import sample_step, sampling_probs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 3000, generator=g) * 4
    u = torch.rand(64, generator=g, dtype=torch.float64)
    spec = SamplingSpec(n=1, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=1)
    tok, lp = sample_step(logits, u, spec)
    if temperature == 0:
        want = logits.argmax(-1)
        ref = torch.log_softmax(logits.double(), -1)
    else:
        want = sample_inverse_cdf(sampling_probs(logits, spec), u)
        ref = torch.log_softmax(logits.double() / temperature, -1)
    assert torch.equal(tok, want)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref.gather(-1, want[:, None])[:, 0].float(), rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    "temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.0, 1.0, 0)]
)
@pytest.mark.parametrize(
    "rows, vocab, per_chunk, sizes",
    [(70, 500, 16, [14] * 5), (9, 40_000, 4, [3, 3, 3]), (5, 40_000, 4, [3, 2])],
)
@pytest.mark.parametrize("offset", [-30.0, -45.0])
def test_sample_step_in_row_chunks_equals_one_piece(
    monkeypatch, temperature, top_p, top_k, rows, vocab, per_chunk, sizes, offset
):
    """sample_step splits the rows into even chunks (to keep its float64 temporaries small);
    every operation is per row, so the tokens and logprobs equal the one-piece result bit for
    bit. Run on two threads with a vocabulary over PyTorch's parallel grain (32,768), where a
    one-row chunk would reduce its row in another order (its logprob's last bits would move:
    chunks of 4 and 1 fail this test at top-p with the tail at -30, at top-k and greedy at -45),
    with near-certain rows (logprobs near 0, where those bits show)."""
    from components.model import token_sampling

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(rows, vocab, generator=g) * 0.5 + offset
    logits[:, 0] = 0.0  # near-certain: the tail's sum sits in the total's last bits
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    spec = SamplingSpec(n=1, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        whole = token_sampling.sample_rows(logits, u, spec)
        calls = []
        real = token_sampling.sample_rows
        monkeypatch.setattr(token_sampling, "SAMPLER_CHUNK_ELEMENTS", per_chunk * vocab)
        monkeypatch.setattr(
            token_sampling, "sample_rows", lambda x, *a: calls.append(len(x)) or real(x, *a)
        )
        tok, lp = token_sampling.sample_step(logits, u, spec)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(tok, whole[0]) and torch.equal(lp, whole[1])
    assert calls == sizes


def test_sample_step_never_draws_a_zero_probability_token():
    """Rows whose tail underflows to probability 0 (logits 1e4 apart) and a uniform at the top
    of the CDF still draw a token of positive probability."""
    from components.model.token_sampling import sample_step

    logits = torch.full((2, 6), -1e4)
    logits[:, :2] = torch.tensor([0.0, 0.5])
    spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1)
    tok, lp = sample_step(logits, torch.tensor([1 - 1e-17, 0.0], dtype=torch.float64), spec)
    assert tok.tolist() == [1, 0] and torch.isfinite(lp).all()


def test_reserved_kv_cache_decodes_like_the_dynamic_one(policy):
    """kv_cache.reserve: the same logits as transformers' concatenating cache over prefill,
    decode steps past the reservation (where it grows), a dropped row and a crop. Tolerance
    1e-5: attention reads a strided view of the buffer instead of a contiguous tensor, and
    the kernels may sum in another order."""
    from transformers import DynamicCache

    from components.model.hf_backend import cache_kwarg
    from components.model.kv_cache import ReservedLayer, reserve

    model, _ = policy
    kw = cache_kwarg(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (4, 7), generator=g)
    steps = torch.randint(3, 60, (4, 6), generator=g)

    def run(reserved: bool) -> list[torch.Tensor]:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, use_cache=True, **{kw: cache})
            cache = getattr(out, kw)
            if reserved:
                assert reserve(cache, 7 + 3)  # room for 3 steps; the 4th grows
                assert all(isinstance(layer, ReservedLayer) for layer in cache.layers)
            seen = [out.logits[:, -1]]
            rows = torch.arange(4)
            for t in range(6):
                if t == 4:  # drop row 1, as the backend drops finished rows
                    rows = torch.tensor([0, 2, 3])
                    cache.batch_select_indices(rows)
                out = model(input_ids=steps[rows, t : t + 1], use_cache=True, **{kw: cache})
                cache = getattr(out, kw)
                seen.append(out.logits[:, -1])
            assert cache.get_seq_length() == 7 + 6
            cache.crop(-2)
            assert cache.get_seq_length() == 7 + 4
            out = model(input_ids=steps[rows, 5:6], use_cache=True, **{kw: cache})
            seen.append(out.logits[:, -1])
        return seen

    for a, b in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_shared_prefill_equals_prefilling_every_row(policy):
    """The prompt's forward, once per prompt and repeated to its n rows, gives each row the
    cache and logits of prefilling it alone (tolerance 1e-5: the batch holds n times fewer rows,
    and matmul kernels may block the sums differently by batch size)."""
    model, tok = policy
    backend = TransformersBackend(model, tok)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, 60, (3, 5), generator=g).repeat_interleave(4, dim=0)
    attn = torch.ones_like(prompts)
    attn[:4, :2] = 0  # the first prompt is left-padded
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        shared, logits_shared = backend._prefill(prompts, attn, pos, 4)
        alone, logits_alone = backend._prefill(prompts, attn, pos, 1)
    assert logits_shared.shape == logits_alone.shape == (12, model.config.vocab_size)
    torch.testing.assert_close(logits_shared, logits_alone, rtol=0, atol=1e-5)
    for a, b in zip(shared.layers, alone.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-5)


def test_only_caches_of_keys_and_values_have_their_rows_moved(policy):
    """A shared prefill repeats rows and compaction drops them through transformers' cache
    methods; a layer with conv or recurrent states (linear attention) would keep its old rows,
    so such a cache is neither repeated nor compacted."""
    from transformers import DynamicCache, cache_utils

    from components.model.kv_cache import reserve, rows_movable

    model, _ = policy
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    assert rows_movable(cache)
    assert reserve(cache, 8) and rows_movable(cache)
    assert not rows_movable(DynamicCache())  # no layers yet
    if hasattr(cache_utils, "LinearAttentionLayer"):  # transformers 5
        cache.layers.append(cache_utils.LinearAttentionLayer())
        assert not rows_movable(cache)
