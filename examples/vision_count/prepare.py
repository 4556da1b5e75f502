"""Prepare the vision-count demo: image datasets plus a briefly warmed tiny Qwen2-VL, all offline.

Writes, under ``--out``:

* ``train.parquet`` and ``eval.parquet`` (verl's multimodal format, see
  ``examples.vision_count.data``);
* ``base/``: a tiny Qwen2-VL policy with its character-level tokenizer and image processor,
  warmed by a short supervised run on train problems so that RL starts from a policy that
  sometimes answers correctly;
* ``prepare.json``: the settings, the warm-up curve and the base's held-out figures.

The warm-up teaches the response ``\\boxed{N}<eos>`` after the chat-templated prompt with its
image (teacher forcing, loss on response tokens only, label smoothing, AdamW). Prompts are
rendered by ``components.model.vision.VisionProcessor`` and every forward gets the M-RoPE
positions of ``components.model.vision.rope_index``, exactly as the pipeline's stages do. Label
smoothing leaves a little probability on every token but the vision tokens (``smoothed_loss``),
so sampling at temperature 1.0 is much worse than greedy decoding: the base's sampled pass@1 is
low (about 0.3) while its greedy accuracy is high (about 0.85), which gives GRPO room to improve
by sharpening the policy as well as by learning to count. Every
``--eval-every`` steps the policy is sampled (temperature 1.0) on a dev split held out of both
Parquet files (shown on the bar, kept in prepare.json). Warming runs ``--max-steps`` steps, the
same count on every machine. All of it is deterministic in ``--seed`` on one machine; it runs on
one thread (``threads``).

Outputs are built in a temporary directory next to ``--out`` and renamed into place; if they
already exist, nothing is done. Takes about a minute on 2 CPU cores::

    python -m examples.vision_count.prepare --out /tmp/vision-count [--seed 0]
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen2VLForConditionalGeneration

from components.model.hf_backend import cache_kwarg
from components.model.vision import VisionInputs, VisionProcessor, rope_index
from components.verify.math import compute_score
from examples.arithmetic.prepare import already_prepared, publish_demo
from examples.prepare_cli import prepare_main
from examples.vision_count.data import MAX_SHAPES, N_DEV, Problem, make_splits, write_table
from examples.vision_count.model import (
    HIDDEN_SIZE,
    NUM_HEADS,
    NUM_LAYERS,
    VISION_DEPTH,
    VISION_EMBED_DIM,
    build_image_processor,
    build_model,
    build_tokenizer,
    count_parameters,
    save_checkpoint,
)

#: The probability below which the warm-up pushes the vision tokens at response positions.
VISION_FLOOR = 1e-8


@dataclass
class VisionWarmup:
    """Settings of the data and the supervised warm-up (a fixed number of steps)."""

    seed: int = 0
    n_train: int = 8000
    n_eval: int = 200
    n_dev: int = N_DEV
    max_shapes: int = MAX_SHAPES
    hidden_size: int = HIDDEN_SIZE
    num_layers: int = NUM_LAYERS
    num_heads: int = NUM_HEADS
    vision_depth: int = VISION_DEPTH
    vision_embed_dim: int = VISION_EMBED_DIM
    lr: float = 3e-3
    batch_size: int = 64
    label_smoothing: float = 0.1
    max_steps: int = 600
    eval_every: int = 100
    dev_samples: int = 2
    eval_samples: int = 4
    """Samples per held-out (eval.parquet) problem for the base's figures in prepare.json."""
    max_new_tokens: int = 12
    threads: int = 1
    """CPU threads (at most the machine's): one, the same on every machine (see the arithmetic
    demo's prepare: a tiny model gains nothing from more)."""


def messages(problem: Problem) -> list[dict[str, str]]:
    """The verl prompt of a problem, as its Parquet row holds it."""
    return [{"role": "user", "content": problem.prompt_text}]


def response_text(problem: Problem) -> str:
    return f"\\boxed{{{problem.answer}}}"


def grade(texts: Sequence[str], problems: Sequence[Problem]) -> list[float]:
    # The same grader as the RL reward and the evaluation (the `math` verifier).
    return [compute_score(t, p.answer)["score"] for t, p in zip(texts, problems, strict=True)]


class Renderer:
    """Prompt token ids and pixel inputs as the pipeline makes them (``VisionProcessor``); a
    prompt's ids depend only on its text and its image's grid, so they are rendered once."""

    def __init__(self, processor: VisionProcessor) -> None:
        self.processor = processor
        self._ids: dict[str, list[int]] = {}

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.prompt_text not in self._ids:
            _, ids, _ = self.processor.render(messages(problem), [problem.image()])
            self._ids[problem.prompt_text] = ids
        return self._ids[problem.prompt_text]

    def pixels(self, problems: Sequence[Problem]) -> VisionInputs:
        return self.processor.pixels([p.image() for p in problems])


