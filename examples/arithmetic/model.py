"""Offline builders for the arithmetic demo's tokenizer and tiny Qwen2 policy.

Nothing here touches a model hub: the tokenizer is a character-level ``WordLevel`` tokenizer built
in memory and the model is a freshly initialised, very small ``Qwen2ForCausalLM``. Both save to a
directory that ``AutoTokenizer.from_pretrained`` / ``AutoModelForCausalLM.from_pretrained`` load.

Usage (from Python)::

    from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

    tok = build_tokenizer()
    model = build_model(tok)
    save_checkpoint(model, tok, "/tmp/tiny-policy")
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from components.model.checkpoint import portable_tokenizer_config

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)

#: Ordinary characters in the vocabulary, one token each: printable ASCII plus newline and tab.
CHARACTERS = "".join(chr(c) for c in range(32, 127)) + "\n\t"

#: Qwen2's pre-tokenizer split (as ``Qwen2Tokenizer`` hard-codes it in transformers 5).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Concatenate the message contents; nothing is added for the generation prompt.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

#: Default model dimensions (138,176 parameters with the default 100-token tokenizer).
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 4
MAX_POSITIONS = 64


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer whose ``decode`` round-trips text exactly.

    It is a byte-level BPE with *no merges*, so every ASCII character is exactly one token. It
    uses the same normalizer, pre-tokenizer and decoder that transformers 5's ``Qwen2Tokenizer``
    hard-codes: ``AutoTokenizer.from_pretrained`` on a directory whose ``config.json`` says
    ``model_type: qwen2`` ignores the saved pipeline and rebuilds it as ``Qwen2Tokenizer`` from
    the vocabulary and merges alone, so any other pipeline (e.g. ``WordLevel`` with a per-character
    split) would silently change after a save/load round trip.
    """
    byte_map = _byte_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab.setdefault(byte_map[ord(ch)], len(vocab))
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = HIDDEN_SIZE,
    num_layers: int = NUM_LAYERS,
    num_heads: int = NUM_HEADS,
    intermediate_size: int | None = None,
    max_positions: int = MAX_POSITIONS,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A freshly initialised fp32 Qwen2 causal LM sized for ``tokenizer``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        use_cache=True,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = generation_config(tokenizer)
    return model.float()


def generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    return GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_checkpoint(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path
) -> Path:
    """Save model (safetensors), tokenizer and ``generation_config.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config(tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out)  # loads in transformers 4.x (the images) and 5.x alike
    gen_path = out / "generation_config.json"
    if not gen_path.exists():  # save_pretrained writes it; make sure regardless of version
        gen_path.write_text(json.dumps(generation_config(tokenizer).to_dict(), indent=2) + "\n")
    return out
