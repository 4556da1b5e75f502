"""The train section, checked before any work: every algorithm name, every option key against the
function it configures, and the whole objective run once on a tiny synthetic batch.

Running the objective (`build_targets` + `micro_batch_loss`, exactly as an iteration does) catches
what a name check cannot: a bad option value (a negative clip), an option of another estimator, a
combination that needs an input the config does not provide. Each problem names the config key
and lists what is valid.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import torch

from components.core.config import RunConfig
from components.core.errors import Problems
from components.train import algorithms as algos

_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']+)'")


def option_names(fn: Callable) -> list[str]:
    """The keyword-only parameters of an algorithm: its options."""
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def _check_name(problems: Problems, key: str, registry: algos.Registry, name: str) -> bool:
    if name in registry:
        return True
    problems.error(
        f"config train.{key}",
        f"unknown {registry.family} {name!r}",
        f"valid names: {', '.join(registry.names())}",
    )
    return False


def _check_options(
    problems: Problems, key: str, family: str, name: str, fn: Callable, options: dict
) -> bool:
    valid = option_names(fn)
    unknown = sorted(set(options) - set(valid))
    for k in unknown:
        problems.error(
            f"config train.{key}.{k}",
            f"is not an option of {family} {name!r}",
            f"its options: {', '.join(valid)}" if valid else f"{name!r} takes no options",
        )
    return not unknown


def _dummy_batch() -> dict[str, torch.Tensor]:
    """Two groups of two responses, three tokens each (one response shorter)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    lp = -torch.rand((4, 3), generator=g) - 0.1
    return {
        "rewards": torch.tensor([1.0, 0.0, 0.5, 1.0]),
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "mask": mask,
        "truncated": torch.tensor([False, False, False, True]),
        "old": lp,
        "new": (lp + 0.05 * torch.randn((4, 3), generator=g)).requires_grad_(),
        "rollout": lp - 0.02,
        "ref": lp - 0.1,
        "entropy": torch.rand((4, 3), generator=g),
    }


def check_train(cfg: RunConfig, problems: Problems) -> None:
    """Problems of the train section. Nothing is loaded (no model, no data), so it can run
    before any work."""
    t = cfg.train
    ok = _check_algorithms(cfg, problems)
    if t.loss_agg == "seq-mean-token-sum-norm" and not (
        t.loss_agg_horizon or cfg.generate.max_new_tokens
    ):
        problems.error("config train.loss_agg_horizon", "seq-mean-token-sum-norm needs a horizon")
    if t.old_logprobs == "rollout":
        _check_rollout_logprobs(cfg, problems)
    check_nodes(cfg, problems)
    if ok:
        _check_objective(cfg, problems)


def _check_algorithms(cfg: RunConfig, problems: Problems) -> bool:
    """Every algorithm name, and the options of the advantage estimator and the policy loss
    against their functions' parameters. Whether all of them are valid."""
    t = cfg.train
    ok = _check_name(problems, "advantage", algos.ADVANTAGES, t.advantage)
    ok &= _check_name(problems, "policy_loss", algos.POLICY_LOSSES, t.policy_loss)
    ok &= _check_name(problems, "loss_agg", algos.LOSS_AGGREGATIONS, t.loss_agg)
    if t.kl_coef > 0 or t.kl_metric:
        ok &= _check_name(problems, "kl_estimator", algos.KL_ESTIMATORS, t.kl_estimator)
    if t.advantage in algos.ADVANTAGES:
        fn = algos.get_advantage_fn(t.advantage)
        ok &= _check_options(
            problems,
            "advantage_options",
            "advantage estimator",
            t.advantage,
            fn,
            t.advantage_options,
        )
    if t.policy_loss in algos.POLICY_LOSSES:
        fn = algos.get_policy_loss_fn(t.policy_loss)
        ok &= _check_options(
            problems, "policy_loss_options", "policy loss", t.policy_loss, fn, t.policy_loss_options
        )
    return ok


