"""One iteration's policy-gradient updates on a DeepSpeed engine (the math of the train stage).

Read in this order: `train_iteration` (a `Trainer` on one `IterationWork`: old and reference
logprobs once, before any update, then `ppo_epochs` x `mini_batches` optimizer steps; each step
a method of `_Iteration`, in that order) -> `accumulate_mini_batch` (one mini-batch's
forward/backward over its micro-batches) -> `sequence_logprobs` (teacher-forced logprobs, the
same definition as generation).

Exactness: a mini-batch's loss is normalized by its GLOBAL token and sequence counts (summed over
micro-batches and data-parallel ranks), never per micro-batch, so one update's gradient does not
depend on the micro-batch size or the world size. DeepSpeed's own gradient-accumulation scaling is
off (`backward(scale_wrt_gas=False)`) and the accumulation boundary is set by hand. The LR is a
pure function of the global step over the whole run (batching.learning_rate).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from components.core.config import TrainSection
from components.core.errors import StageError
from components.train import algorithms as algos
from components.train.batching import (
    MicroBatch,
    Rollouts,
    collate,
    learning_rate,
    plan_micro_batches,
    shard_rows,
)
from components.train.distributed import all_reduce_max, all_reduce_sum_many, grad_norm
from components.train.inputs import RECOMPUTE, OldLogprobs, OldLogprobsChoice
from components.train.objective import (
    Targets,
    build_targets,
    micro_batch_loss,
    pad_rows,
    response_mask_of,
    rollout_mismatch,
)
from components.train.policy import eval_modes

log = logging.getLogger("rlvr.train")


#: How far (nats, max over tokens) the sampler's logprobs may be from the trainer's own for
#: train.old_logprobs: auto to take them: the logprob contract's bound, the one its tests
#: assert (docs/algorithms.md).
ROLLOUT_LOGPROB_TOLERANCE = 1e-4


def steps_per_iteration(t: TrainSection) -> int:
    return t.ppo_epochs * t.mini_batches


def sequence_logprobs(
    model,
    mb: MicroBatch,
    temperature: float,
    device: str,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probabilities of the response tokens.  # -> [b, L]

    Same definition as generation: log_softmax(logits / temperature) of each sampled token.
    Where the output projection is a plain linear layer held whole on this rank (`output_head`),
    the logits are computed from the final hidden states a chunk of response positions at a time
    (algos.logprobs_from_hidden): no [b, S, V] logits, which at a 49k vocabulary are most of the
    train step's memory. Otherwise (ZeRO-3's partitioned weights, a model that scales or caps
    its logits) the model's own logits.
    """
    idx = mb.response_index.to(device)
    tokens = mb.response_tokens.to(device)
    inputs = model_inputs(model, mb, device)
    head = output_head(model)
    if head is not None:
        decoder, weight = head
        captured: list[torch.Tensor] = []
        hook = decoder.register_forward_hook(
            lambda _m, _a, out: captured.append(
                out[0] if isinstance(out, tuple) else out.last_hidden_state
            )
        )
        try:
            # logits_to_keep=1: the model's own head computes the last position only, which
            # checks that its logits are hidden @ W^T (`head_matches`)
            out = model(**inputs, use_cache=False, logits_to_keep=1)
        finally:
            hook.remove()
        hidden = captured[-1]
        if head_matches(out.logits[:, -1], hidden[:, -1], weight):
            hidden = hidden.gather(1, idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            return algos.logprobs_from_hidden(
                hidden,
                weight,
                tokens,
                temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                chunk_tokens=head_chunk_tokens(weight.shape[0]),
            )
        # a transform of the logits that no config attribute names: the model's own logits
        del out, hidden, captured
    out = model(**inputs, use_cache=False)
    logits = out.logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, out.logits.shape[-1]))
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    lp = algos.logprobs_from_logits(logits, tokens)
    ent = None
    if with_entropy:
        ent = algos.entropy_from_logits(logits if entropy_grad else logits.detach())
    return lp, ent


