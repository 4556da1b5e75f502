"""vLLM generation backend, written against vLLM's documented offline API (`vllm.LLM`,
`SamplingParams`, `TokensPrompt`). GPU only: vllm has no CPU wheel, so on CPU machines the stage
uses the transformers backend and this module's tests skip.

Each sample is its own request (n=1) seeded with the sample's own seed, blake2b(run seed /
iteration / prompt / j) as in the transformers backend (docs/contracts.md): a request of n
samples would seed its sample j with seed + j (vLLM's `ParentRequest`, 0.10-0.33), which is
how vLLM runs n anyway, as n child requests; the prefix cache shares the prompt's KV between
them either way. `logprobs=0` asks
vLLM for the sampled token's log-probability; `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2)
makes it the temperature-scaled value the trainer recomputes. Where top-k/top-p truncate, vLLM
reports post-truncation values, so the manifest records the vLLM definition and the trainer
compares definitions before it trusts them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from components.core.errors import UserError
from components.model.backends import (
    BackendInfo,
    PromptRequest,
    Sample,
    SamplingSpec,
    cut_at_stop,
)

VLLM_LOGPROB_DEFINITION = "vllm processed_logprobs (temperature-scaled, after top-k/top-p)"
#: The `max_lora_rank` values vLLM accepts (LoRAConfig's check; its LoRA kernels are built for
#: these). Newer releases add 1; 8 serves ranks 1 to 8 on every release.
VLLM_MAX_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds adapters of rank `rank`."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise UserError(
        f"model.lora.rank {rank}: vLLM serves LoRA adapters up to rank "
        f"{VLLM_MAX_LORA_RANKS[-1]}; lower model.lora.rank or use generate.backend: transformers"
    )


def unexpanded(ids: list[int], placeholders: set[int]) -> list[int]:
    """Prompt ids with each run of one placeholder token (an image's pads) back to a single
    token, as a chat template renders it before a processor expands it."""
    out: list[int] = []
    for t in ids:
        if not (t in placeholders and out and out[-1] == t):
            out.append(t)
    return out


def image_uuid(image, weights_version: int) -> str:
    """An image's id for vLLM's multimodal caches: its content's digest and the policy's
    version. vLLM keeps an image's encoder output (its embeddings) under its content hash and
    reuses it for later requests with the same image (0.10.2 on); after new weights a policy
    whose vision tower trains would get the old embeddings. Only 0.16 and later can reset
    that cache (`reset_encoder_cache`); an id per policy version works from 0.10.2."""
    import hashlib

    digest = hashlib.blake2b(image.tobytes(), digest_size=16)
    digest.update(f"{image.mode}{image.size}".encode())
    return f"{digest.hexdigest()}-policy{weights_version}"


class Received:
    """The vLLM workers' received policy: its size, and its sha256s from the first worker."""

    def __init__(self, backend: VLLMBackend, nbytes: int) -> None:
        self.backend, self.nbytes = backend, nbytes

    def digests(self) -> dict[str, str]:
        return self.backend.llm.collective_rpc("received_digests")[0]


class VLLMBackend:
    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        dtype: str = "auto",
        seed: int = 0,
        max_lora_rank: int | None = None,
        max_images_per_prompt: int | None = None,
    ) -> None:
        import vllm

        kwargs = dict(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if max_lora_rank is not None:  # model.lora: the base stays, each policy is an adapter
            kwargs.update(
                enable_lora=True, max_lora_rank=vllm_max_lora_rank(max_lora_rank), max_loras=1
            )
        if max_images_per_prompt is not None:  # a vision-language policy: its per-prompt limit
            kwargs["limit_mm_per_prompt"] = {"image": max_images_per_prompt}
            # the slow (PIL) image processor, as rlvr's trainer uses (components/model/vision.py)
            kwargs["mm_processor_kwargs"] = {"use_fast": False}
        self.vision = None
        """The policy's `VisionProcessor` (image prompts), set by `make_backend`."""
        self.placeholder_ids: set[int] = set()
        """Image / video placeholder ids: a sampled one ends the response, as in the
        transformers backend (components/train/update.py, `model_inputs`)."""
        self.lora_request = None
        self._lora_version = 0
        self.weights_version = 0
        """How many policies the engine has taken in place (weights or adapters): part of each
        image's id for vLLM's caches (`image_uuid`)."""
        # Every worker process gets `load_checkpoint` (components/model/vllm_worker.py), so a
        # new policy reaches the running engine through `collective_rpc` (vLLM >= 0.8.3).
        kwargs["worker_extension_cls"] = "components.model.vllm_worker.CheckpointLoader"
        self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.info = BackendInfo("vllm", vllm.__version__, VLLM_LOGPROB_DEFINITION)

    def load_weights(self, checkpoint_dir: Path) -> None:
        """A new policy into the running engine: each worker loads the checkpoint's safetensors
        through the model's own `load_weights` (which handles vLLM's fused and sharded layouts);
        the prefix cache, which holds the old policy's KV, is then dropped."""
        self.llm.collective_rpc("load_checkpoint", args=(str(checkpoint_dir),))
        self.llm.reset_prefix_cache()
        self.weights_version += 1

    def receive(self, receiver, version: int) -> tuple[Received, int]:
        """Policy `version` over the weight channel: every worker joins the channel's group
        (ranks `receiver.rank` onwards, one per tensor-parallel rank) and loads what it
        receives through the model's `load_weights`; the prefix cache is then dropped. Any
        failure is a ChannelError: the caller loads the checkpoint from the store. Returns what
        gives the bytes received and, from the first worker, their sha256s."""
        from components.model.channel import ChannelError

        s = receiver.s
        try:
            results = self.llm.collective_rpc(
                "receive_weights",
                args=(
                    s.root,
                    getattr(s.store, "endpoint_url", None),
                    version,
                    receiver.rank,
                    s.receivers,
                    s.bucket_mb,
                    s.timeout_s,
                ),
            )
        except Exception as e:  # noqa: BLE001 - vLLM wraps the worker's error in its own
            raise ChannelError(f"weight channel: version {version} not received ({e})") from None
        self.llm.reset_prefix_cache()
        self.weights_version += 1
        received = Received(self, results[0])
        return received, received.nbytes

    def set_adapter(self, adapter_dir: Path, base_digest: str) -> None:
        """Sample from now on with the LoRA adapter in `adapter_dir` (PEFT's format, made for
        the base of `base_digest`, which the engine checked): every
        request carries a `LoRARequest` with a new id, so vLLM loads this adapter (megabytes)
        instead of serving the one it has cached; the base weights stay as they are."""
        from vllm.lora.request import LoRARequest

        self._lora_version += 1
        self.lora_request = LoRARequest(
            f"policy-{self._lora_version}", self._lora_version, str(adapter_dir)
        )
        self.llm.reset_prefix_cache()  # its KV came from the previous adapter
        self.weights_version += 1  # a new policy: its images get new ids (image_uuid)

    def close(self) -> None:
        """Shut the engine down and free its GPU memory now: a new engine (another
        architecture) may be started in the same process right after."""
        import gc

        llm, self.llm = self.llm, None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        # V1: the engine core's processes (LLMEngine itself has no shutdown in 0.10-0.33)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None) or getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm, engine
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def sampling_params(self, spec: SamplingSpec, seed: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,  # one request per sample, with the sample's own seed (module doc)
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k if spec.top_k > 0 else -1,
            max_tokens=spec.max_new_tokens,
            stop=list(spec.stop) or None,
            stop_token_ids=sorted(set(spec.stop_token_ids) | self.placeholder_ids) or None,
            include_stop_str_in_output=True,
            seed=seed,
            logprobs=0,
        )

    def prompt(self, request: PromptRequest):
        """A request as vLLM's `TokensPrompt`. An image prompt's ids hold each image's pad
        tokens expanded as the checkpoint's processor does (components/model/vision.py); vLLM
        expands the placeholders of a token prompt itself (0.10 to 0.33), so each run goes back
        to one placeholder, and `generate` checks that vLLM's expansion gives rlvr's ids. Each
        image goes with its id for vLLM's caches (`image_uuid`)."""
        from vllm.inputs import TokensPrompt

        if not request.images:
            return TokensPrompt(prompt_token_ids=request.prompt_token_ids)
        return TokensPrompt(
            prompt_token_ids=unexpanded(request.prompt_token_ids, self.placeholder_ids),
            multi_modal_data={"image": list(request.images)},
            multi_modal_uuids={
                "image": [image_uuid(im, self.weights_version) for im in request.images]
            },
        )

    def generate(self, requests: list[PromptRequest], spec: SamplingSpec) -> Iterator[list[Sample]]:
        chunk = 256  # prompts per generate call: bounded memory, streaming parts
        for start in range(0, len(requests), chunk):
            batch = requests[start : start + chunk]
            prompts = [self.prompt(r) for r in batch]
            rows = [(r, p, j) for r, p in zip(batch, prompts, strict=True) for j in range(spec.n)]
            outputs = self.llm.generate(
                [p for _, p, _ in rows],
                [self.sampling_params(spec, r.sample_seeds[j]) for r, _, j in rows],
                use_tqdm=False,
                lora_request=self.lora_request,
            )
            samples = []
            for (req, _, j), out in zip(rows, outputs, strict=True):
                if req.images and list(out.prompt_token_ids or []) != req.prompt_token_ids:
                    raise RuntimeError(
                        f"vLLM expanded the images of prompt {req.prompt_id} to "
                        f"{len(out.prompt_token_ids or [])} prompt tokens, rlvr's processor to "
                        f"{len(req.prompt_token_ids)}: the trainer would not see what was sampled"
                    )
                for comp in out.outputs:  # one: a request a sample
                    token_ids = list(comp.token_ids)
                    if comp.logprobs is None or len(comp.logprobs) != len(token_ids):
                        raise RuntimeError(
                            f"vLLM returned {len(comp.logprobs or [])} logprobs for "
                            f"{len(token_ids)} tokens of prompt {req.prompt_id}"
                        )
                    lps = [
                        float(step[tok].logprob)
                        for step, tok in zip(comp.logprobs, token_ids, strict=True)
                    ]
                    text = cut_at_stop(comp.text, spec.stop)[0] if spec.stop else comp.text
                    samples.append(
                        Sample(
                            prompt_id=req.prompt_id,
                            sample_index=j,
                            response=text,
                            response_token_ids=token_ids,
                            response_logprobs=lps,
                            finish_reason="length" if comp.finish_reason == "length" else "stop",
                        )
                    )
            yield samples
