"""Image prompts: verl's multimodal data, a vision-language checkpoint's image side, M-RoPE.

Shared by generate (rendering and sampling), train (the teacher-forced forward with pixel values),
evaluate and `rlvr check` (docs/contracts.md, "Image prompts").

Data: a dataset row carries its images in an `images` column, a list of either HF datasets'
Image struct `{bytes, path}` (verl's and HF's multimodal Parquet) or plain binary; its prompt
marks where each goes with an `<image>` placeholder, one per image, in order. Rollouts never copy
the images: they carry `images_ref`, `<dataset path in the run>#<row>`, and the train stage reads
the bytes from the run's copy of the dataset.

Model: a checkpoint whose config has a `vision_config` (Qwen2-VL / Qwen2.5-VL family) and a
`preprocessor_config.json`. `VisionProcessor` renders a prompt as the model's processor does
(chat template with `{"type": "image"}` parts, each image's pad token repeated once per merged
patch) without transformers' `ProcessorMixin`, whose video half needs torchvision; pixel values
come from the checkpoint's own image processor.
"""

from __future__ import annotations

import inspect
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.errors import UserError

IMAGE_PLACEHOLDER = "<image>"
IMAGE_COLUMN = "images"
#: The rollout column that points at a prompt's images in the run's copy of its dataset.
IMAGES_REF = "images_ref"


def image_bytes(entry: Any) -> bytes | None:
    """The encoded bytes of one `images` entry (an HF Image struct or plain binary)."""
    if isinstance(entry, bytes | bytearray | memoryview):
        return bytes(entry)
    if isinstance(entry, dict):
        data = entry.get("bytes")
        return bytes(data) if data is not None else None
    return None


def decode_image(data: bytes, where: str):
    """A PIL RGB image from encoded bytes; a UserError naming `where` when they do not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.convert("RGB")
    except UnidentifiedImageError:
        raise UserError(
            f"{where}: not an image Pillow reads ({len(data)} bytes); store PNG or JPEG bytes "
            "in the images column"
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise UserError(
            f"{where}: the image does not decode ({type(e).__name__}: {e}); store PNG or JPEG "
            "bytes in the images column"
        ) from None


def placeholder_count(prompt: Any) -> int:
    """How many `<image>` placeholders a verl prompt (string or messages) holds."""
    if isinstance(prompt, str):
        return prompt.count(IMAGE_PLACEHOLDER)
    return sum((m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in prompt or [])


def split_placeholders(content: str) -> list[dict]:
    """A message's text as chat-template parts: `{"type": "image"}` where `<image>` stood."""
    parts: list[dict] = []
    for k, piece in enumerate(content.split(IMAGE_PLACEHOLDER)):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


@dataclass
class VisionInputs:
    """The model inputs of some images: the image processor's patches and each image's grid."""

    pixel_values: Any  # torch.Tensor [patches, C * T * P * P]
    image_grid_thw: Any  # torch.LongTensor [images, 3]

    @staticmethod
    def cat(items: list[VisionInputs | None]) -> VisionInputs | None:
        """Several prompts' inputs in order (rows without images add nothing)."""
        import torch

        kept = [v for v in items if v is not None]
        if not kept:
            return None
        return VisionInputs(
            torch.cat([v.pixel_values for v in kept]), torch.cat([v.image_grid_thw for v in kept])
        )

    def kwargs(self, device: Any = None, dtype: Any = None) -> dict[str, Any]:
        return {
            "pixel_values": self.pixel_values.to(device=device, dtype=dtype),
            "image_grid_thw": self.image_grid_thw.to(device),
        }