def model_inputs(model, mb: MicroBatch, device: str) -> dict[str, Any]:
    """The forward's inputs of a micro-batch: token ids and mask; with image prompts also their
    pixel values and grids, and M-RoPE positions computed as the sampler computed them
    (components/model/vision.py), so teacher forcing sees what the sampler saw. An image
    placeholder token the policy sampled ends its response (the sampler stops there), so it is
    only ever a response's last token, read by nothing scored: it goes in as padding, or the
    model would take it for an image's place."""
    ids = mb.input_ids
    if mb.vision is None:
        return {"input_ids": ids.to(device), "attention_mask": mb.attention_mask.to(device)}
    from components.model.vision import placeholder_ids, rope_index

    in_response = torch.arange(ids.shape[1])[None, :] >= mb.prompt_lengths[:, None]
    sampled = torch.isin(ids, torch.tensor(sorted(placeholder_ids(model)))) & in_response
    if bool(sampled.any()):
        ids = ids.masked_fill(sampled, 0)  # the attention mask keeps it; nothing reads it
    inputs = {"input_ids": ids.to(device), "attention_mask": mb.attention_mask.to(device)}
    dtype = next(p for p in model.parameters()).dtype
    inputs.update(mb.vision.kwargs(device, dtype))
    inputs["position_ids"] = rope_index(
        model, inputs["input_ids"], inputs["attention_mask"], mb.vision
    )[0]
    return inputs


HEAD_CHUNK_ELEMENTS = 1 << 24
"""Logit elements per chunk of `logprobs_from_hidden` (64 MB in float32): 341 positions at a
49k vocabulary; at a small vocabulary every position in one chunk."""

LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier",
    "lm_head_multiplier",
)
"""Config attributes of models whose logits are not just the projection of the last hidden
state (Gemma 2's soft cap, Cohere's, Granite's and HyperCLOVA X's scales, Falcon-H1's head
multiplier), on the config or its text config: they keep the model's own logits."""