def _check_rollout_logprobs(cfg: RunConfig, problems: Problems) -> None:
    """train.old_logprobs: rollout: the settings it cannot go with, a sampler whose logprobs are
    not defined as the trainer's, and a warning where they may differ from the trainer's."""
    t = cfg.train
    for setting, why in {
        "rollout_correction": "it compares the sampler's logprobs with the trainer's own; "
        "taken as the old ones, its weights would all be 1",
        "forking_top_rho": "it needs the entropy of the trainer's own no-grad pass",
    }.items():
        if getattr(t, setting) is not None:
            problems.error(
                "config train.old_logprobs",
                f"rollout cannot go with train.{setting}: {why}",
                "set it to recompute or auto",
            )
    if cfg.generate.backend != "transformers":
        problems.error(
            "config train.old_logprobs",
            f"rollout: the {cfg.generate.backend} sampler's logprobs are not defined as the "
            "trainer's",
            "set it to recompute or auto",
        )
    differs = _rollout_differences(cfg)
    if differs:
        problems.warn(
            "config train.old_logprobs",
            f"rollout with {', '.join(differs)}: the old logprobs are the sampler's, not the "
            "trainer's, so PPO's ratio is taken against the policy as the sampler evaluated "
            "it (verl's bypass mode); nothing checks how far apart the two are",
            "use auto to take them only where they are the trainer's, or recompute",
        )


def _rollout_differences(cfg: RunConfig) -> list[str]:
    """What makes the sampler's logprobs differ from the trainer's own in this config."""
    from components.model.checkpoint import device_and_dtype

    # as they resolve here (auto: bf16 on a GPU, fp32 on a CPU)
    sampler_dtype = device_and_dtype(cfg.generate.dtype)[1]
    trainer_dtype = device_and_dtype(cfg.train.dtype)[1]
    return [
        why
        for hit, why in [
            (cfg.model.lora is not None, "LoRA (generate merges the adapter)"),
            (bool(cfg.generate.tools or cfg.generate.environment), "tools"),
            (
                sampler_dtype != torch.float32,
                f"a {sampler_dtype} sampler".replace("torch.", ""),
            ),
            (trainer_dtype != torch.float32, "a bf16 trainer"),
            (cfg.train.max_staleness > 0, "stale rollouts"),
        ]
        if hit
    ]


def _check_objective(cfg: RunConfig, problems: Problems) -> None:
    """The objective once, as an iteration computes it, on a tiny batch: a bad option value or
    a combination that needs an input the config does not provide fails there."""
    from components.train.objective import build_targets, micro_batch_loss

    t = cfg.train
    b = _dummy_batch()
    try:
        targets = build_targets(
            t,
            rewards=b["rewards"],
            group_ids=b["group_ids"],
            response_mask=b["mask"],
            truncated=b["truncated"],
            old_logprobs=b["old"],
            rollout_logprobs=b["rollout"],
            ref_logprobs=b["ref"],
            entropy=b["entropy"],
        )
        loss, _ = micro_batch_loss(
            t,
            logprobs=b["new"],
            entropy=b["entropy"],
            old_logprobs=b["old"],
            advantages=targets.advantages,
            loss_mask=targets.loss_mask,
            is_weights=targets.is_weights,
            ref_logprobs=b["ref"],
            num_tokens=float(b["mask"].sum()),
            num_seqs=4.0,
            horizon=t.loss_agg_horizon or cfg.generate.max_new_tokens,
        )
        loss.backward()
        if not torch.isfinite(loss):
            raise ValueError(f"the loss of a test batch is {float(loss)}")
    except (TypeError, ValueError, KeyError) as e:
        problems.error(
            "config train",
            f"the objective fails on a test batch: {e}",
            "check the option values (docs/algorithms.md lists each one's range)",
        )


def check_nodes(cfg: RunConfig, problems: Problems) -> None:
    """A multi-node train step (train.nodes > 1) that cannot be placed, or that wastes it."""
    t, pool = cfg.train, cfg.cluster.stages["train"]
    if t.nodes <= 1:
        return
    if t.processes and pool.accelerator_count and t.processes > pool.accelerator_count:
        problems.error(
            "config train.processes",
            f"{t.processes} ranks per node, but a train node has "
            f"{pool.accelerator_count} GPUs (cluster.stages.train.accelerator_count)",
            "leave train.processes unset (one rank per GPU) or raise accelerator_count",
        )
    tj = cfg.cluster.train_job
    if tj.schedule_timeout_s and tj.schedule_timeout_s > tj.rendezvous_timeout_s:
        problems.warn(
            "config cluster.train_job.schedule_timeout_s",
            f"{tj.schedule_timeout_s:.0f} s is "
            f"longer than node 0 waits for the others ({tj.rendezvous_timeout_s} s): a node that "
            "never schedules fails the step at the rendezvous, without the scheduler's reason",
            "keep it at most cluster.train_job.rendezvous_timeout_s",
        )
    if t.zero_stage < 2:
        problems.warn(
            "config train.zero_stage",
            f"ZeRO-{t.zero_stage} on {t.nodes} nodes: every rank "
            "keeps its own copy of the gradients and Adam moments",
            "zero_stage 2 partitions them over the nodes' ranks, 3 the weights too",
        )


