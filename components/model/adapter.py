"""LoRA adapters as checkpoints: PEFT's format, tied to their base by a content digest.

An adapter checkpoint is a directory that `peft.PeftModel.from_pretrained(base, path)` loads:

    adapter_config.json          PEFT's LoraConfig
    adapter_model.safetensors    the adapter's weights (lora_A / lora_B of each target module)
    rlvr_base.json               {"base_digest": ...}: which base the adapter was trained on

`base_digest` is a digest of the base's weight files and config (their names, sizes and sha256),
so an adapter applied to another base is refused with a message that names both digests, instead
of silently producing another model. `merge` writes a full HF checkpoint (base + adapter folded
in) for serving without PEFT.

Used by the train stage (save), generate and evaluate (load) and `rlvr export --merge`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from components.core.commit import sha256_file
from components.core.config import LoraSection
from components.core.errors import UserError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "BASE_FILE",
    "AdapterError",
    "adapter_parameter_count",
    "attach",
    "base_digest",
    "check_base",
    "finish_adapter_dir",
    "is_adapter_dir",
    "load_adapter",
    "lora_config",
    "merge",
    "save_adapter",
    "load_adapter_weights",
    "set_adapter_weights",
    "write_adapter",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "rlvr_base.json"
_BASE_FILES = ("config.json",)  # with every *.safetensors


class AdapterError(UserError):
    """An adapter that cannot be used: wrong base, missing files; the message says what to do."""


def base_digest(base_dir: Path, manifest: dict[str, Any] | None = None) -> str:
    """Digest of a base checkpoint's weights and config: from its `_SUCCESS` manifest's sha256s
    when given (no file is read again), else by hashing the files."""
    base_dir = Path(base_dir)
    names = sorted(p.name for p in base_dir.glob("*.safetensors")) + [
        n for n in _BASE_FILES if (base_dir / n).is_file()
    ]
    if not names:
        raise AdapterError(f"{base_dir} holds no *.safetensors: it is not a base checkpoint")
    known = {f["path"]: f["sha256"] for f in (manifest or {}).get("files", [])}
    entries = []
    for name in sorted(names):
        digest = known.get(name) or sha256_file(base_dir / name)
        entries.append((name, digest))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


def lora_config(section: LoraSection, model=None):
    """PEFT's LoraConfig for `model.lora`. `all-linear` is PEFT's: every linear layer but the
    output head; with `output_head` the head is adapted too, so the targets are named from
    `model`'s own linear layers (the head included)."""
    import torch
    from peft import LoraConfig

    targets = section.target_modules
    targets = targets if isinstance(targets, str) else list(targets)
    if section.output_head:
        if model is None:
            raise ValueError("model.lora.output_head needs the model to name its linear layers")
        head = _output_head_name(model)
        if targets == "all-linear":
            from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

            linear = (torch.nn.Linear, Conv1D)
            targets = sorted(
                {
                    n.rsplit(".", 1)[-1]
                    for n, m in model.named_modules()
                    if isinstance(m, linear) and n != head
                }
            )
        if _leaf(head) not in targets:
            targets = [*targets, _leaf(head)]
    extra = {}
    if model is not None and not section.vision_tower:
        from components.model.vision import is_vision_config

        if is_vision_config(model.config):  # the language model only (model.lora.vision_tower)
            extra["exclude_modules"] = r".*\bvisual\b.*"
    return LoraConfig(
        r=section.rank,
        lora_alpha=section.alpha,
        lora_dropout=section.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        **extra,
    )


def _untie_output_head(model) -> bool:
    """Give a tied output head its own copy of the weights (and the config
    `tie_word_embeddings: false`); True if it was tied."""
    import torch

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return False
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "tie_word_embeddings"):
            config.tie_word_embeddings = False
    return True


def _leaf(name: str) -> str:
    """A module's own name, as PEFT's target_modules names it (`lm_head`, `q_proj`)."""
    return name.rsplit(".", 1)[-1]