def encode_sft(
    tokenizer: PreTrainedTokenizerFast, renderer: Renderer, problems: Sequence[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + response + eos`` ids, attention mask and response-only labels."""
    rows: list[tuple[list[int], list[int]]] = []
    for p in problems:
        response = tokenizer.encode(response_text(p), add_special_tokens=False)
        rows.append((renderer.prompt_ids(p), response + [tokenizer.eos_token_id]))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        n = len(prompt) + len(response)
        ids[i, :n] = torch.tensor(prompt + response)
        mask[i, :n] = 1
        labels[i, len(prompt) : n] = torch.tensor(response)
    return ids, mask, labels


@torch.no_grad()
def sample(
    model: Qwen2VLForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    renderer: Renderer,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    seed: int,
    greedy: bool = False,
) -> list[str]:
    """One response per problem: greedy, or sampled at temperature 1.0 (no top-p/top-k).

    The prompts are left-padded and prefilled with ``rope_index``'s M-RoPE positions and the
    images' pixel values; every new token takes the row's last position + 1 in all three
    sections, as the generate stage's transformers backend decodes."""
    was_training = model.training
    model.eval()
    prompts = [renderer.prompt_ids(p) for p in problems]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    vision = renderer.pixels(problems)
    pos, _ = rope_index(model, ids, mask, vision)
    generator = torch.Generator().manual_seed(seed)
    kv = cache_kwarg(model)  # `cache` in transformers 5, `past_key_values` in 4.x
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        logits_to_keep=1,
        **vision.kwargs(),
    )
    cache, logits = getattr(out, kv), out.logits[:, -1]
    next_pos = pos[:, :, -1:] + 1  # [3, B, 1]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    new: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        if greedy:
            token = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float(), -1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        token = torch.where(done, torch.full_like(token, tokenizer.pad_token_id), token)
        new.append(token)
        done |= token == tokenizer.eos_token_id
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            use_cache=True,
            **{kv: cache},
        )
        cache, logits = getattr(out, kv), out.logits[:, -1]
        next_pos = next_pos + 1
    model.train(was_training)
    return tokenizer.batch_decode(torch.stack(new, dim=1), skip_special_tokens=True)


def pass_at_1(
    model: Qwen2VLForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    renderer: Renderer,
    problems: Sequence[Problem],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    greedy: bool = False,
    batch: int = 256,
) -> float:
    """Mean reward over ``samples`` temperature-1.0 samples (or one greedy answer) per problem."""
    repeated = [p for p in problems for _ in range(1 if greedy else samples)]
    texts: list[str] = []
    for k in range(0, len(repeated), batch):
        texts += sample(
            model,
            tokenizer,
            renderer,
            repeated[k : k + batch],
            max_new_tokens=max_new_tokens,
            seed=seed + k,
            greedy=greedy,
        )
    return sum(grade(texts, repeated)) / len(texts)


def smoothing_tokens(model: Qwen2VLForConditionalGeneration) -> torch.Tensor:
    """The tokens label smoothing spreads its mass over: all but the three vision tokens, which
    a response must never hold (see ``smoothed_loss``)."""
    keep = torch.ones(model.config.text_config.vocab_size, dtype=torch.bool)
    for name in ("image_token_id", "vision_start_token_id", "vision_end_token_id"):
        keep[int(getattr(model.config, name))] = False
    return keep


