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
from dataclasses import dataclass, field
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
from components.model.backends import Backend, PromptRequest, SamplingSpec, sample_seed
from components.model.vision import IMAGES_REF

log = logging.getLogger("rlvr.generate")


@dataclass
class PromptRow:
    prompt_id: str
    data_source: str
    ground_truth: str
    prompt: Any  # list of {role, content} or a string
    extra_info: str | None  # JSON
    images: list | None = None
    """An image prompt's `images` entries (encoded bytes, components/model/vision.py)."""
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
    from components.model.vision import IMAGE_COLUMN, image_bytes

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
    from components.model.vision import decode_image

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


@dataclass(frozen=True)
class LoadedPolicy:
    """The policy that samples: its engine and tokenizer, and the checkpoint (its URI and
    number) every rollout row records as its origin."""

    backend: Backend
    tokenizer: Any
    checkpoint_uri: str
    version: int


@dataclass(frozen=True)
class RolloutSettings:
    """How rollouts are rendered, sampled and written, beyond the sampling spec: the prompt
    budget, the part size, and the multi-turn loop (tools, an environment)."""

    max_prompt_tokens: int
    rows_per_part: int
    tools: Any = None
    max_turns: int = 1
    max_response_tokens: int | None = None
    environment: Any = None

    @classmethod
    def of(cls, gen: GenerateSection, tools: Any) -> RolloutSettings:
        return cls(
            max_prompt_tokens=gen.max_prompt_tokens,
            rows_per_part=gen.rows_per_part,
            tools=tools,
            max_turns=gen.max_turns,
            max_response_tokens=gen.max_response_tokens,
            environment=gen.environment,
        )


def generate_rollouts(
    out: OutputDir,
    policy: LoadedPolicy,
    prompts: list[PromptRow],
    spec: SamplingSpec,
    settings: RolloutSettings,
    *,
    iteration: int,
    desc: str = "generate",
    allow_empty: bool = False,
    run_root: str = "",
) -> dict[str, Any]:
    """Sample, stream Parquet parts into `out` and return the stats (does not commit).

    `out` is cleared only once the prompts are rendered and checked."""
    backend, tokenizer, tools = policy.backend, policy.tokenizer, settings.tools
    max_turns, environment = settings.max_turns, settings.environment
    if not prompts and not allow_empty:
        raise StageError("the prompt set is empty; check data.train / data.eval and the filters")
    rendered = _render_all(
        backend, tokenizer, prompts, spec, iteration, settings.max_prompt_tokens, tools
    )
    # image prompts: each row points at its images in the run's copy of the dataset (relative
    # to the run, so a store seen at another path, as in a container, writes the same bytes)
    refs = {p.prompt_id: relative_ref(p.images_ref, run_root) for p in prompts if p.images_ref}
    out.begin(force=True)  # inputs are good: clear any partial output, then stream
    multi = tools is not None  # multi-turn: trajectories with tool observations
    parts = _PartStream(out, _optional_columns(multi, environment, refs), settings.rows_per_part)
    tally = _Tally()
    row = _RowMaker(rendered, refs, policy.checkpoint_uri, policy.version, multi, environment)
    clock = getattr(backend, "clock", None)  # the transformers backend's phases
    if clock is not None:
        clock.take()  # from this call only
    t0 = time.perf_counter()
    try:
        # disable=None: a bar on a terminal, none in a worker's piped log (which gets one line).
        with tqdm(
            total=len(rendered.requests), desc=desc, unit="prompt", dynamic_ncols=True, disable=None
        ) as bar:
            max_tokens = (
                (settings.max_response_tokens or spec.max_new_tokens * max_turns) if multi else 0
            )
            requests = rendered.requests
            source = (
                _trajectory_batches(
                    backend, tokenizer, requests, spec, tools, max_turns, max_tokens, environment
                )
                if multi
                else backend.generate(requests, spec)
            )
            _write_samples(source, row, tally, parts, bar, t0)
    finally:
        parts.close()
    elapsed = time.perf_counter() - t0
    multi_stats = tally.multi_stats(tools, max_turns) if multi else {}
    return {**multi_stats, **_stats(backend, spec, rendered, parts.parts, tally, elapsed)}


