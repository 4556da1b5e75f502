"""Policy checkpoints: plain Hugging Face model directories in the object store.

A checkpoint holds `config.json`, weights only as `*.safetensors` (sharded with an index when
large), the tokenizer files and `generation_config.json`. It loads with
`AutoModelForCausalLM.from_pretrained` directly: no merger step. Nothing is ever unpickled:
weights load with `use_safetensors=True` and a directory holding pickle weights is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.core.commit import OutputDir, materialize
from components.core.errors import Problems, UserError
from components.core.store import Store, StoreError, get_store, is_s3

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
MAX_SHARD_SIZE = "2GB"


class CheckpointError(UserError):
    """A checkpoint directory that cannot be used; the message says why and what to do."""


def check_hf_dir(path: Path, source: str) -> None:
    """Refuse directories that are not safetensors HF checkpoints."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {source} does not exist or is not a directory")
    names = {p.name for p in path.iterdir()}
    if "adapter_config.json" in names:  # a LoRA adapter checkpoint (components/model/adapter.py)
        if "adapter_model.safetensors" not in names:
            raise CheckpointError(f"adapter checkpoint {source} has no adapter_model.safetensors")
        if not names & {"tokenizer.json", "tokenizer_config.json"}:
            raise CheckpointError(f"checkpoint {source} has no tokenizer files (tokenizer.json)")
        return
    if "config.json" not in names:
        raise CheckpointError(f"checkpoint {source} has no config.json; it must be an HF model dir")
    if not any(n.endswith(".safetensors") for n in names):
        pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
        hint = f" (found pickle weights {pickled}; convert them to safetensors)" if pickled else ""
        raise CheckpointError(f"checkpoint {source} has no *.safetensors weights{hint}")
    if not names & {"tokenizer.json", "tokenizer_config.json"}:
        raise CheckpointError(f"checkpoint {source} has no tokenizer files (tokenizer.json)")


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is unusable (truncated, not safetensors), or None. Reads only the
    header: 8 bytes of length, the JSON header, and the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return f"is {size} bytes long, too short to be safetensors"
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100 << 20):
                return "has no valid safetensors header (not a safetensors file, or truncated)"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"cannot be read as safetensors ({e})"
    if not isinstance(header, dict):
        return "has a malformed safetensors header"
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
    )
    if 8 + n + end > size:
        return f"is truncated: its header describes {8 + n + end} bytes, the file has {size}"
    return None


def check_checkpoint_dir(
    path: Path, where: str, problems: Problems, *, loaded: dict[str, Any] | None = None
) -> bool:
    """A local HF checkpoint directory is loadable: config.json parses and names a known
    architecture, every safetensors file is whole, the tokenizer loads and has a pad token.
    Returns whether it is usable. `loaded`, where given, receives the `config` and `tokenizer`
    it loaded, for a caller that checks more with them (a 49k BPE tokenizer takes about a
    second to load)."""
    try:
        check_hf_dir(path, where)
    except CheckpointError as e:
        problems.error(where, str(e).removeprefix(f"checkpoint {where} "), "")
        return False
    ok = True
    try:
        config = json.loads((path / "config.json").read_text())
        if not isinstance(config, dict) or "model_type" not in config:
            raise ValueError("it has no 'model_type'")
    except (OSError, ValueError) as e:
        problems.error(
            f"{path / 'config.json'}",
            f"is not a valid model config ({e})",
            "replace it with the config.json saved by save_pretrained",
        )
        ok = False
    for f in sorted(path.glob("*.safetensors")):
        why = safetensors_problem(f)
        if why:
            problems.error(str(f), why, "copy the checkpoint again or re-save it")
            ok = False
    if ok:
        try:
            from transformers import AutoConfig, AutoTokenizer

            config = AutoConfig.from_pretrained(path)
            tok = AutoTokenizer.from_pretrained(path)
            if loaded is not None:
                loaded.update(config=config, tokenizer=tok)
            vocab = getattr(config, "vocab_size", None) or getattr(
                getattr(config, "text_config", None), "vocab_size", None
            )
            if tok.pad_token_id is None:
                problems.error(
                    f"{path}/tokenizer_config.json",
                    "the tokenizer has no pad token",
                    "set pad_token (e.g. to the eos token) in tokenizer_config.json",
                )
            check_turn_end(path, tok, problems)
            special = {"pad": tok.pad_token_id, "eos": tok.eos_token_id, "bos": tok.bos_token_id}
            for name, tid in special.items():
                if vocab and tid is not None and not 0 <= tid < vocab:
                    problems.error(
                        f"{path}/tokenizer_config.json",
                        f"the {name} token ({getattr(tok, name + '_token')!r}, id {tid}) is outside "
                        f"the model's vocabulary of {vocab} (a token the tokenizer made up?)",
                        f"set {name}_token to a token of the vocabulary (e.g. the eos token)",
                    )
        except Exception as e:  # noqa: BLE001 - transformers raises OSError/ValueError/KeyError...
            problems.error(
                str(path),
                f"cannot be loaded by transformers ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''})",
                "check config.json and the tokenizer files",
            )
            ok = False
    return ok