def smoothed_loss(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: float, spread: torch.Tensor
) -> torch.Tensor:
    """Token-mean cross-entropy (labels -100 ignored) against the label smoothed by
    ``smoothing`` over the ``spread`` tokens only, plus a hinge that pushes each of the other
    (vision) tokens' log-probability below ``log(VISION_FLOOR)``.

    The pipeline's sampler ends a response at an image pad or vision-start token, as at EOS (an
    image pad inside a response would break the teacher-forced forward: transformers raises
    "Image features and image tokens do not match"), so a base that samples them has responses
    cut short. With CrossEntropy's own smoothing each vision token would keep about 1/vocab of
    the mass: an image pad in about one temperature-1.0 response in a hundred; smoothing over the
    rest alone still left one in 4,000 (4 in 16,000 samples). The hinge's constant gradient
    drives them down to the floor (none in 16,000 samples)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    keep = labels != -100
    logp, target = logp[keep], labels[keep]
    nll = -logp.gather(-1, target[:, None]).squeeze(-1)
    uniform = -logp[:, spread].mean(-1)
    banned = torch.relu(logp[:, ~spread] - math.log(VISION_FLOOR)).sum(-1)
    return ((1.0 - smoothing) * nll + smoothing * uniform + banned).mean()


def warm_up(
    model: Qwen2VLForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    renderer: Renderer,
    train: Sequence[Problem],
    dev: Sequence[Problem],
    cfg: VisionWarmup,
) -> list[dict[str, float]]:
    """A fixed number of supervised steps; returns the loss and sampled dev pass@1 curve."""
    ids, mask, labels = encode_sft(tokenizer, renderer, train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    spread = smoothing_tokens(model)
    curve: list[dict[str, float]] = []
    model.train()
    bar = tqdm(total=cfg.max_steps, desc="warm-up", unit="step")
    for step in range(1, cfg.max_steps + 1):
        picked = rng.sample(range(len(train)), min(cfg.batch_size, len(train)))
        idx = torch.tensor(picked)
        width = int(mask[idx].sum(1).max())
        b_ids, b_mask = ids[idx, :width], mask[idx, :width]
        vision = renderer.pixels([train[i] for i in picked])
        pos, _ = rope_index(model, b_ids, b_mask, vision)
        logits = model(
            input_ids=b_ids, attention_mask=b_mask, position_ids=pos, **vision.kwargs()
        ).logits[:, :-1]
        loss = smoothed_loss(logits, labels[idx, 1:width], cfg.label_smoothing, spread)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.update()
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            acc = pass_at_1(
                model,
                tokenizer,
                renderer,
                dev,
                samples=cfg.dev_samples,
                max_new_tokens=cfg.max_new_tokens,
                seed=cfg.seed * 100_003 + step,
            )
            curve.append({"step": step, "loss": round(loss.item(), 4), "dev_sampled": acc})
            bar.set_postfix(loss=f"{loss.item():.3f}", dev_sampled=f"{acc:.3f}")
    bar.close()
    return curve


def prepare(out: Path, cfg: VisionWarmup) -> Path:
    """Write datasets and the warmed base policy under ``out`` (skipped if already there)."""
    out = Path(out)
    if already_prepared(out):
        return out
    torch.manual_seed(cfg.seed)
    started = time.time()
    splits = make_splits(
        seed=cfg.seed,
        n_train=cfg.n_train,
        n_eval=cfg.n_eval,
        n_dev=cfg.n_dev,
        max_shapes=cfg.max_shapes,
    )
    tokenizer = build_tokenizer()
    image_processor = build_image_processor()
    model = build_model(
        tokenizer,
        seed=cfg.seed,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        vision_depth=cfg.vision_depth,
        vision_embed_dim=cfg.vision_embed_dim,
    )
    renderer = Renderer(VisionProcessor(tokenizer, image_processor, model.config))
    print(f"policy: Qwen2-VL, {count_parameters(model):,} parameters, vocab {len(tokenizer)}")
    warm_started = time.time()
    curve = warm_up(model, tokenizer, renderer, splits["train"], splits["dev"], cfg)
    warm_seconds = round(time.time() - warm_started, 1)
    figures = {"steps": curve[-1]["step"], "dev_sampled": curve[-1]["dev_sampled"]}
    common = {"max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed}
    for split in ("dev", "eval"):
        problems = splits[split]
        figures[f"{split}_greedy"] = pass_at_1(
            model, tokenizer, renderer, problems, samples=1, greedy=True, **common
        )
    figures["eval_sampled"] = pass_at_1(
        model, tokenizer, renderer, splits["eval"], samples=cfg.eval_samples, **common
    )
    print(
        f"warm-up: {figures['steps']} steps in {warm_seconds:.0f}s; held-out pass@1 sampled "
        f"{figures['eval_sampled']:.3f} ({cfg.eval_samples} per problem), greedy "
        f"{figures['eval_greedy']:.3f} ({len(splits['eval'])} problems)"
    )

    summary = {
        "config": asdict(cfg),
        "parameters": count_parameters(model),
        "curve": curve,
        "base": figures,
        "warm_up_seconds": warm_seconds,
        "seconds": round(time.time() - started, 1),
    }

    return publish_demo(
        out,
        splits,
        write_table,
        lambda base: save_checkpoint(model, tokenizer, image_processor, base),
        summary,
        started,
    )


def main(argv: Sequence[str] | None = None, defaults: VisionWarmup | None = None) -> None:
    prepare_main(
        prepare,
        defaults or VisionWarmup(),
        description=__doc__.splitlines()[0],
        argv=argv,
        flags=("seed", "n_train", "n_eval", "n_dev", "max_steps", "eval_every", "batch_size")
        + ("lr", "label_smoothing"),
    )


if __name__ == "__main__":
    main()