def head_chunk_tokens(vocab: int) -> int:
    return max(16, HEAD_CHUNK_ELEMENTS // max(vocab, 1))


def head_matches(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the model's own logits at one position per row equal ``hidden @ weight.T`` within
    rounding (a bf16 logit of magnitude m rounds by m/256): a model whose forward scales, caps
    or shifts its logits in a way `LOGIT_TRANSFORMS` does not name, or whose decoder output is
    not what its head reads, fails it.  # logits [b, V], hidden [b, H], weight [V, H]"""
    with torch.no_grad():
        own = logits.float()
        mine = torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()
        return bool((mine - own).abs().max() <= 1e-2 * (1.0 + own.abs().max()))


def output_head(model) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(decoder whose output is the final hidden state, output projection weight [V, H]) where
    logits are exactly `hidden @ weight.T`, else None. The model may be a DeepSpeed engine or a
    PEFT wrapper; ZeRO-3's partitioned weights are not whole here, so those use the logits."""
    import inspect

    inner = getattr(model, "module", model)  # a DeepSpeed engine's model
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    get_decoder = getattr(base, "get_decoder", None)
    get_head = getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    head = get_head()
    config = getattr(base, "config", None)
    if (
        type(head) is not torch.nn.Linear
        or head.bias is not None
        or hasattr(head.weight, "ds_id")  # ZeRO-3
        or any(
            getattr(c, a, None) not in (None, 1, 1.0)
            for c in (config, getattr(config, "text_config", None))
            for a in LOGIT_TRANSFORMS
        )
        or "logits_to_keep" not in inspect.signature(type(base).forward).parameters
    ):
        return None
    decoder = get_decoder()
    if decoder is None:  # transformers 4.56: the base model's own get_decoder() gives None
        decoder = getattr(base, "model", None)
    return (decoder, head.weight) if isinstance(decoder, torch.nn.Module) else None


@torch.no_grad()
def no_grad_pass(
    model,
    ro: Rollouts,
    budget: int,
    temperature: float,
    pad_id: int,
    device: str,
    entropy: bool,
    only: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropy) of every rollout under `model`, before any update (`only`: of
    those rows; the others stay 0).  # [N, L]"""
    n, L = len(ro), max(max((len(r) for r in ro.response_tokens), default=1), 1)
    lp_all = torch.zeros((n, L), dtype=torch.float32)
    ent_all = torch.zeros((n, L), dtype=torch.float32) if entropy else None
    with eval_modes(model):
        for rows in plan_micro_batches(
            ro.lengths(), list(range(n)) if only is None else only, budget
        ):
            mb = collate(ro, rows, pad_id)
            lp, ent = sequence_logprobs(model, mb, temperature, device, with_entropy=entropy)
            lp_all[rows, : lp.shape[1]] = lp.float().cpu()
            if ent_all is not None and ent is not None:
                ent_all[rows, : ent.shape[1]] = ent.float().cpu()
    return lp_all, ent_all


def accumulate_mini_batch(
    engine,
    ro: Rollouts,
    plan: list[list[int]],
    targets: Targets,
    old_lp: torch.Tensor,
    ref_lp: torch.Tensor | None,
    t: TrainSection,
    *,
    num_tokens: int,
    num_seqs: int,
    horizon: int,
    temperature: float,
    pad_id: int,
    device: str,
    world: int = 1,
) -> tuple[dict[str, float], int, int]:
    """Forward/backward every micro-batch of one mini-batch; gradients accumulate, no step.

    `num_tokens` / `num_seqs` are the GLOBAL counts of the whole mini-batch (all ranks), so the
    accumulated gradient equals the full mini-batch's, whatever the micro-batch plan.
    Returns (metric sums, real tokens, padded tokens).
    """
    sums: dict[str, float] = {}
    real_tokens = padded_tokens = 0
    for k, entry in enumerate(plan):
        engine.set_gradient_accumulation_boundary(k == len(plan) - 1)
        # An empty entry pads this rank's plan to the longest rank's: ZeRO-2/3 run collectives in
        # every forward/backward, so all ranks must take the same number of micro-batches. The
        # dummy runs a real engine forward on row 0 with an empty loss mask (zero loss, zero
        # gradient, the same metric keys).
        dummy = not entry
        rows = [0] if dummy else entry
        mb = collate(ro, rows, pad_id)
        # Through the engine, not engine.module: ZeRO-3 advances its gradient-accumulation step
        # in engine.forward; bypassing it makes every micro-batch overwrite the last one's grads.
        lp, ent = sequence_logprobs(
            engine, mb, temperature, device, with_entropy=True, entropy_grad=t.entropy_coef > 0
        )
        Lb = lp.shape[1]

        def take(x: torch.Tensor | None, rows=rows, Lb=Lb) -> torch.Tensor | None:
            return None if x is None else x[rows, :Lb].to(device)

        mask = take(targets.loss_mask)
        if dummy:
            mask = torch.zeros_like(mask)
        loss, metrics = micro_batch_loss(
            t,
            logprobs=lp,
            entropy=ent,
            old_logprobs=take(old_lp),
            advantages=take(targets.advantages),
            loss_mask=mask,
            is_weights=take(targets.is_weights),
            ref_logprobs=take(ref_lp),
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            horizon=horizon,
        )
        # DeepSpeed averages gradients over ranks; the loss is already a global sum.
        engine.backward(loss * world, scale_wrt_gas=False)
        with torch.no_grad():
            for key, val in metrics.items():
                if key.startswith("_"):  # scalar parts of the loss: already global shares
                    v = float(val)
                    key = key[1:]
                else:  # per-token metrics: token mean over the mini-batch
                    v = float(
                        algos.aggregate_loss(val.float(), mask, "token-mean", num_tokens=num_tokens)
                    )
                sums[f"train/{key}"] = sums.get(f"train/{key}", 0.0) + v
            sums["train/loss"] = sums.get("train/loss", 0.0) + float(loss)
        if not dummy:
            real_tokens += mb.real_tokens
            padded_tokens += mb.padded_tokens
    return sums, real_tokens, padded_tokens


@dataclass(frozen=True)
class Trainer:
    """What trains: the DeepSpeed engine, where it runs, and the frozen reference model where a
    KL term needs one."""

    engine: Any
    device: str
    pad_id: int
    rank: int = 0
    world: int = 1
    ref_model: Any = None


@dataclass(frozen=True)
class IterationWork:
    """What one iteration trains on, and where it sits in the run's schedule."""

    rollouts: Rollouts
    iteration: int
    temperature: float
    """The sampler's temperature: logprobs are those of logits / temperature."""
    horizon: int
    """The loss aggregation's horizon (train.loss_agg_horizon, else generate.max_new_tokens)."""
    start_step: int
    """The global optimizer step the iteration starts at."""
    total_steps: int
    """The run's optimizer steps in all (the LR schedule spans them)."""
    seed: int
    """The run's seed: with the iteration, it draws each epoch's permutation of the rollouts."""
    old_logprobs: OldLogprobsChoice = RECOMPUTE
    """Where PPO's old logprobs come from (components/train/inputs.py)."""
    compare_rollout: bool = False
    """The rollouts' logprobs are defined as the trainer's: the metrics measure the mismatch."""


@dataclass(frozen=True)
class OldPass:
    """PPO's old logprobs for one iteration, and where they came from in the end."""

    logprobs: torch.Tensor  # [B, L]
    entropy: torch.Tensor | None  # [B, L]: where forking tokens need it
    source: OldLogprobs
    checked: dict[str, float] = field(default_factory=dict)
    """The sampler check's mismatch metrics (auto's check on one micro-batch); else empty."""


def train_iteration(
    trainer: Trainer, work: IterationWork, t: TrainSection
) -> tuple[int, dict[str, float]]:
    """One iteration's updates. Returns the new global step and the metrics. With
    `work.compare_rollout` (the rollouts' logprobs are defined as the trainer's), the metrics
    include the sampler-trainer mismatch before any update (objective.rollout_mismatch). The
    old logprobs come from `work.old_logprobs` (`_Iteration.old_logprobs`)."""
    it = _Iteration(trainer, work, t)
    ro = work.rollouts
    resp_mask = response_mask_of([len(r) for r in ro.response_tokens], ro.sampled)
    rollout_lp = pad_rows(ro.rollout_logprobs, resp_mask.shape[1])

    # No-grad passes, once, with the weights before any update.
    old = it.old_logprobs(resp_mask, rollout_lp)
    ref_lp = it.reference_logprobs(trainer.ref_model)
    targets = it.targets(resp_mask, old.logprobs, rollout_lp, ref_lp, old.entropy)
    if work.compare_rollout and old.source is OldLogprobs.RECOMPUTE:
        targets.metrics.update(rollout_mismatch(old.logprobs, rollout_lp, resp_mask))
    else:
        targets.metrics.update(old.checked)
    targets.metrics["train/old_logprobs_from_rollout"] = float(old.source is OldLogprobs.ROLLOUT)

    t0 = time.perf_counter()
    tally = it.updates(targets, old.logprobs, ref_lp)
    elapsed = time.perf_counter() - t0
    return tally.step, it.metrics(tally, targets, elapsed)


@dataclass
class _Tally:
    """What one iteration's optimizer steps add up, on this rank: metric sums, token counts, the
    gradient norm of each step, and the global step and learning rate reached."""

    step: int
    lr: float
    sums: dict[str, float] = field(default_factory=dict)
    real_tokens: int = 0
    padded_tokens: int = 0
    grad_norms: list[float] = field(default_factory=list)
    silent_steps: int = 0
    """Steps taken at learning rate 0: no signal in their mini-batch (skip_no_signal_steps)."""


@dataclass
class _Iteration:
    """The steps of `train_iteration`, in its order, over what they all read: the engine, the
    rollouts, the train section and the iteration's settings."""

    trainer: Trainer
    work: IterationWork
    t: TrainSection
    lengths: list[int] = field(init=False)  # prompt + response tokens of each rollout

    def __post_init__(self) -> None:
        self.lengths = self.work.rollouts.lengths()

    def no_grad(
        self, model, entropy: bool, only: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return no_grad_pass(
            model,
            self.work.rollouts,
            self.t.micro_batch_tokens,
            self.work.temperature,
            self.trainer.pad_id,
            self.trainer.device,
            entropy,
            only,
        )

    def old_logprobs(self, resp_mask: torch.Tensor, rollout_lp: torch.Tensor) -> OldPass:
        """The iteration's old logprobs, from the source decided for it: the trainer's own
        no-grad pass, the sampler's as recorded, or the sampler's checked first (auto)."""
        choice = self.work.old_logprobs
        if choice.source is OldLogprobs.RECOMPUTE:
            return self.recomputed()
        if self.t.forking_top_rho is not None:
            raise StageError("train.forking_top_rho needs the trainer's own no-grad pass")
        if choice.check:
            return self.checked_rollout(resp_mask, rollout_lp)
        return OldPass(rollout_lp, None, OldLogprobs.ROLLOUT)

    def recomputed(self, checked: dict[str, float] | None = None) -> OldPass:
        """The trainer's own no-grad pass over every rollout (with entropy where forking tokens
        need it); `checked`: what the sampler check measured before it gave up on them."""
        lp, ent = self.no_grad(self.trainer.engine.module, self.t.forking_top_rho is not None)
        return OldPass(lp, ent, OldLogprobs.RECOMPUTE, checked or {})

    def checked_rollout(self, resp_mask: torch.Tensor, rollout_lp: torch.Tensor) -> OldPass:
        """The sampler's logprobs, checked against the trainer's own pass on one micro-batch:
        taken within ROLLOUT_LOGPROB_TOLERANCE; recomputed over every rollout past it, or when
        the micro-batch had no sampled token to compare; the pass itself where the micro-batch
        was every rollout."""
        n = len(self.work.rollouts)
        plan = (
            plan_micro_batches(self.lengths, list(range(n)), self.t.micro_batch_tokens) if n else []
        )
        if not plan:
            return OldPass(rollout_lp, None, OldLogprobs.ROLLOUT)
        sample = plan[0]
        own, _ = self.no_grad(self.trainer.engine.module, False, sample)
        checked = rollout_mismatch(own[sample], rollout_lp[sample], resp_mask[sample])
        worst = all_reduce_max(checked["train/rollout_lp_diff_max"])  # every rank alike
        # every rank holds every row: whether the sample had a sampled token is shared
        unchecked = not bool(resp_mask[sample].any())
        if len(plan) == 1 and not unchecked:  # the sample was every row: the pass itself
            return OldPass(own, None, OldLogprobs.RECOMPUTE, checked)
        if unchecked or not worst <= ROLLOUT_LOGPROB_TOLERANCE:  # NaN included
            log.warning(
                "train %05d: the sampler's logprobs are %s the trainer's on one "
                "micro-batch (tolerance %.0e): recomputing the old logprobs "
                "(train.old_logprobs)",
                self.work.iteration,
                "unchecked against (no sampled token)" if unchecked else f"{worst:.2g} from",
                ROLLOUT_LOGPROB_TOLERANCE,
            )
            return self.recomputed(checked)
        return OldPass(rollout_lp, None, OldLogprobs.ROLLOUT, checked)

    def reference_logprobs(self, ref_model) -> torch.Tensor | None:
        """The reference model's logprobs, where a KL penalty or metric needs them."""
        if not (self.t.kl_coef > 0 or self.t.kl_metric):
            return None
        if ref_model is None:
            raise StageError("train.kl_coef > 0 (or kl_metric) needs the reference model")
        ref_lp, _ = self.no_grad(ref_model, False)
        return ref_lp

    def targets(
        self,
        resp_mask: torch.Tensor,
        old_lp: torch.Tensor,
        rollout_lp: torch.Tensor,
        ref_lp: torch.Tensor | None,
        old_ent: torch.Tensor | None,
    ) -> Targets:
        ro, t = self.work.rollouts, self.t
        return build_targets(
            t,
            rewards=torch.tensor(ro.rewards, dtype=torch.float32),
            group_ids=ro.group_ids(),
            response_mask=resp_mask,
            truncated=torch.tensor(ro.truncated, dtype=torch.bool),
            old_logprobs=old_lp,
            rollout_logprobs=rollout_lp,
            ref_logprobs=ref_lp,
            entropy=old_ent,
            void=torch.from_numpy(ro.void(t.answer_pattern)) if t.void_turn_filter else None,
        )

    def updates(
        self,
        targets: Targets,
        old_lp: torch.Tensor,
        ref_lp: torch.Tensor | None,
    ) -> _Tally:
        """`ppo_epochs` x `mini_batches` optimizer steps, each epoch over a fresh permutation of
        the rollouts (seeded by run seed and iteration, so every rank draws the same)."""
        t = self.t
        usable = (targets.keep & targets.loss_mask.any(dim=1)).tolist()
        rng = np.random.default_rng([self.work.seed, self.work.iteration])
        tally = _Tally(step=self.work.start_step, lr=t.lr)
        bar = tqdm(
            total=steps_per_iteration(t),
            desc=f"train {self.work.iteration:05d}",
            unit="step",
            disable=self.trainer.rank != 0,
        )
        for _epoch in range(t.ppo_epochs):
            perm = rng.permutation(len(self.work.rollouts)).tolist()
            for mini in np.array_split(np.asarray(perm, dtype=np.int64), t.mini_batches):
                mini_rows = [int(r) for r in mini if usable[int(r)]]
                self.update(tally, mini_rows, targets, old_lp, ref_lp)
                bar.update(1)
        bar.close()
        return tally

    def micro_batches(self, mini_rows: list[int]) -> list[list[int]]:
        """This rank's share of a mini-batch, planned into micro-batches, padded with empty ones
        so that every rank takes as many as the busiest (at least one)."""
        my_rows = shard_rows(mini_rows, self.trainer.rank, self.trainer.world)
        plan: list[list[int]] = (
            plan_micro_batches(self.lengths, my_rows, self.t.micro_batch_tokens) if my_rows else []
        )
        plan += [[]] * (max(int(all_reduce_max(len(plan))), 1) - len(plan))
        return plan

    def update(
        self,
        tally: _Tally,
        mini_rows: list[int],
        targets: Targets,
        old_lp: torch.Tensor,
        ref_lp: torch.Tensor | None,
    ) -> None:
        """One optimizer step on the mini-batch `mini_rows` (global row indices), into `tally`."""
        t, engine = self.t, self.trainer.engine
        num_tokens = int(targets.loss_mask[mini_rows].sum()) if mini_rows else 0
        plan = self.micro_batches(mini_rows)
        tally.lr = learning_rate(
            tally.step,
            base_lr=t.lr,
            warmup_steps=t.warmup_steps,
            total_steps=self.work.total_steps,
            schedule=t.lr_schedule,
            min_lr_ratio=t.min_lr_ratio,
        )
        silent = t.skip_no_signal_steps and self.no_signal(mini_rows, targets)
        tally.silent_steps += silent
        for group in engine.optimizer.param_groups:
            group["lr"] = 0.0 if silent else tally.lr
        part, real, padded = accumulate_mini_batch(
            engine,
            self.work.rollouts,
            plan,
            targets,
            old_lp,
            ref_lp,
            t,
            num_tokens=num_tokens,
            num_seqs=len(mini_rows),
            horizon=self.work.horizon,
            temperature=self.work.temperature,
            pad_id=self.trainer.pad_id,
            device=self.trainer.device,
            world=self.trainer.world,
        )
        for key, val in part.items():
            tally.sums[key] = tally.sums.get(key, 0.0) + val
        tally.real_tokens += real
        tally.padded_tokens += padded
        pre_clip_norm = grad_norm(engine)
        engine.step()
        gn = engine.get_global_grad_norm() if pre_clip_norm is None else pre_clip_norm
        tally.grad_norms.append(float(gn) if gn is not None else float("nan"))
        tally.step += 1

    def no_signal(self, mini_rows: list[int], targets: Targets) -> bool:
        """Whether the mini-batch gives the loss nothing to learn from: every advantage of its
        loss tokens is zero and no KL or entropy term pulls (the same on every rank: the rows
        are global)."""
        if self.t.kl_coef > 0 or self.t.entropy_coef > 0:
            return False
        if not mini_rows:
            return True
        adv = targets.advantages[mini_rows] * targets.loss_mask[mini_rows]
        return not bool(adv.abs().gt(0).any())

    def metrics(self, tally: _Tally, targets: Targets, elapsed: float) -> dict[str, float]:
        """The iteration's metrics: the steps' sums over all ranks, averaged over the steps, then
        the targets' metrics and the iteration's totals."""
        n_updates = steps_per_iteration(self.t)
        # the same keys on every rank: dummy micro-batches report them too
        keys = sorted(tally.sums)
        totals = all_reduce_sum_many(
            [tally.sums[k] for k in keys] + [float(tally.real_tokens), float(tally.padded_tokens)]
        )
        metrics_out = {k: v / n_updates for k, v in zip(keys, totals[: len(keys)], strict=True)}
        real_tokens, padded_tokens = int(totals[-2]), int(totals[-1])
        metrics_out.update(targets.metrics)
        metrics_out.update(
            {
                "train/grad_norm": float(np.nanmean(tally.grad_norms)) if tally.grad_norms else 0.0,
                "train/lr": tally.lr,
                "train/tokens_per_s": real_tokens / elapsed if elapsed > 0 else 0.0,
                "train/world_size": float(self.trainer.world),
                "train/padding_waste": 1.0 - real_tokens / padded_tokens if padded_tokens else 0.0,
                "train/steps": float(n_updates),
                "train/global_step": float(tally.step),
                "train/no_signal_steps": float(tally.silent_steps),
            }
        )
        return metrics_out