class VisionProcessor:
    """The image side of a vision-language checkpoint (see the module's docstring)."""

    def __init__(self, tokenizer, image_processor, config) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = int(config.image_token_id)
        self.image_token = tokenizer.convert_ids_to_tokens(self.image_token_id)
        vision = config.vision_config
        self.merge = int(getattr(vision, "spatial_merge_size", 2))
        self.start = _token(tokenizer, getattr(config, "vision_start_token_id", None))
        self.end = _token(tokenizer, getattr(config, "vision_end_token_id", None))

    @classmethod
    def of_checkpoint(cls, path: Path, tokenizer, config) -> VisionProcessor | None:
        """The processor of a vision-language checkpoint; None for a text-only model."""
        if not is_vision_config(config):
            return None
        path = Path(path)
        if not (path / "preprocessor_config.json").is_file():
            raise UserError(
                f"{path}: a vision-language model ({config.model_type}) without "
                "preprocessor_config.json; save its image processor with the checkpoint "
                "(image_processor.save_pretrained)"
            )
        import logging

        from transformers import AutoImageProcessor

        # The PIL (slow) implementation in every stage and image, with or without torchvision:
        # the torchvision one gives other pixel values once an image is resized (up to 0.03,
        # mean 1e-4, measured on the GPU machine), and the trainer must see what the sampler saw.
        quiet = logging.getLogger("transformers.models.auto.image_processing_auto")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            image_processor = AutoImageProcessor.from_pretrained(path, use_fast=False)
        finally:
            quiet.setLevel(level)
        return cls(tokenizer, image_processor, config)

    @property
    def min_pixels(self) -> int | None:
        return _pixels(self.image_processor, "min_pixels", "shortest_edge")

    @property
    def max_pixels(self) -> int | None:
        return _pixels(self.image_processor, "max_pixels", "longest_edge")

    def pixels(self, images: list) -> VisionInputs:
        """Pixel values and grids of PIL images, as the checkpoint's image processor makes them."""
        out = self.image_processor(images=images, return_tensors="pt")
        return VisionInputs(out["pixel_values"], out["image_grid_thw"].long())

    def tokens_per_image(self, grid) -> int:
        t, h, w = (int(x) for x in grid)
        return t * h * w // (self.merge * self.merge)

    def chat_text(self, prompt: Any) -> str:
        """The prompt as the model reads it before its image tokens are expanded: the chat
        template over `{"type": "image"}` parts (one vision-start, pad, vision-end per image)."""
        tok = self.tokenizer
        image = f"{self.start}{self.image_token}{self.end}"
        if isinstance(prompt, str):
            return prompt.replace(IMAGE_PLACEHOLDER, image)
        messages = [
            {"role": m["role"], "content": split_placeholders(m["content"])} for m in prompt
        ]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            if text.count(self.image_token) != placeholder_count(prompt):
                raise UserError(
                    f"the chat template renders {text.count(self.image_token)} image tokens for "
                    f"{placeholder_count(prompt)} <image> placeholders; use the model's own chat "
                    "template, which renders {'type': 'image'} message parts"
                )
            return text
        return "\n".join(m["content"] for m in prompt).replace(IMAGE_PLACEHOLDER, image)

    def render(self, prompt: Any, images: list) -> tuple[str, list[int], VisionInputs]:
        """(text before expansion, token ids with each image's pad tokens, pixel inputs)."""
        text = self.chat_text(prompt)
        vi = self.pixels(images)
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise UserError(
                f"the prompt has {len(pieces) - 1} image placeholders for {len(images)} images; "
                "give each image one <image> in the prompt"
            )
        expanded = pieces[0]
        for grid, piece in zip(vi.image_grid_thw, pieces[1:], strict=True):
            expanded += self.image_token * self.tokens_per_image(grid) + piece
        ids = list(self.tokenizer(expanded, add_special_tokens=False)["input_ids"])
        want = sum(self.tokens_per_image(g) for g in vi.image_grid_thw)
        if sum(i == self.image_token_id for i in ids) != want:
            raise UserError(
                f"the tokenizer does not keep {self.image_token!r} as one token ({want} expected "
                "in the prompt); add it to the tokenizer's special tokens"
            )
        return text, ids, vi


def pil_image_processor_class():
    """Qwen2-VL's PIL (slow) image processor class: `Qwen2VLImageProcessorPil` in transformers
    5, `Qwen2VLImageProcessor` in 4.x (the images' pin), where the fast one is a separate
    class. Both save as `Qwen2VLImageProcessor`, so a checkpoint loads under either."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        return Qwen2VLImageProcessorPil
    except ImportError:  # transformers 4.x
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None and hasattr(config, "image_token_id")


def _token(tokenizer, token_id) -> str:
    return "" if token_id is None else tokenizer.convert_ids_to_tokens(int(token_id))


def _pixels(image_processor, name: str, size_key: str) -> int | None:
    """`min_pixels` / `max_pixels` of a Qwen2-VL image processor: an attribute (transformers
    4.x), or its `size`'s shortest / longest edge, a dict (4.x) or a SizeDict (5.x)."""
    value = getattr(image_processor, name, None)
    if value is None:
        size = getattr(image_processor, "size", None)
        value = size.get(size_key) if isinstance(size, dict) else getattr(size, size_key, None)
    return int(value) if value is not None else None


