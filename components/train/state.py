"""Train state between iterations: Adam moments, step counters and RNG, without pickle.

    train_state/<i>/optimizer.safetensors   exp_avg.<param>, exp_avg_sq.<param>, rng.torch
    train_state/<i>/state.json              step, fingerprint, hyperparameters

Moments are stored per parameter name in full (ZeRO partitions are gathered with DeepSpeed's
`safe_get_full_optimizer_state`), so a state written under one ZeRO stage or world size can be
restored under another. With it, N iterations run as N stage invocations train exactly like one
process taking N updates back to back.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from components.core.errors import UserError

STATE_VERSION = 1
MOMENTS = ("exp_avg", "exp_avg_sq")


class TrainStateError(UserError):
    """A train state that does not belong to this model or cannot be restored."""


def fingerprint(model: torch.nn.Module) -> str:
    """Architecture fingerprint: parameter names and shapes, and the model config's type."""
    h = hashlib.sha256(type(model).__name__.encode())
    for name, p in model.named_parameters():
        shape = tuple(getattr(p, "ds_shape", p.shape))
        h.update(f"{name}:{shape};".encode())
    return h.hexdigest()[:16]


def _zero_stage(engine) -> int:
    return int(engine.zero_optimization_stage())


def _base_optimizer(engine):
    opt = engine.optimizer
    return getattr(opt, "optimizer", opt)


def _holds_directly(engine, p: torch.nn.Parameter) -> bool:
    """Whether the torch optimizer keys its state on the model's own parameter (fp32 ZeRO-0).
    Otherwise (ZeRO 1-3, bf16's fp32 master copies) DeepSpeed maps it to its flat partitions."""
    opt = _base_optimizer(engine)
    return any(q is p for g in opt.param_groups for q in g["params"])


def collect(
    engine, step: int, extra: dict[str, Any], *, keep: bool = True
) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and JSON describing the optimizer state after `step` optimizer steps. Every rank
    calls it (gathering a partitioned moment is a collective); only a rank with `keep` (the one
    that writes it) holds the tensors, one parameter's moments gathered at a time."""
    from deepspeed.utils import safe_get_full_optimizer_state

    model = engine.module
    tensors: dict[str, torch.Tensor] = {}
    state = _base_optimizer(engine).state
    for name, p in model.named_parameters():
        if not p.requires_grad:  # a frozen base under a LoRA adapter has no optimizer state
            continue
        for key in MOMENTS:
            if _holds_directly(engine, p):
                value = state.get(p, {}).get(key)
            else:
                value = safe_get_full_optimizer_state(p, key)
            if value is not None and keep:
                tensors[f"{key}.{name}"] = value.detach().float().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {
        "state_version": STATE_VERSION,
        "step": step,
        "fingerprint": fingerprint(model),
        "zero_stage": _zero_stage(engine),
        **extra,
    }
    return tensors, meta


def restore(engine, tensors: dict[str, torch.Tensor], meta: dict[str, Any], source: str) -> int:
    """Load Adam moments and step into a fresh engine; returns the step count.

    Every trainable parameter must have both moments once `step > 0`: a state that silently
    restarted Adam would train differently from one continuous run."""
    from deepspeed.utils import safe_set_full_optimizer_state

    model = engine.module
    if meta.get("state_version") != STATE_VERSION:
        raise TrainStateError(
            f"{source}: state_version {meta.get('state_version')} is not supported"
        )
    if meta.get("fingerprint") != fingerprint(model):
        raise TrainStateError(
            f"{source}: the train state was written for a different architecture "
            f"(fingerprint {meta.get('fingerprint')} != {fingerprint(model)}); it does not belong "
            "to this checkpoint"
        )
    step = int(meta["step"])
    opt = _base_optimizer(engine)
    # ZeRO-1/2 link each parameter to its slice of the flat optimizer state lazily (at the first
    # step, or when DeepSpeed loads its own checkpoints); link now so the moments can be set.
    # The torch optimizer creates its state at the first step; create the zero moments it would
    # (on DeepSpeed's flat fp32 partitions too) so they can be overwritten with the saved ones.
    # ZeRO-3 keeps its fp32 flat partitions out of param_groups between steps; with a frozen
    # base (model.lora) their state is not created up front either.
    flats = list(getattr(engine.optimizer, "fp32_partitioned_groups_flat", []))
    for q in [*(q for g in opt.param_groups for q in g["params"]), *flats]:
        st = opt.state[q]
        for key in MOMENTS:
            st.setdefault(key, torch.zeros_like(q, memory_format=torch.preserve_format))
        st.setdefault("step", torch.tensor(0.0))
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        engine.optimizer._hp_optimizer_states_linked = False
        link()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        for key in MOMENTS:
            value = tensors.get(f"{key}.{name}")
            if value is None:
                if step > 0:
                    raise TrainStateError(
                        f"{source}: no {key} for parameter {name!r} after {step} steps; the "
                        "train state is incomplete (start a new run or restore a complete state)"
                    )
                continue
            if _holds_directly(engine, p):
                opt.state[p][key] = value.to(device=p.device, dtype=torch.float32).clone()
            else:
                safe_set_full_optimizer_state(p, value.to(torch.float32), key)
    # torch's Adam keeps a per-parameter step tensor; it drives bias correction.
    for st in opt.state.values():
        if "exp_avg" in st:
            st["step"] = torch.tensor(float(step), dtype=torch.float32)
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"].to(torch.uint8))
    return step


def dumps(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, indent=2, sort_keys=True).encode()


def read(state_dir, uri: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A committed train state's tensors and JSON; a damaged file is a TrainStateError naming
    it (never a library traceback)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from components.core.checkpoint import safetensors_problem

    tensors_path, meta_path = (
        Path(state_dir) / "optimizer.safetensors",
        Path(state_dir) / "state.json",
    )
    why = safetensors_problem(tensors_path) if tensors_path.exists() else "is missing"
    if why:
        raise TrainStateError(
            f"{uri}/optimizer.safetensors {why}; rerun the train stage of that "
            "iteration with --force"
        )
    try:
        tensors = load_file(str(tensors_path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise TrainStateError(f"{uri}/optimizer.safetensors cannot be read ({e})") from None
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict):
            raise ValueError("it is not a JSON object")
    except (OSError, ValueError) as e:
        raise TrainStateError(
            f"{uri}/state.json is not valid train state ({e}); rerun the train "
            "stage of that iteration with --force"
        ) from None
    return tensors, meta