def turn_end_token(tokenizer: Any) -> str | None:
    """The token the chat template closes a message with (ChatML's `<|im_end|>`, Llama 3's
    `<|eot_id|>`): the first special or added token after an assistant message's text when a
    short chat is rendered; None without a template, or when plain text follows the message."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    probe = "rlvr-turn-end-probe"
    chat = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": probe}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a plain chat has no answer
        return None
    at = text.find(probe) if isinstance(text, str) else -1
    if at < 0:
        return None
    rest = text[at + len(probe) :].lstrip()
    tokens = {*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()}
    return max((t for t in tokens if t and rest.startswith(t)), key=len, default=None)


def stop_token_ids(path: Path, tokenizer: Any) -> set[int]:
    """The token ids a sampler stops at: the tokenizer's eos and generation_config.json's
    eos_token_id (one id or a list), as the generate backends take them."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        eos = None
    ids |= {int(e) for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)}
    return ids


def check_turn_end(path: Path, tokenizer: Any, problems: Problems) -> None:
    """A warning when the chat template ends a turn with a token the sampler does not stop at
    (a converter that took another eos): responses would run on past the answer."""
    end = turn_end_token(tokenizer)
    if end is None:
        return
    end_id = tokenizer.convert_tokens_to_ids(end)
    if end_id not in stop_token_ids(path, tokenizer):
        problems.warn(
            f"{path}/tokenizer_config.json",
            f"the chat template ends a turn with {end!r}, but the tokenizer's eos token is "
            f"{tokenizer.eos_token!r} and generation_config.json does not list {end!r}: "
            "responses would not stop at the end of the answer",
            f"set eos_token: {end!r} (and pad_token) in tokenizer_config.json, or add its id "
            f"({end_id}) to eos_token_id in generation_config.json",
        )


def local_checkpoint(store: Store, uri: str) -> Path:
    """A local directory with a committed checkpoint's files (downloaded when remote)."""
    path = materialize(store, uri)
    check_hf_dir(path, uri)
    return path


