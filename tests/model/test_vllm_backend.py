"""vLLM backend: runs only where vllm is importable (a GPU node); skipped with a reason elsewhere."""

from __future__ import annotations

import importlib.util

import pytest

from components.model.backends import SamplingSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (CUDA-only wheel); the transformers backend covers CPU",
)


def test_sampling_params_follow_the_spec():
    from components.model.vllm_backend import VLLMBackend

    spec = SamplingSpec(n=4, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=16, stop=("\n",))
    backend = object.__new__(VLLMBackend)  # no engine: sampling_params reads only these
    backend.placeholder_ids = set()
    params = VLLMBackend.sampling_params(backend, spec, seed=7)
    assert params.n == 1 and params.temperature == 0.7 and params.top_p == 0.9  # a request a sample
    assert params.top_k in (-1, 0) and params.max_tokens == 16 and params.seed == 7
    assert params.logprobs == 0 and list(params.stop) == ["\n"]


@pytest.mark.gpu
def test_generates_with_logprobs_on_gpu(tiny_assets):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from components.model.backends import PromptRequest
    from components.model.vllm_backend import VLLMBackend

    backend = VLLMBackend(str(tiny_assets / "base"), gpu_memory_utilization=0.3, dtype="float32")
    ids = backend.tokenizer("1+2=", add_special_tokens=False)["input_ids"]
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    samples = [s for b in backend.generate([PromptRequest("p", ids, [1, 2, 3])], spec) for s in b]
    assert len(samples) == 3
    for s in samples:
        assert len(s.response_logprobs) == len(s.response_token_ids) > 0
        assert s.finish_reason in ("stop", "length")


@pytest.mark.gpu
def test_a_lora_adapter_serves_through_lora_requests(tiny_assets, tmp_path):
    """model.lora on vLLM: the engine keeps the base; each adapter arrives as a LoRARequest with
    a new id, and greedy tokens match base + adapter under PEFT."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from components.core.config import LoraSection
    from components.model.adapter import attach, base_digest, save_adapter
    from components.model.backends import PromptRequest
    from components.model.checkpoint import load_policy
    from components.model.vllm_backend import VLLMBackend

    base = tiny_assets / "base"
    model, tok = load_policy(base)
    peft_model = attach(model, LoraSection(rank=4, alpha=8.0))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    save_adapter(peft_model, tmp_path / "adapter", base_digest(base))
    backend = VLLMBackend(str(base), gpu_memory_utilization=0.3, dtype="bfloat16", max_lora_rank=4)
    backend.set_adapter(tmp_path / "adapter", "")
    assert backend.lora_request.lora_int_id == 1
    ids = tok("12+34=", add_special_tokens=False)["input_ids"]
    spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=6)
    (sample,) = [s for b in backend.generate([PromptRequest("p", ids, [0])], spec) for s in b]
    # vLLM's LoRA kernels take bf16/fp16 only: the reference runs in bf16 too (greedy tokens
    # of a 6-token answer; a near-tie between kernels could still split them)
    ref = peft_model.to(torch.bfloat16).eval()
    expected = ref.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    assert (
        sample.response_token_ids
        == expected[0, len(ids) :].tolist()[: len(sample.response_token_ids)]
    )
    backend.set_adapter(tmp_path / "adapter", "")
    assert backend.lora_request.lora_int_id == 2  # a new version: vLLM loads it again
    backend.close()


@pytest.mark.gpu
def test_image_prompts_keep_the_logprob_contract_on_vllm(tmp_path):
    """A tiny Qwen2-VL on vLLM's multimodal engine: its prompt expansion equals rlvr's, and the
    trainer's teacher-forced logprobs with the pixel values equal vLLM's within 1e-4 (fp32,
    temperature 1, no truncation)."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from components.core.config import GenerateSection
    from components.generate.rollouts import PromptRow, render_request
    from components.model.backends import PromptRequest
    from components.model.checkpoint import load_policy
    from components.model.engine import make_backend
    from components.train.batching import Rollouts, collate
    from components.train.update import sequence_logprobs
    from examples.vision_count.model import (
        build_image_processor,
        build_model,
        build_tokenizer,
        save_checkpoint,
    )

    tok = build_tokenizer()
    ckpt = save_checkpoint(build_model(tok, seed=5), tok, build_image_processor(), tmp_path / "b")
    gen = GenerateSection(backend="vllm", dtype="float32", vllm={"gpu_memory_utilization": 0.3})
    backend, tokenizer = make_backend(gen, ckpt, seed=0)
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 30, 30)).save(buf, "PNG")
    row = PromptRow(
        "p",
        "x",
        "1",
        [{"role": "user", "content": "<image>How many?"}],
        None,
        [buf.getvalue()],
        "d#0",
    )
    _, ids, images, vi = render_request(tokenizer, backend.vision, row)
    spec = SamplingSpec(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    samples = [
        s
        for b in backend.generate([PromptRequest("p", ids, [1, 2, 3, 4], images, vi)], spec)
        for s in b
    ]
    model, _ = load_policy(ckpt, device="cuda")
    ro = Rollouts(
        prompt_ids=["p"] * 4,
        prompt_tokens=[ids] * 4,
        response_tokens=[s.response_token_ids for s in samples],
        rollout_logprobs=[s.response_logprobs for s in samples],
        rewards=np.zeros(4),
        truncated=np.zeros(4, bool),
        vision=[vi] * 4,
    )
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, collate(ro, [0, 1, 2, 3], tok.pad_token_id), 1.0, "cuda")
    for i, s in enumerate(samples):
        got = lp[i, : len(s.response_logprobs)].cpu()
        assert float((got - torch.tensor(s.response_logprobs)).abs().max()) <= 1e-4