def rope_index(model, input_ids, attention_mask, vision: VisionInputs | None):
    """M-RoPE positions of padded sequences with images: (positions [3, B, S], the model's
    position deltas [B]), from the model's own `get_rope_index`. A row without images gets 1D
    positions in all three sections; what padding gets differs by version (0 or 1), as does the
    delta's reference (the row's own length in transformers 5, the padded length in 4.x): the
    sampler takes a row's next position as one past its largest instead."""
    import torch

    inner = _inner_model(model)
    fn = inner.get_rope_index
    kwargs: dict[str, Any] = {"attention_mask": attention_mask}
    if vision is not None:
        kwargs["image_grid_thw"] = vision.image_grid_thw.to(input_ids.device)
    params = inspect.signature(fn).parameters
    if "mm_token_type_ids" in params:  # transformers 5: which tokens are an image's
        kwargs["mm_token_type_ids"] = (input_ids == inner.config.image_token_id).int()
    pos, delta = fn(input_ids, **kwargs)
    return pos, torch.as_tensor(delta, device=input_ids.device).reshape(-1)


def _unwrapped(model):
    """The transformers model under a DeepSpeed engine (`module`), the trainer's KL reference
    with its adapter off (`peft_model`) and PEFT (`get_base_model`)."""
    m = getattr(model, "module", model)
    m = getattr(m, "peft_model", m)
    return m.get_base_model() if hasattr(m, "get_base_model") else m


def _inner_model(model):
    """The module that owns `get_rope_index` under DeepSpeed, PEFT and ForConditionalGeneration."""
    m = _unwrapped(model)
    for candidate in (getattr(m, "model", None), m):
        if candidate is not None and hasattr(candidate, "get_rope_index"):
            return candidate
    raise UserError(f"{type(m).__name__} has no get_rope_index: not a Qwen2-VL family model")


def placeholder_ids(model_or_config) -> set[int]:
    """The token ids of `PLACEHOLDER_KEYS`: the sampler ends a response at one, as at EOS, and
    the trainer feeds it as padding. Takes a config or a model (under DeepSpeed and PEFT too)."""
    m = _unwrapped(model_or_config)
    config = getattr(m, "config", m)
    return {int(v) for k in PLACEHOLDER_KEYS if (v := getattr(config, k, None)) is not None}


#: Config keys of the tokens a model gives special meaning in a prompt: the image and video pad
#: tokens it replaces with features, and the vision-start token after which transformers 4.x's
#: `get_rope_index` reads the next token (out of range when it is a sequence's last).
PLACEHOLDER_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id")


def vision_tower(model):
    """The vision encoder's module of a vision-language model (`visual`), or None."""
    m = _unwrapped(model)
    for owner in (getattr(m, "model", None), m):
        tower = getattr(owner, "visual", None) if owner is not None else None
        if tower is not None:
            return tower
    return None


def resolve_images(
    store, root: str, refs: list[str | None], vision, tables: dict | None = None
) -> list[VisionInputs | None]:
    """Each rollout row's VisionInputs from its `images_ref` (None: a text prompt), read from
    the run's copy of the dataset: each dataset once (its `images` column only; `tables`, a
    cache the caller keeps across iterations: a run's datasets never change), each distinct
    row's images decoded and processed once however many samples share it."""
    import pyarrow.parquet as pq

    from components.core.store import join

    if not any(refs):
        return [None] * len(refs)
    if vision is None:
        raise UserError(
            f"rollouts carry images ({next(r for r in refs if r)}), but the policy is a "
            "text-only model; train a vision-language checkpoint on them"
        )
    tables = {} if tables is None else tables
    done: dict[str, VisionInputs] = {}
    out: list[VisionInputs | None] = []
    for ref in refs:
        if not ref:
            out.append(None)
            continue
        if ref not in done:
            path, _, row = ref.rpartition("#")
            uri = path if "://" in path or path.startswith("/") else join(root, path)
            if uri not in tables:
                local = store.local_path(uri)
                source = local if local is not None else io.BytesIO(store.read_bytes(uri))
                tables[uri] = pq.ParquetFile(source).read(columns=[IMAGE_COLUMN])
            if not row.isdigit() or int(row) >= tables[uri].num_rows:
                raise UserError(
                    f"images_ref {ref!r}: {uri} has {tables[uri].num_rows} rows; the rollouts do "
                    "not belong to this run's dataset (regenerate them)"
                )
            entries = tables[uri].column(IMAGE_COLUMN)[int(row)].as_py() or []
            images = [
                decode_image(image_bytes(e) or b"", f"{uri} row {row} image {k}")
                for k, e in enumerate(entries)
            ]
            done[ref] = vision.pixels(images)
        out.append(done[ref])
    return out
