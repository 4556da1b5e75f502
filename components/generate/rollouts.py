"""Rollouts from prompts: the verl-format prompt rows of a dataset, their chat-template
rendering, the sampling spec of a config, and `generate_rollouts`, which samples n responses
per prompt through a backend (single- or multi-turn) and streams them into Parquet parts. The
generate stage (stage.py) and the evaluate stage both sample with it."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from components.core.commit import (
    OutputDir,
    committed_files,
)
from components.core.config import GenerateSection
from components.core.errors import StageError, UserError
from components.core.schemas import PartWriter, ground_truth_of, read_dataset
from components.core.store import Store
from components.core.vision import IMAGES_REF
from components.generate.backends import Backend, PromptRequest, SamplingSpec, sample_seed

log = logging.getLogger("rlvr.generate")


@dataclass
class PromptRow:
    prompt_id: str
    data_source: str
    ground_truth: str
    prompt: Any  # list of {role, content} or a string
    extra_info: str | None  # JSON
    images: list | None = None
    """An image prompt's `images` entries (encoded bytes, components/core/vision.py)."""
    images_ref: str | None = None
    """Where they are: `<dataset uri>#<row>` (rollouts carry it relative to the run)."""


def dataset_uri(store: Store, committed_dir: str) -> str:
    files = committed_files(store, committed_dir, ".parquet")
    if len(files) != 1:
        raise ValueError(f"{committed_dir} must hold exactly one Parquet file, found {len(files)}")
    return files[0]


def load_prompts(
    store: Store, uri: str, prefix: str, indices: list[int] | None = None
) -> list[PromptRow]:
    """Rows of a verl-format dataset as PromptRows; prompt_id is `<prefix>-<row index>`. The
    whole dataset is checked first (null or empty prompts, missing ground truths)."""
    from components.core.errors import Problems
    from components.core.preflight import scan_dataset

    table = read_dataset(store, uri)
    problems = Problems()
    scan_dataset(table, uri, problems)
    problems.raise_if_any()
    return prompts_from(table, uri, prefix, indices)


def prompts_from(table, uri: str, prefix: str, indices: list[int] | None = None) -> list[PromptRow]:
    """PromptRows of (some rows of) a validated dataset table read from `uri`."""
    if indices is not None:
        table = table.take(indices)
    else:
        indices = list(range(table.num_rows))
    from components.core.vision import IMAGE_COLUMN, image_bytes

    cols = {c: table.column(c).to_pylist() for c in ("data_source", "prompt", "reward_model")}
    extra = table.column("extra_info").to_pylist() if "extra_info" in table.column_names else None
    images = table.column(IMAGE_COLUMN).to_pylist() if IMAGE_COLUMN in table.column_names else None
    rows = []
    for k, idx in enumerate(indices):
        rows.append(
            PromptRow(
                prompt_id=f"{prefix}-{idx:07d}",
                data_source=cols["data_source"][k],
                ground_truth=ground_truth_of(cols["reward_model"][k], uri, idx),
                prompt=cols["prompt"][k],
                extra_info=json.dumps(extra[k], default=str) if extra and extra[k] else None,
                images=[image_bytes(e) for e in images[k]] if images and images[k] else None,
                images_ref=f"{uri}#{idx}" if images and images[k] else None,
            )
        )
    return rows


def render_request(tokenizer, vision, row: PromptRow) -> tuple[str, list[int], tuple, Any]:
    """(text, token ids, PIL images, VisionInputs) of a prompt row: an image prompt through the
    policy's `VisionProcessor`, a text prompt through `render_prompt`."""
    if not row.images:
        return (*render_prompt(tokenizer, row.prompt), (), None)
    from components.core.vision import decode_image

    if vision is None:
        raise StageError(
            f"{row.images_ref}: an image prompt, but the policy is a text-only model; use a "
            "vision-language checkpoint (model.base) or drop the images column"
        )
    images = tuple(decode_image(b, f"{row.images_ref} image {k}") for k, b in enumerate(row.images))
    try:
        text, ids, vi = vision.render(row.prompt, list(images))
    except UserError as e:
        raise UserError(f"{row.images_ref} (prompt {row.prompt_id}): {e}") from None
    return text, ids, images, vi


def render_prompt(tokenizer, prompt: Any) -> tuple[str, list[int]]:
    """The exact text fed to the model and its token ids."""
    if isinstance(prompt, str):
        text = prompt
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        return text, list(ids)
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n".join(m["content"] for m in messages)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def relative_ref(ref: str, root: str) -> str:
    """`<uri>#<row>` with the uri relative to the run's root where it lies under it."""
    uri, _, row = ref.rpartition("#")
    prefix = root.rstrip("/") + "/"
    return f"{uri[len(prefix) :] if root and uri.startswith(prefix) else uri}#{row}"