def _optional_columns(multi: bool, environment: Any, refs: dict[str, str]) -> tuple[str, ...]:
    """The rollout columns this call writes beyond the required ones."""
    optional = ("response_mask", "turns") if multi else ()
    optional += ("env_reward",) if environment else ()
    optional += (IMAGES_REF,) if refs else ()
    return optional


def _write_samples(source, row: _RowMaker, tally: _Tally, parts: _PartStream, bar, t0: float):
    """Every batch of samples from `source` as rows into `parts`, counted in `tally`, with the
    prompts done and the tokens/s so far on the progress `bar`."""
    for samples in source:
        for s in samples:
            values = row(s)
            tally.add(s, row.multi)
            parts.add(values)
        bar.update(len({s.prompt_id for s in samples}))
        elapsed = time.perf_counter() - t0
        bar.set_postfix(tok_s=f"{sum(tally.resp_lens) / max(elapsed, 1e-9):.0f}")
    parts.flush()


@dataclass
class _Rendered:
    """The prompts to sample: each kept one's row, text and token ids, and its request."""

    by_id: dict[str, PromptRow]
    texts: dict[str, tuple[str, list[int]]]
    requests: list[PromptRequest]
    skipped: list[str]
    """The ids of prompts over generate.max_prompt_tokens, which are not sampled."""


def _render_all(
    backend: Backend,
    tokenizer,
    prompts: list[PromptRow],
    spec: SamplingSpec,
    iteration: int,
    max_prompt_tokens: int,
    tools: Any,
) -> _Rendered:
    """Render every prompt and seed its n samples, skipping (with a warning) prompts over
    `max_prompt_tokens`; raises where nothing is left to sample or image prompts meet tools."""
    got = _Rendered({}, {}, [], [])
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
            got.skipped.append(p.prompt_id)
            continue
        got.by_id[p.prompt_id], got.texts[p.prompt_id] = p, (text, ids)
        seeds = [sample_seed(spec.seed, iteration, p.prompt_id, j) for j in range(spec.n)]
        got.requests.append(PromptRequest(p.prompt_id, ids, seeds, images, vi))

    if prompts and not got.requests:
        raise StageError(
            f"all {len(prompts)} prompts are longer than generate.max_prompt_tokens="
            f"{max_prompt_tokens}; raise it"
        )
    return got


@dataclass
class _RowMaker:
    """A sample's rollout row: its prompt's columns, its own, and the optional ones (images_ref,
    multi-turn columns, the environment's reward) where the run writes them."""

    rendered: _Rendered
    refs: dict[str, str]
    checkpoint_uri: str
    policy_version: int
    multi: bool
    environment: Any

    def __call__(self, s) -> dict[str, Any]:
        row = self.rendered.by_id[s.prompt_id]
        text, ids = self.rendered.texts[s.prompt_id]
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
            "checkpoint": self.checkpoint_uri,
            "extra_info": row.extra_info,
            "policy_version": self.policy_version,
        }
        if self.refs:
            values[IMAGES_REF] = self.refs.get(s.prompt_id)
        if self.multi:
            values["response_mask"] = s.mask
            values["turns"] = s.turns
            if self.environment is not None:
                values["env_reward"] = s.env_reward
        return values