def device_and_dtype(name: str):
    """The device a stage runs on (one CUDA GPU where there is one, else the CPU) and the
    torch dtype a config names (`auto`: bf16 on a GPU, fp32 on the CPU)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "auto":
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
    else:
        dtype = getattr(torch, name)
    return device, dtype


def sampler_dtype_name(backend: str, dtype: str) -> str:
    """The dtype generate and evaluate sample in, by name: `generate.dtype`, with auto resolved
    as the backend resolves it (transformers: bf16 on a GPU, fp32 on a CPU; vLLM: bf16, which
    rlvr passes it explicitly so that what it samples in is what the handoff is written in)."""
    if dtype != "auto":
        return dtype
    if backend == "vllm":
        return "bfloat16"
    return str(device_and_dtype("auto")[1]).removeprefix("torch.")


#: The x86 flags under which oneDNN multiplies a dtype natively (AMX tiles or AVX-512).
NATIVE_MATMUL_FLAGS = {
    "bfloat16": {"amx_bf16", "avx512_bf16"},
    "float16": {"amx_fp16", "avx512_fp16"},
}


def cpu_native_matmul(dtype: str = "bfloat16", cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU multiplies `dtype` (bfloat16 or float16) natively, which oneDNN uses: a
    bf16 matmul on AMX runs several times faster than fp32; without such support torch emulates
    the dtype and it runs slower. None where /proc/cpuinfo does not say (not Linux, not x86)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = next((line for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    names = set(flags.split(":", 1)[-1].split())
    return bool(names & NATIVE_MATMUL_FLAGS[dtype])


def load_policy(path: Path, *, dtype: Any = None, device: str = "cpu"):
    """Load model and tokenizer from a local checkpoint directory (safetensors only). A
    damaged checkpoint (truncated weights, an invalid config.json, a broken tokenizer) is a
    CheckpointError naming the file, not a library traceback."""
    import torch
    from transformers import AutoTokenizer

    path = Path(path)
    for f in sorted(path.glob("*.safetensors")):  # cheap: the headers only
        why = safetensors_problem(f)
        if why:
            raise CheckpointError(f"{f} {why}; copy the checkpoint again or re-save it")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = (
            model_class(path)
            .from_pretrained(path, use_safetensors=True, dtype=dtype or torch.float32)
            .to(device)
        )
    except Exception as e:  # noqa: BLE001 - name the first problem the full check finds
        problems = Problems()
        check_checkpoint_dir(path, str(path), problems)
        if problems.errors:
            raise CheckpointError(str(problems.errors[0])) from None
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded ({type(e).__name__}: {e})"
        ) from None
    return model, tokenizer


def model_class(path: Path):
    """The Auto class that loads a checkpoint: a causal LM, or an image-text-to-text model
    where its config has a vision tower (the Qwen2-VL family; components/model/vision.py)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return AutoModelForCausalLM  # its own load names the problem
    vision = isinstance(config, dict) and "vision_config" in config
    return AutoModelForImageTextToText if vision else AutoModelForCausalLM


def saved_names(model, names: list[str]) -> dict[str, str]:
    """{name in the model's state dict: the name `save_pretrained` stores it under}.

    transformers saves some models under their original checkpoint names (a Qwen2-VL's
    `model.language_model.layers.*` as `model.layers.*`, `model.visual.*` as `visual.*`), which
    transformers 4.x (the GPU images) and vLLM load. A checkpoint streamed one tensor at a time
    (components/model/weights.py) uses the same names: transformers 5's own reversal, run on
    empty tensors to learn the renaming alone, or 4.x's reverse key mapping. Where the reversal
    is more than a renaming (weights fused or split on save), the model's own names are kept,
    which transformers 5 loads as they are."""
    try:
        from transformers.core_model_loading import revert_weight_conversion  # transformers 5
    except ImportError:
        return _reverse_key_mapping(model, names)
    import torch

    probe = {n: torch.empty(0, device="meta") for n in names}
    back = {id(t): n for n, t in probe.items()}
    try:
        out = revert_weight_conversion(model, dict(probe))
    except Exception:  # noqa: BLE001 - a converter that needs real tensors: not a renaming
        return {n: n for n in names}
    if len(out) != len(probe) or any(id(t) not in back for t in out.values()):
        logging.getLogger("rlvr.checkpoint").warning(
            "%s saves weights converted, not only renamed: the streamed checkpoint keeps the "
            "model's own names (transformers 5 loads them; an older loader may not)",
            type(model).__name__,
        )
        return {n: n for n in names}
    return {back[id(t)]: k for k, t in out.items()}