def _output_head_name(model) -> str:
    """The qualified name of the model's output projection (`lm_head` for HF causal LMs)."""
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if head is not None and module is head:
            return name
    raise AdapterError(
        f"{type(model).__name__} has no output head to adapt (model.lora.output_head); "
        "set model.lora.output_head: false for this model"
    )


def attach(model, section: LoraSection):
    """The base `model` wrapped with a fresh adapter (B = 0: the same function as the base);
    only the adapter's parameters require grad."""
    from peft import get_peft_model

    with _tied_head_is_handled():
        return get_peft_model(model, lora_config(section, model))


@contextlib.contextmanager
def _tied_head_is_handled():
    """PEFT warns when an adapted output head is tied to the input embeddings, for merges and
    conversions that would fold the head's delta into both; `merge` unties the head first and
    nothing else merges, so the warning is silenced here and nowhere else."""
    with warnings.catch_warnings():
        # "Model has `tie_word_embeddings=True`..." (peft 0.21), "Model with ..." (0.17)
        warnings.filterwarnings("ignore", message=r"Model (has|with) `tie_word_embeddings=True`")
        yield


def adapter_parameter_count(model_config, section: LoraSection) -> tuple[int, int]:
    """(adapter parameters, base parameters) of a model config, counted on the meta device (no
    weight is allocated), e.g. for a 7B shape on a laptop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from components.model.vision import is_vision_config

    auto = AutoModelForImageTextToText if is_vision_config(model_config) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(model_config)
    base = sum(p.numel() for p in model.parameters())
    peft_model = attach(model, section)
    adapter = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return adapter, base


def is_adapter_dir(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def save_adapter(peft_model, out_dir: Path, digest: str, base: str | None = None) -> list[Path]:
    """Write the adapter of `peft_model` (PEFT's files, safetensors) and the base it belongs to
    (`base`: where that base lives, recorded in adapter_config.json)."""
    from peft import get_peft_model_state_dict

    weights = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    weights = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    return write_adapter(peft_model, weights, out_dir, digest, base)


def write_adapter(
    peft_model, weights: dict, out_dir: Path, digest: str, base: str | None
) -> list[Path]:
    """An adapter directory from `weights` (PEFT's saved key names: the adapter name stripped)
    and `peft_model`'s config, written directly rather than through `PeftModel.save_pretrained`,
    which filters a given state dict again and, in the peft the images pin (0.17), drops every
    key of one already filtered: the adapter would be saved empty."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not weights:
        raise AdapterError(f"{out_dir}: no adapter weights to save (model.lora targets nothing?)")
    save_file(weights, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    peft_model.peft_config["default"].save_pretrained(str(out_dir))
    finish_adapter_dir(out_dir, digest, base)
    return [out_dir / ADAPTER_CONFIG, out_dir / ADAPTER_WEIGHTS, out_dir / BASE_FILE]


def set_adapter_weights(peft_model, weights: dict, where: str) -> None:
    """Load an adapter's saved weights into `peft_model`'s adapter, refusing a file that does not
    hold exactly its tensors (an empty one, another rank or other target modules) instead of
    leaving some of the adapter at its fresh initialisation."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    expected = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = sorted(
        k
        for k in set(expected) & set(weights)
        if tuple(expected[k].shape) != tuple(weights[k].shape)
    )
    if missing or unexpected or shapes:
        what = (
            f"{len(missing)} missing (e.g. {missing[:2]})"
            if missing
            else f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
            if unexpected
            else f"other shapes for {shapes[:2]}"
        )
        raise AdapterError(
            f"{where}: the adapter's weights do not fit model.lora: {what}; model.lora (rank, "
            "target_modules or output_head) must stay as the run started: start a new run to "
            "change it"
        )
    set_peft_model_state_dict(peft_model, weights)


def finish_adapter_dir(out_dir: Path, digest: str, base: str | None) -> None:
    """Tie an adapter directory PEFT just wrote to its base (`rlvr_base.json`) and make its
    config the same bytes wherever it is written: PEFT records the local path the base was
    loaded from (a cache or container path; here `base`, the base's URI in the run, or null)
    and writes target modules in set order, which changes with each process's hash seed. A
    checkpoint's bytes decide what downstream stages rerun, so they must not."""
    path = Path(out_dir) / ADAPTER_CONFIG
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    config["inference_mode"] = True  # as PEFT saves it: loading decides whether it trains
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (Path(out_dir) / BASE_FILE).write_text(json.dumps({"base_digest": digest}) + "\n")


def check_base(adapter_dir: Path, digest: str) -> None:
    """Refuse an adapter trained on another base than the one of `digest`."""
    adapter_dir = Path(adapter_dir)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE):
        if not (adapter_dir / name).is_file():
            raise AdapterError(
                f"{adapter_dir} has no {name}: it is not an rlvr adapter checkpoint (a PEFT "
                f"adapter with {BASE_FILE} naming its base); save it again from the train stage"
            )
    try:
        recorded = json.loads((adapter_dir / BASE_FILE).read_text())["base_digest"]
    except (ValueError, KeyError) as e:
        raise AdapterError(
            f"{adapter_dir / BASE_FILE} is unreadable ({e}); save it again"
        ) from None
    if recorded != digest:
        raise AdapterError(
            f"{adapter_dir} was trained on the base with digest {recorded}, not on this base "
            f"({digest}): apply it to the base it was trained on (the run's checkpoints/00000)"
        )


def load_adapter(base_model, adapter_dir: Path, digest: str):
    """`base_model` with the adapter of `adapter_dir` applied, after checking its base: PEFT's
    model from the adapter's own config, its weights read once and set strictly
    (`PeftModel.from_pretrained` would load a file that lacks tensors with a warning, leaving
    those at their fresh initialisation)."""
    from peft import LoraConfig, get_peft_model

    check_base(adapter_dir, digest)
    config = LoraConfig.from_pretrained(str(adapter_dir))
    with _tied_head_is_handled():
        model = get_peft_model(base_model, config)
    load_adapter_weights(model, adapter_dir)
    return model


def load_adapter_weights(model, adapter_dir: Path) -> None:
    """An adapter's weights into a PeftModel, in place and strictly (a warm engine's next
    policy: megabytes, not the model)."""
    from safetensors.torch import load_file

    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    device = str(next(model.parameters()).device)
    set_adapter_weights(model, load_file(str(path), device=device), str(path))


#: Files of a base's processor that a merged checkpoint keeps (vision-language policies).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.json")


def merge(base_dir: Path, adapter_dir: Path, out_dir: Path, *, dtype: Any = None) -> Path:
    """A full HF checkpoint of base + adapter (`rlvr export --merge`): it loads with
    `AutoModelForCausalLM.from_pretrained` and serves without PEFT. Built in a scratch directory
    beside `out_dir` and renamed into place, so a failed merge leaves nothing; an `out_dir`
    that holds files is refused."""
    import shutil
    import tempfile

    from components.model.checkpoint import load_policy, portable_tokenizer_config

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise AdapterError(f"{out_dir} exists and is not an empty directory; give a new path")
    model, tokenizer = load_policy(base_dir, dtype=dtype)
    targets = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text()).get("target_modules")
    if _leaf(_output_head_name(model)) in (targets or []):
        _untie_output_head(model)  # tied, the input embeddings would take the head's delta too
    merged = load_adapter(model, adapter_dir, base_digest(base_dir)).merge_and_unload()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        portable_tokenizer_config(tmp)
        for name in PROCESSOR_FILES:  # a vision-language base's image processor
            if (base_dir / name).is_file():
                shutil.copyfile(base_dir / name, tmp / name)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