def spec_from(gen: GenerateSection, seed: int, **override: Any) -> SamplingSpec:
    values = dict(
        n=gen.n,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        max_new_tokens=gen.max_new_tokens,
        stop=tuple(gen.stop),
        seed=seed,
        stop_token_ids=tuple(gen.stop_token_ids),
    )
    values.update({k: v for k, v in override.items() if v is not None})
    return SamplingSpec(**values)


def generate_rollouts(
    out: OutputDir,
    backend: Backend,
    tokenizer,
    prompts: list[PromptRow],
    spec: SamplingSpec,
    *,
    iteration: int,
    checkpoint_uri: str,
    max_prompt_tokens: int,
    rows_per_part: int,
    policy_version: int,
    desc: str = "generate",
    allow_empty: bool = False,
    tools: Any = None,
    max_turns: int = 1,
    max_response_tokens: int | None = None,
    environment: Any = None,
    run_root: str = "",
) -> dict[str, Any]:
    """Sample, stream Parquet parts into `out` and return the stats (does not commit).

    `out` is cleared only once the prompts are rendered and checked."""
    if not prompts and not allow_empty:
        raise StageError("the prompt set is empty; check data.train / data.eval and the filters")
    by_id: dict[str, PromptRow] = {}
    texts: dict[str, tuple[str, list[int]]] = {}
    requests: list[PromptRequest] = []
    skipped: list[str] = []
    vision = getattr(backend, "vision", None)
    if tools is not None and any(p.images for p in prompts):
        raise StageError(
            "image prompts are sampled single-turn only (a trajectory's later turns would reach "
            "the policy without its images); drop generate.tools / generate.environment"
        )
    for p in prompts:
        text, ids, images, vi = render_request(tokenizer, vision, p)
        if len(ids) > max_prompt_tokens:
            log.warning(
                "skipping prompt %s: %d tokens > generate.max_prompt_tokens=%d",
                p.prompt_id,
                len(ids),
                max_prompt_tokens,
            )
            skipped.append(p.prompt_id)
            continue
        by_id[p.prompt_id], texts[p.prompt_id] = p, (text, ids)
        seeds = [sample_seed(spec.seed, iteration, p.prompt_id, j) for j in range(spec.n)]
        requests.append(PromptRequest(p.prompt_id, ids, seeds, images, vi))

    if prompts and not requests:
        raise StageError(
            f"all {len(prompts)} prompts are longer than generate.max_prompt_tokens="
            f"{max_prompt_tokens}; raise it"
        )
    # image prompts: each row points at its images in the run's copy of the dataset (relative
    # to the run, so a store seen at another path, as in a container, writes the same bytes)
    refs = {p.prompt_id: relative_ref(p.images_ref, run_root) for p in prompts if p.images_ref}
    out.begin(force=True)  # inputs are good: clear any partial output, then stream
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-gen-"))
    buf: dict[str, list] = {}
    parts = 0
    resp_lens: list[int] = []
    truncated = 0
    multi = tools is not None  # multi-turn: trajectories with tool observations
    turn_counts: list[int] = []
    call_counts: list[int] = []
    errors = env_errors = 0

    def flush() -> None:
        nonlocal parts, buf
        if not buf or not buf["prompt_id"]:
            return
        path = tmp / f"part-{parts:05d}.parquet"
        optional = ("response_mask", "turns") if multi else ()
        optional += ("env_reward",) if environment else ()
        optional += (IMAGES_REF,) if refs else ()
        w = PartWriter(path, "rollouts", optional)
        w.write(buf)
        w.close()
        out.put_file(path, path.name)
        path.unlink()
        parts += 1
        buf = {}

    t0 = time.perf_counter()
    try:
        # disable=None: a bar on a terminal, none in a worker's piped log (which gets one line).
        with tqdm(
            total=len(requests), desc=desc, unit="prompt", dynamic_ncols=True, disable=None
        ) as bar:
            source = (
                _trajectory_batches(
                    backend,
                    tokenizer,
                    requests,
                    spec,
                    tools,
                    max_turns,
                    max_response_tokens or spec.max_new_tokens * max_turns,
                    environment,
                )
                if multi
                else backend.generate(requests, spec)
            )
            for batch in source:
                for s in batch:
                    row = by_id[s.prompt_id]
                    text, ids = texts[s.prompt_id]
                    values = {
                        "prompt_id": s.prompt_id,
                        "sample_index": s.sample_index,
                        "data_source": row.data_source,
                        "ground_truth": row.ground_truth,
                        "prompt": text,
                        "prompt_token_ids": ids,
                        "response": s.response,
                        "response_token_ids": s.response_token_ids,
                        "response_logprobs": s.response_logprobs,
                        "finish_reason": s.finish_reason,
                        "checkpoint": checkpoint_uri,
                        "extra_info": row.extra_info,
                        "policy_version": policy_version,
                    }
                    if refs:
                        values[IMAGES_REF] = refs.get(s.prompt_id)
                    if multi:
                        values["response_mask"] = s.mask
                        values["turns"] = s.turns
                        if environment is not None:
                            values["env_reward"] = s.env_reward
                        turn_counts.append(sum(t["role"] == "assistant" for t in s.turns))
                        call_counts.append(s.tool_calls)
                        errors += s.tool_errors
                        env_errors += s.error is not None
                        if s.error:
                            log.warning("%s sample %d: %s", s.prompt_id, s.sample_index, s.error)
                    for k, v in values.items():
                        buf.setdefault(k, []).append(v)
                    resp_lens.append(len(s.response_token_ids))
                    truncated += s.finish_reason == "length"
                    if len(buf["prompt_id"]) >= rows_per_part:
                        flush()
                bar.update(len({s.prompt_id for s in batch}))
                elapsed = time.perf_counter() - t0
                bar.set_postfix(tok_s=f"{sum(resp_lens) / max(elapsed, 1e-9):.0f}")
            flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    n_samples = len(resp_lens)
    multi_stats = {}
    if multi:
        calls = sum(call_counts)
        multi_stats = {
            "turns_mean": float(np.mean(turn_counts)) if turn_counts else 0.0,
            "tool_calls": calls,
            "tool_calls_per_sample": calls / n_samples if n_samples else 0.0,
            "tool_call_rate": float(np.mean([c > 0 for c in call_counts])) if call_counts else 0.0,
            "tool_error_share": errors / calls if calls else 0.0,
            "env_errors": env_errors,
            "tools": sorted(tools.tools),
            "max_turns": max_turns,
        }
    return {
        **multi_stats,
        "prompts": len(requests),
        "samples": n_samples,
        "skipped_prompts": len(skipped),
        "skipped_prompt_ids": skipped,  # all: the curriculum excludes them from its draws
        "parts": parts,
        "response_length_mean": float(np.mean(resp_lens)) if resp_lens else 0.0,
        "response_length_max": int(max(resp_lens)) if resp_lens else 0,
        "truncated_fraction": truncated / n_samples if n_samples else 0.0,
        "response_tokens": int(sum(resp_lens)),
        "tokens_per_s": sum(resp_lens) / elapsed if elapsed > 0 else 0.0,
        "seconds": elapsed,
        "backend": backend.info.name,
        "backend_version": backend.info.version,
        "logprob_definition": backend.info.logprob_definition,
        "dtype": backend.info.dtype,
        "device": backend.info.device,
        "sampling": {
            "n": spec.n,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k,
            "max_new_tokens": spec.max_new_tokens,
            "stop": list(spec.stop),
            "stop_token_ids": list(spec.stop_token_ids),
            "seed": spec.seed,
        },
    }