def _reverse_key_mapping(model, names: list[str]) -> dict[str, str]:
    """transformers 4.x's renaming on save: its vision-language models' reversed
    `_checkpoint_conversion_mapping`, the first pattern that matches a name winning."""
    import re

    mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    reverse = {v: k for k, v in mapping.items()}
    out = {}
    for name in names:
        key = name
        for pattern, replacement in reverse.items():
            replacement = re.sub(r"\(.*\)", "", replacement.lstrip("^"))
            key, n = re.subn(pattern, replacement, key)
            if n:
                break
        out[name] = key
    return out


def portable_tokenizer_config(directory: str | Path) -> None:
    """Name the tokenizer class so both transformers majors load the checkpoint.

    transformers 5 saves a fast tokenizer as `TokenizersBackend`, a class 4.x does not have, and
    the GPU images stay on 4.x (vLLM 0.11 requires transformers < 5): a checkpoint saved on a
    laptop with 5.x would not load in the generate image. `PreTrainedTokenizerFast` is the same
    tokenizer to both (5.x keeps it as an alias; AutoTokenizer still picks the model type's
    class where it has one)."""
    path = Path(directory) / "tokenizer_config.json"
    if not path.is_file():
        return
    portable = portable_tokenizer_text(path)
    if portable is not None:
        path.write_text(portable)


def portable_tokenizer_text(path: Path) -> str | None:
    """The portable text of a `tokenizer_config.json` that names transformers 5's
    `TokenizersBackend`, else None (nothing to change; an unreadable file is the loader's to
    report)."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") != "TokenizersBackend":
        return None
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def write_checkpoint(
    model,
    tokenizer,
    out: OutputDir,
    stats: dict[str, Any] | None = None,
    inputs: dict[str, str] | None = None,
    *,
    before_commit: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Save model + tokenizer as an HF directory into `out` and commit it. `before_commit` may
    add to the stats once every file is written (e.g. the save's throughput)."""
    # Written once: into a scratch directory beside the output, then renamed into it (a local
    # store) or streamed up from disk (S3); never a second full copy.
    tmp = out.scratch_dir()
    try:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
        tokenizer.save_pretrained(tmp)
        portable_tokenizer_config(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        check_hf_dir(tmp, str(out.uri))
        out.put_tree(tmp, move=True)
        stats = dict(stats or {})
        if before_commit is not None:
            stats = before_commit(stats)
        return out.commit(stats, inputs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def import_checkpoint(
    src: str, out: OutputDir, endpoint_url: str | None = None, stats: dict | None = None
) -> dict:
    """Copy an external HF directory (local path, S3 prefix, or Hub id ``hf://...``) into the
    run and commit it; ``stats`` go into the manifest (the Hub's revision)."""
    if src.startswith("hf://"):
        from components.core.hub import materialize

        local, revision = materialize(src)
        return import_checkpoint(local, out, stats={"source": src, "revision": revision})
    if is_s3(src):
        store = get_store(src, endpoint_url)
        files = store.list_files(src)
        if not files:
            raise CheckpointError(f"checkpoint {src} has no files")
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-import-"))
        try:
            for f in files:
                store.download_file(f"{src.rstrip('/')}/{f}", tmp / f)
            return import_checkpoint(str(tmp), out, stats=stats or {"source": src})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    path = Path(src[len("file://") :] if src.startswith("file://") else src)
    check_hf_dir(path, src)  # validate before touching the destination
    out.begin(force=True)
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name != "_SUCCESS":
            if p.name.endswith(PICKLE_SUFFIXES):
                continue  # never carry pickles into a run
            name = p.relative_to(path).as_posix()
            portable = portable_tokenizer_text(p) if name == "tokenizer_config.json" else None
            if portable is not None:  # a base saved by transformers 5: the images run 4.x
                out.put_bytes(portable.encode(), name)
            else:
                out.put_file(p, name)
    if not out.files:
        raise StoreError(f"nothing to import from {src}")
    return out.commit(stats or {"source": src})
