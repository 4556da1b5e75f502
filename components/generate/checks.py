"""The generate section against the policy and the data, checked before any work: prompt lengths
(those over `generate.max_prompt_tokens` are skipped by design, so they are warnings; all of
them over is an error), sequences that would not fit the model's context, and stop token ids
outside the vocabulary.

Token counts: a tokenizer emits at most one token per UTF-8 byte of content, so only rows whose
byte length plus the chat template's own tokens could exceed the limit are rendered and
tokenized; the rest are cleared by Arrow compute alone.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from components.core.config import RunConfig
from components.core.errors import Problems, UserError
from components.core.preflight import prompt_byte_lengths, rows_text


def _template_overhead(tokenizer, messages: int) -> int:
    """Tokens the chat template adds around `messages` empty messages."""
    from components.generate.rollouts import render_prompt

    roles = ["user" if i % 2 == 0 else "assistant" for i in range(messages)]
    return len(render_prompt(tokenizer, [{"role": r, "content": ""} for r in roles])[1])


def prompt_token_lengths(tokenizer, table: pa.Table, limit: int) -> dict[int, int]:
    """Exact token lengths of the rows that might exceed `limit` (row -> tokens)."""
    import pyarrow.compute as pc

    from components.generate.rollouts import render_prompt

    prompt = table.column("prompt").combine_chunks()
    if pa.types.is_list(prompt.type):
        counts = pc.list_value_length(prompt).fill_null(0).to_numpy(zero_copy_only=False)
    else:
        counts = np.ones(len(prompt), np.int64)
    overhead = {int(k): _template_overhead(tokenizer, int(k)) for k in np.unique(counts) if k > 0}
    bound = prompt_byte_lengths(table) + np.array([overhead.get(int(k), 0) for k in counts])
    out = {}
    for row in np.flatnonzero(bound > limit):
        value = prompt[int(row)].as_py()
        if value:
            out[int(row)] = len(render_prompt(tokenizer, value)[1])
    return out


def check_generate(
    cfg: RunConfig,
    tokenizer,
    model_config,
    datasets: dict[str, tuple[str, pa.Table]],
    problems: Problems,
) -> None:
    """`datasets`: name -> (uri, table) of the sets generate or evaluate will sample."""
    g = cfg.generate
    vocab = len(tokenizer)
    bad_ids = [i for i in g.stop_token_ids if not 0 <= i < vocab]
    if bad_ids:
        problems.error(
            "config generate.stop_token_ids",
            f"{bad_ids} are not token ids of the policy's tokenizer (vocabulary of {vocab})",
            "use ids below the vocabulary size",
        )
    chat = sorted(
        uri
        for uri, table in datasets.values()
        if pa.types.is_list(table.schema.field("prompt").type)
    )
    if chat and not getattr(tokenizer, "chat_template", None):
        problems.warn(
            f"config model.base ({cfg.model.base})",
            f"the tokenizer has no chat template, so the chat prompts of {', '.join(chat)} "
            "reach the model as their contents joined by newlines, without role markers",
            "save the model's chat template with the checkpoint (chat_template.jinja, or "
            "chat_template in tokenizer_config.json), or write the prompts as plain strings",
        )
    context = getattr(model_config, "max_position_embeddings", None) or getattr(
        getattr(model_config, "text_config", None), "max_position_embeddings", None
    )  # a vision-language model keeps it in its text config
    max_new = {"train": g.max_new_tokens}
    for ev in cfg.data.eval:
        max_new[ev.name] = ev.max_new_tokens or g.max_new_tokens
    for name, (uri, table) in datasets.items():
        lengths = prompt_token_lengths(tokenizer, table, g.max_prompt_tokens)
        over = np.array(sorted(r for r, n in lengths.items() if n > g.max_prompt_tokens))
        if over.size == table.num_rows:
            problems.error(
                uri,
                f"every prompt is longer than generate.max_prompt_tokens={g.max_prompt_tokens}",
                "raise it",
            )
        elif over.size:
            problems.warn(
                f"{uri} {rows_text(over)}",
                f"{over.size} prompt(s) longer than "
                f"generate.max_prompt_tokens={g.max_prompt_tokens} will be skipped",
                "raise it to sample them",
            )
        if context:
            fitting = [n for n in lengths.values() if n <= g.max_prompt_tokens]
            longest = max(fitting, default=0)
            if longest == 0:  # every row was cleared by the byte bound: measure the longest
                byte_len = prompt_byte_lengths(table)
                row = int(np.argmax(byte_len))
                from components.generate.rollouts import render_prompt

                longest = len(render_prompt(tokenizer, table.column("prompt")[row].as_py())[1])
            need = min(longest, g.max_prompt_tokens) + max_new.get(name, g.max_new_tokens)
            if need > context:
                problems.error(
                    f"config generate.max_new_tokens ({name})",
                    f"a prompt of {min(longest, g.max_prompt_tokens)} tokens plus "
                    f"{max_new.get(name, g.max_new_tokens)} new tokens exceeds the model's "
                    f"context of {context} positions",
                    "lower max_new_tokens or max_prompt_tokens",
                )


def check_local_dtype(cfg: RunConfig, problems: Problems) -> None:
    """A bf16 or fp16 sampler on a CPU without native matmuls of that dtype (a local run, no GPU):
    torch emulates them, slower than fp32. A warning: it is correct, only slow."""
    import torch

    from components.model.checkpoint import cpu_native_matmul

    g = cfg.generate
    if g.backend != "transformers" or g.dtype not in ("bfloat16", "float16"):
        return
    if torch.cuda.is_available() or cpu_native_matmul(g.dtype) is not False:
        return
    problems.warn(
        "config generate.dtype",
        f"{g.dtype} on a CPU without native {g.dtype} matmuls (no AMX or AVX-512 support for it "
        "in /proc/cpuinfo): torch emulates it, and sampling runs slower than in float32",
        "set generate.dtype: float32 (or auto) on this machine",
    )


def check_curriculum(cfg: RunConfig, problems: Problems, table: pa.Table | None = None) -> None:
    """`data.sampler: curriculum`: its group_by names a column (or extra_info field) of the
    train set, and the train set holds a whole iteration's prompts. `table`: the train set
    (read from data.train when None)."""
    if cfg.data.sampler != "curriculum":
        return
    from components.generate.curriculum import group_keys

    if table is None:
        from components.core.schemas import read_parquet
        from components.core.store import get_store

        table = read_parquet(get_store(cfg.data.train, cfg.run.s3_endpoint_url), cfg.data.train)
    try:
        group_keys(table, cfg.data.curriculum.group_by)
    except UserError as e:
        problems.error(f"config data.curriculum.group_by ({cfg.data.train})", str(e))
    lag = cfg.train.max_staleness + 1
    if cfg.data.curriculum.return_after <= lag:
        problems.warn(
            "config data.curriculum.return_after",
            f"{cfg.data.curriculum.return_after} iterations: the sampler learns of a retirement "
            f"{lag} iteration(s) later (train.max_staleness + 1), so retired prompts never wait",
            f"set it above {lag}",
        )
