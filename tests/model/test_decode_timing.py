"""What the sampler reports of its own time (`stats.phases`), its warm-up at the engine's start,
the attention kernels it allows on a GPU, and the profile a run takes with RLVR_PROFILE."""

from __future__ import annotations

import json

import pytest
import torch

from components.model.backends import SamplingSpec
from components.model.checkpoint import load_policy
from components.model.hf_backend import TransformersBackend, attention_kernels
from components.model.profiling import PROFILE_ENV, PROFILE_ITERATIONS_ENV, profiled
from tests.support.sampling import collect, requests

SPEC = SamplingSpec(n=3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def policy(tiny_assets):
    return load_policy(tiny_assets / "base")


def test_phases_cover_the_call_and_count_its_decode_steps(policy):
    model, tok = policy
    backend = TransformersBackend(model, tok, batch_size=64)  # one batch
    out = collect(backend, requests(tok, 3), SPEC)
    phases = backend.clock.take()
    assert set(phases) == {
        "prefill_s",
        "decode_s",
        "detokenize_s",
        "decode_steps",
        "decode_ms_per_step",
    }
    # the forwards after the prefill: one per token drawn after the first, up to the longest
    # response (the loop ends once every row has)
    assert phases["decode_steps"] == max(len(s.response_token_ids) for s in out.values()) - 1
    assert phases["decode_ms_per_step"] == pytest.approx(
        1000 * phases["decode_s"] / phases["decode_steps"]
    )
    assert backend.clock.take() == {}  # taken: the next call starts from zero


def test_the_warm_up_changes_no_sample(policy):
    model, tok = policy
    cold = collect(TransformersBackend(model, tok), requests(tok, 3), SPEC)
    warm_backend = TransformersBackend(model, tok)
    warm_backend.warm_up()
    assert warm_backend.clock.take() == {}  # its time is the engine's start, not a call's
    warm = collect(warm_backend, requests(tok, 3), SPEC)
    assert {k: (s.response_token_ids, s.response_logprobs) for k, s in cold.items()} == {
        k: (s.response_token_ids, s.response_logprobs) for k, s in warm.items()
    }


def test_sampling_on_a_gpu_leaves_cudnn_attention_out():
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels("cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled()  # nothing changes on a CPU


def test_a_profile_is_written_for_the_iterations_asked(tmp_path, monkeypatch, policy):
    model, tok = policy
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_ITERATIONS_ENV, "1,3")
    backend = TransformersBackend(model, tok)
    for i in range(3):
        with profiled("generate", i) as prof:
            collect(backend, requests(tok, 3, count=2), SPEC)
            prof.steps = backend.clock.take()["decode_steps"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "generate-00001.json",
        "generate-00001.txt",
    ]
    summary = json.loads((tmp_path / "generate-00001.json").read_text())
    assert summary["decode_steps"] > 0 and summary["self_cpu_ms"] > 0
    assert (
        "aten::addmm" in (tmp_path / "generate-00001.txt").read_text()
        or "aten::mm" in (tmp_path / "generate-00001.txt").read_text()
    )


def test_no_profile_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    with profiled("generate", 0) as prof:
        prof.steps = 1
    assert list(tmp_path.iterdir()) == []