def _trajectory_batches(
    backend, tokenizer, requests, spec, tools, max_turns, max_tokens, environment=None
):
    """Multi-turn sampling as the backend's batches of samples: one batch per request, each
    sample a trajectory whose response is its final answer (verify scores that text only, never
    a tool's output)."""
    from components.generate.multiturn import (
        EnvironmentSpec,
        generate_multi_turn,
        observation_encoder,
    )

    env = None
    if environment is not None:
        env = EnvironmentSpec(environment.url, environment.name, environment.timeout_s)
    trajs = generate_multi_turn(
        backend,
        requests,
        spec,
        tools,
        observation_encoder(tokenizer),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        max_turns=max_turns,
        max_response_tokens=max_tokens,
        environment=env,
    )
    by_prompt: dict[str, list] = {}
    for tr in trajs:
        by_prompt.setdefault(tr.prompt_id, []).append(_TrajectorySample(tr))
    yield from by_prompt.values()


class _TrajectorySample:
    """A trajectory seen as a backend Sample (the row writer's view), with its turns."""

    def __init__(self, tr) -> None:
        self.prompt_id, self.sample_index = tr.prompt_id, tr.sample_index
        self.response = tr.response
        self.response_token_ids, self.response_logprobs = tr.token_ids, tr.logprobs
        self.finish_reason = tr.finish_reason  # stop, length, turns or error
        self.mask, self.turns = tr.mask, tr.turns
        self.tool_calls, self.tool_errors, self.error = tr.tool_calls, tr.tool_errors, tr.error
        self.env_reward = tr.env_reward