class _PartStream:
    """Rows into numbered Parquet parts of `rows_per_part` rows each, written in a scratch
    directory and put into `out` one by one (so a part is never half there)."""

    def __init__(self, out: OutputDir, optional: tuple[str, ...], rows_per_part: int) -> None:
        self.out, self.optional, self.rows_per_part = out, optional, rows_per_part
        self.tmp = Path(tempfile.mkdtemp(prefix="rlvr-gen-"))
        self.buf: dict[str, list] = {}
        self.parts = 0

    def add(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            self.buf.setdefault(k, []).append(v)
        if len(self.buf["prompt_id"]) >= self.rows_per_part:
            self.flush()

    def flush(self) -> None:
        if not self.buf or not self.buf["prompt_id"]:
            return
        path = self.tmp / f"part-{self.parts:05d}.parquet"
        w = PartWriter(path, "rollouts", self.optional)
        w.write(self.buf)
        w.close()
        self.out.put_file(path, path.name)
        path.unlink()
        self.parts += 1
        self.buf = {}

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


@dataclass
class _Tally:
    """Counts over the samples written: response lengths, truncations and, multi-turn, the
    trajectories' turns, tool calls and errors."""

    resp_lens: list[int] = field(default_factory=list)
    truncated: int = 0
    turn_counts: list[int] = field(default_factory=list)
    call_counts: list[int] = field(default_factory=list)
    errors: int = 0
    env_errors: int = 0

    def add(self, s, multi: bool) -> None:
        if multi:
            self.turn_counts.append(sum(t["role"] == "assistant" for t in s.turns))
            self.call_counts.append(s.tool_calls)
            self.errors += s.tool_errors
            self.env_errors += s.error is not None
            if s.error:
                log.warning("%s sample %d: %s", s.prompt_id, s.sample_index, s.error)
        self.resp_lens.append(len(s.response_token_ids))
        self.truncated += s.finish_reason == "length"

    def multi_stats(self, tools: Any, max_turns: int) -> dict[str, Any]:
        n_samples = len(self.resp_lens)
        calls = sum(self.call_counts)
        call_counts = self.call_counts
        return {
            "turns_mean": float(np.mean(self.turn_counts)) if self.turn_counts else 0.0,
            "tool_calls": calls,
            "tool_calls_per_sample": calls / n_samples if n_samples else 0.0,
            "tool_call_rate": float(np.mean([c > 0 for c in call_counts])) if call_counts else 0.0,
            "tool_error_share": self.errors / calls if calls else 0.0,
            "env_errors": self.env_errors,
            "tools": sorted(tools.tools),
            "max_turns": max_turns,
        }


def _stats(
    backend: Backend,
    spec: SamplingSpec,
    rendered: _Rendered,
    parts: int,
    tally: _Tally,
    elapsed: float,
) -> dict[str, Any]:
    """The stage's stats of one generate_rollouts call (the multi-turn ones apart)."""
    resp_lens, n_samples = tally.resp_lens, len(tally.resp_lens)
    return {
        "prompts": len(rendered.requests),
        "samples": n_samples,
        "skipped_prompts": len(rendered.skipped),
        "skipped_prompt_ids": rendered.skipped,  # all: the curriculum excludes them from its draws
        "parts": parts,
        "response_length_mean": float(np.mean(resp_lens)) if resp_lens else 0.0,
        "response_length_max": int(max(resp_lens)) if resp_lens else 0,
        "truncated_fraction": tally.truncated / n_samples if n_samples else 0.0,
        "response_tokens": int(sum(resp_lens)),
        "tokens_per_s": sum(resp_lens) / elapsed if elapsed > 0 else 0.0,
        "seconds": elapsed,
        **_phases(backend, elapsed),
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


def _phases(backend: Backend, elapsed: float) -> dict[str, Any]:
    """`phases`: where the call's seconds went (prefill, decode, detokenize; `other`: the rest,
    rows into Parquet parts and the store), and the decode steps, where the backend times them."""
    clock = getattr(backend, "clock", None)
    if clock is None:
        return {}
    phases = clock.take()
    timed = sum(v for k, v in phases.items() if k.endswith("_s"))
    return {"phases": {**phases, "other_s": max(0.0, elapsed - timed)}}


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