def check_lora(cfg: RunConfig, problems: Problems) -> None:
    """`model.lora`: PEFT installed, and a rank vLLM can serve (with the vLLM backend)."""
    lora = cfg.model.lora
    if lora is None:
        return
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        problems.error(
            "config model.lora",
            "needs peft, which is not installed",
            "pip install 'rlvr[lora]' (or peft>=0.14)",
        )
        return
    if cfg.generate.backend == "vllm":
        from components.model.vllm_backend import VLLM_MAX_LORA_RANKS

        if cfg.generate.dtype == "float32":
            problems.error(
                "config generate.dtype",
                "float32 with vLLM and model.lora: vLLM's LoRA kernels take bf16 or fp16 only",
                "use auto, bfloat16 or float16",
            )
        if lora.output_head:
            problems.warn(
                "config model.lora.output_head",
                "vLLM's support for LoRA on the output head differs between releases "
                "and is not tested here",
                "check it on your vLLM first, or leave output_head off",
            )
        if lora.rank > VLLM_MAX_LORA_RANKS[-1]:
            problems.error(
                "config model.lora.rank",
                f"{lora.rank} is past the largest rank vLLM serves ({VLLM_MAX_LORA_RANKS[-1]})",
                "lower it, or use generate.backend: transformers",
            )


def check_lora_targets(cfg: RunConfig, problems: Problems, model_config) -> None:
    """`model.lora.target_modules` against the base's config: PEFT attaches the adapter to a
    meta-device copy (nothing is allocated) and must find the layers it names."""
    import importlib.util

    lora = cfg.model.lora
    if lora is None or importlib.util.find_spec("peft") is None:
        return
    from components.model.adapter import adapter_parameter_count

    try:
        adapter, _ = adapter_parameter_count(model_config, lora)
    except (ValueError, TypeError) as e:  # PEFT: "Target modules {...} not found in the base"
        first = str(e).split(". ")[0].rstrip(".")  # PEFT adds "Please check ... try again."
        problems.error(
            "config model.lora.target_modules",
            f"does not fit the base: {first}",
            "name the base's linear layers (q_proj, v_proj, ...) or use all-linear",
        )
        return
    if adapter == 0:
        problems.error(
            "config model.lora.target_modules",
            "matches no layer of the base",
            "name the base's linear layers (q_proj, v_proj, ...) or use all-linear",
        )


def active_dropout(model_config) -> dict[str, float]:
    """The base's dropout and layerdrop settings above zero (`attention_dropout`, `layerdrop`,
    `resid_pdrop`, ...), in its config and any nested text config."""
    out: dict[str, float] = {}
    for config in (model_config, getattr(model_config, "text_config", None)):
        if config is None:
            continue
        for key, value in config.to_dict().items():
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if "drop" in key and numeric and value > 0:  # *dropout*, *pdrop, layerdrop
                out[key] = float(value)
    return out


def check_checkpointing(cfg: RunConfig, problems: Problems, model_config) -> None:
    """`train.gradient_checkpointing` turns the decoder layers' own training flag on; an
    architecture whose layers apply dropout or layerdrop under that flag (OPT, ...) would then
    train with them, and the gradients would no longer be those of the run without it."""
    if not cfg.train.gradient_checkpointing:
        return
    active = active_dropout(model_config)
    if active:
        shown = ", ".join(f"{k}={v:g}" for k, v in sorted(active.items()))
        problems.error(
            "config train.gradient_checkpointing",
            f"the base's config sets {shown}, which its layers may apply in training "
            "mode (the policy trains with dropout off)",
            "set them to 0 in the base's config.json, or leave checkpointing off",
        )
