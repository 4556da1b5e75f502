"""What the vLLM backend sends, checked without vLLM: each image's run of pad tokens goes back to
one placeholder, which vLLM expands itself (sending them expanded made vLLM expand every pad
again); each sample is a request of its own, seeded with the sample's own seed."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from components.model.backends import PromptRequest, SamplingSpec, sample_seed
from components.model.vllm_backend import VLLMBackend, unexpanded

PAD, START, END = (
    151655,
    151652,
    151653,
)  # Qwen2-VL's <|image_pad|>, <|vision_start|>, <|vision_end|>


def test_each_images_pads_go_back_to_one_placeholder():
    ids = [1, START, PAD, PAD, PAD, END, 2, START, PAD, PAD, END, 3]
    assert unexpanded(ids, {PAD}) == [1, START, PAD, END, 2, START, PAD, END, 3]


def test_text_and_single_placeholders_are_left_as_they_are():
    assert unexpanded([5, 5, 5, 7], {PAD}) == [5, 5, 5, 7]  # repeats of ordinary tokens stay
    assert unexpanded([START, PAD, END], {PAD}) == [START, PAD, END]
    assert unexpanded([], {PAD}) == []


class RecordingLLM:
    """`vllm.LLM.generate`'s shape: one output per request, in order. Each sample's token is
    its seed mod 1000, so a sample that came back under the wrong index shows."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.calls.append((prompts, params))
        outs = []
        for prompt, p in zip(prompts, params, strict=True):
            tok = p["seed"] % 1000
            comp = SimpleNamespace(
                token_ids=[tok],
                logprobs=[{tok: SimpleNamespace(logprob=-0.5)}],
                text="t",
                finish_reason="stop",
            )
            outs.append(SimpleNamespace(prompt_token_ids=prompt["ids"], outputs=[comp]))
        return outs


def test_each_sample_is_a_request_with_its_own_seed():
    """vLLM seeds sample j of an n-sample request with seed + j (its ParentRequest); rlvr's
    contract is blake2b(run seed / iteration / prompt / j) for every backend, so each sample
    goes as its own request with its own seed."""
    backend = object.__new__(VLLMBackend)  # no engine: generate's own bookkeeping
    backend.llm, backend.lora_request, backend.placeholder_ids = RecordingLLM(), None, set()
    backend.prompt = lambda r: {"ids": r.prompt_token_ids}
    backend.sampling_params = lambda spec, seed: {"seed": seed, "n": 1}
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4)
    reqs = [
        PromptRequest(p, [i + 1, 2], [sample_seed(0, 5, p, j) for j in range(3)])
        for i, p in enumerate(("a", "b"))
    ]
    (batch,) = list(backend.generate(reqs, spec))
    ((prompts, params),) = backend.llm.calls
    assert [p["seed"] for p in params] == [s for r in reqs for s in r.sample_seeds]
    assert [p["ids"] for p in prompts] == [[1, 2]] * 3 + [[2, 2]] * 3
    got = {(s.prompt_id, s.sample_index): s.response_token_ids[0] for s in batch}
    assert got == {(r.prompt_id, j): r.sample_seeds[j] % 1000 for r in reqs for j in range(3)}


@pytest.fixture
def tokens_prompt(monkeypatch):
    """`vllm.inputs.TokensPrompt` where vLLM is not installed: a TypedDict, so a dict at run time
    (the keys it takes are checked against vLLM's source: test_vllm_conformance.py)."""
    if "vllm" not in sys.modules:
        vllm, inputs = ModuleType("vllm"), ModuleType("vllm.inputs")
        inputs.TokensPrompt = dict
        vllm.inputs = inputs
        monkeypatch.setitem(sys.modules, "vllm", vllm)
        monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collective_rpc(self, method, args=()):
        self.calls.append(method)
        return [None]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


def test_an_image_prompt_carries_its_images_with_ids_per_policy(tokens_prompt, tmp_path):
    """A text prompt goes as its ids; an image prompt with one placeholder per image, the
    images, and an id per image for vLLM's caches: the image's content digest and the policy
    version, so new weights never reuse the old policy's image embeddings."""
    from PIL import Image

    backend = object.__new__(VLLMBackend)
    backend.placeholder_ids, backend.weights_version = {PAD}, 0
    backend.llm = RecordingEngine()
    text = backend.prompt(PromptRequest("t", [1, 2], [0]))
    assert text == {"prompt_token_ids": [1, 2]}
    red, blue = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    ids = [START, PAD, PAD, END, START, PAD, PAD, END, START, PAD, PAD, END]
    req = PromptRequest("i", ids, [0], (red, blue, red.copy()), None)
    got = backend.prompt(req)
    assert got["prompt_token_ids"] == [START, PAD, END] * 3
    assert got["multi_modal_data"] == {"image": [red, blue, red]}
    first = got["multi_modal_uuids"]["image"]
    assert first[0] == first[2] != first[1]  # by content, not by object
    assert all(u.endswith("-policy0") for u in first)
    backend.load_weights(tmp_path)
    assert backend.llm.calls == ["load_checkpoint", "reset_prefix_cache"]
    again = backend.prompt(req)["multi_modal_uuids"]["image"]
    assert all(u.endswith("-policy1") for u in again) and set(again).isdisjoint(first)
