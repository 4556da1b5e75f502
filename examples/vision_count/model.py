"""Offline builders for the vision-count demo's tokenizer, image processor and tiny Qwen2-VL.

Nothing here touches a model hub: the tokenizer is the arithmetic demo's character-level one plus
Qwen2-VL's three vision tokens, the image processor is transformers' PIL Qwen2-VL processor (no
torchvision) set to turn the demo's 56x56 images into a 4x4 patch grid (4 image tokens) of
pixel values in [0, 1] (not normalised), and the model is a freshly initialised (weights' std
``INIT_STD``), very small ``Qwen2VLForConditionalGeneration``. They save to a
directory that ``AutoTokenizer``, ``AutoImageProcessor`` and ``AutoModelForImageTextToText``
load, and that ``components.model.vision.VisionProcessor.of_checkpoint`` renders prompts for.

Usage (from Python)::

    from examples.vision_count.model import (
        build_image_processor, build_model, build_tokenizer, save_checkpoint,
    )

    tok = build_tokenizer()
    model = build_model(tok)
    save_checkpoint(model, tok, build_image_processor(), "/tmp/tiny-vl")
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from components.model.vision import pil_image_processor_class
from examples.arithmetic.model import build_tokenizer as build_text_tokenizer
from examples.arithmetic.model import count_parameters, generation_config
from examples.arithmetic.model import save_checkpoint as save_text_checkpoint
from examples.vision_count.data import IMAGE_SIZE

__all__ = [
    "build_config",
    "build_image_processor",
    "build_model",
    "build_tokenizer",
    "count_parameters",
    "generation_config",
    "save_checkpoint",
]

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VISION_END = "<|vision_end|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)

#: Concatenate the message contents; a list content renders its parts in order, an image part as
#: Qwen2-VL's vision-start, image-pad, vision-end (the pad is repeated once per merged patch by
#: the processor). Nothing is added for the generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}" + VISION_START + IMAGE_PAD + VISION_END + "{% elif "
    "part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endfor %}"
)

#: Qwen2-VL's patching: 14x14 pixel patches, 2x2 of them merged into one image token, every
#: image repeated to 2 frames (its temporal patch).
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
#: Pixel bounds of the image processor's resize: the demo's 56x56 images (``IMAGE_SIZE``) keep
#: their size, a 4x4 patch grid, 4 image tokens; a larger image is scaled down to at most that.
MIN_PIXELS = 28 * 28
MAX_PIXELS = IMAGE_SIZE * IMAGE_SIZE
#: Floats of ``pixel_values`` per patch: 3 channels x 2 frames x 14 x 14.
FLOATS_PER_PATCH = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE

#: Default model dimensions (see ``count_parameters``; the README states the total).
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 4
VISION_DEPTH = 2
VISION_EMBED_DIM = 48
VISION_HEADS = 2
MAX_POSITIONS = 128
#: The std of the initial weights (``initializer_range``) of the language model and the vision
#: tower. transformers' 0.02 suits a hidden size in the thousands; at 64 the image tokens' path
#: to the answer starts so weak that the warm-up sat on the answer's prior for 300+ steps (for
#: some seeds all 600), with 0.1 it learns to count within 100-250 steps on every seed tried.
INIT_STD = 0.1
VISION_INIT_STD = 0.1


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The arithmetic demo's character-level tokenizer plus the three vision tokens (each one
    token, never split) and a chat template that renders ``{"type": "image"}`` parts."""
    tokenizer = build_text_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_image_processor():
    """Qwen2-VL's PIL image processor sized for the demo: a 56x56 image is one 4x4 patch grid.

    Pixel values are only rescaled to [0, 1], not normalised: the demo draws on a black ground,
    so a patch of ground is all zeros and the shapes are all of the signal (with CLIP's mean and
    std the ground is a large constant that the tiny model did not learn to see past)."""
    return pil_image_processor_class()(
        do_normalize=False,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )


def build_config(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = HIDDEN_SIZE,
    num_layers: int = NUM_LAYERS,
    num_heads: int = NUM_HEADS,
    intermediate_size: int | None = None,
    vision_depth: int = VISION_DEPTH,
    vision_embed_dim: int = VISION_EMBED_DIM,
    vision_heads: int = VISION_HEADS,
    max_positions: int = MAX_POSITIONS,
    init_std: float = INIT_STD,
    vision_init_std: float = VISION_INIT_STD,
) -> Qwen2VLConfig:
    """A Qwen2-VL config for ``tokenizer``: M-RoPE sections summing to half a head's width."""
    head_dim = hidden_size // num_heads
    half = head_dim // 2
    # temporal, height, width: Qwen2-VL's 16/24/24 of 64 in the same proportions
    mrope = [half // 4, half - half // 4 - (half - half // 4) // 2, (half - half // 4) // 2]
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
    }
    return Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size or 4 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "max_position_embeddings": max_positions,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope,
            },
            # transformers 4.x (the images' pin) reads the sections from rope_scaling
            "rope_scaling": {"type": "mrope", "mrope_section": mrope},
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "use_cache": True,
            "initializer_range": init_std,
            **ids,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_embed_dim,
            "hidden_size": hidden_size,
            "num_heads": vision_heads,
            "mlp_ratio": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH_SIZE,
            "initializer_range": vision_init_std,
        },
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_PAD),
        vision_start_token_id=tokenizer.convert_tokens_to_ids(VISION_START),
        vision_end_token_id=tokenizer.convert_tokens_to_ids(VISION_END),
        tie_word_embeddings=True,
        dtype="float32",
        **ids,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **sizes: int
) -> Qwen2VLForConditionalGeneration:
    """A freshly initialised fp32 Qwen2-VL sized for ``tokenizer`` (``sizes``: ``build_config``'s
    keyword arguments)."""
    config = build_config(tokenizer, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = generation_config(tokenizer)
    return model.float()


def save_checkpoint(
    model: Qwen2VLForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    image_processor,
    out_dir: str | Path,
) -> Path:
    """Save what the arithmetic demo's checkpoint holds (model in safetensors, tokenizer,
    ``generation_config.json``) plus the image processor (``preprocessor_config.json``)."""
    out = save_text_checkpoint(model, tokenizer, out_dir)
    image_processor.save_pretrained(out)
    return out
