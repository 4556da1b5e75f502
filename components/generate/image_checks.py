"""Image prompts checked before any work (`rlvr check`, docs/contracts.md "Image prompts"):
the `images` column's type, one `<image>` placeholder per image in every row, no more images
than `generate.max_images_per_prompt`, every image's bytes present and decodable, no source
image over `data.max_image_pixels`, and a policy that can see them (a vision-language model
whose image processor is saved with it)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from components.core.config import RunConfig
from components.core.errors import Problems, UserError
from components.core.preflight import rows_text
from components.model.vision import (
    IMAGE_COLUMN,
    VisionProcessor,
    image_bytes,
    is_vision_config,
    placeholder_count,
)

IMAGES_TYPE_HELP = (
    "store the images as a list of {bytes: binary, path: string} (Hugging Face datasets' Image "
    "feature, as verl's multimodal Parquet does) or a list of binary PNG/JPEG bytes"
)


def images_type_ok(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    if pa.types.is_binary(v) or pa.types.is_large_binary(v):
        return True
    if not pa.types.is_struct(v) or v.get_field_index("bytes") < 0:
        return False
    b = v.field("bytes").type
    return pa.types.is_binary(b) or pa.types.is_large_binary(b)


def check_images(
    cfg: RunConfig,
    datasets: dict[str, tuple[str, pa.Table]],
    model_config,
    base_dir: Path | None,
    tokenizer,
    problems: Problems,
) -> None:
    """`datasets`: name -> (uri, table) of the sets generate or evaluate will sample."""
    for uri, table in datasets.values():
        if "videos" in table.column_names:
            problems.error(
                f"{uri} column 'videos'",
                "video prompts are not supported: only images reach the policy, so the videos "
                "would be silently left out",
                "give the frames as images (one <image> each), or drop the videos column",
            )
    with_images = {n: v for n, v in datasets.items() if IMAGE_COLUMN in v[1].column_names}
    if not with_images:
        return
    if model_config is not None and not is_vision_config(model_config):
        uris = ", ".join(sorted(uri for uri, _ in with_images.values()))
        problems.error(
            f"config model.base ({cfg.model.base})",
            f"{uris} hold image prompts, but the policy is a text-only model "
            f"({getattr(model_config, 'model_type', '?')})",
            "use a vision-language checkpoint (the Qwen2-VL family) or drop the images column",
        )
    vision = None
    if model_config is not None and is_vision_config(model_config) and base_dir is not None:
        try:
            vision = VisionProcessor.of_checkpoint(base_dir, tokenizer, model_config)
        except UserError as e:
            problems.error(f"config model.base ({cfg.model.base})", str(e))
    if cfg.generate.tools or cfg.generate.environment:
        problems.error(
            "config generate.tools / generate.environment",
            "image prompts are sampled single-turn only: a multi-turn trajectory's later turns "
            "would reach the policy without its images",
            "drop the tools and environment for this dataset, or its images column",
        )
    for name, (uri, table) in with_images.items():
        sizes = check_image_table(cfg, uri, table, problems)
        if vision is not None and sizes is not None:
            check_prompt_lengths(cfg, name, uri, table, sizes, vision, model_config, problems)


def check_image_table(
    cfg: RunConfig, uri: str, table: pa.Table, problems: Problems
) -> dict[int, list[tuple[int, int]]] | None:
    """One dataset's image rows (see the module's docstring); each row's image sizes (width,
    height) when every image is readable, else None."""
    col_type = table.schema.field(IMAGE_COLUMN).type
    if not images_type_ok(col_type):
        problems.error(f"{uri} column {IMAGE_COLUMN!r}", f"has type {col_type}", IMAGES_TYPE_HELP)
        return None
    images = table.column(IMAGE_COLUMN).to_pylist()
    prompts = table.column("prompt").to_pylist()
    limit = cfg.generate.max_images_per_prompt
    mismatch, too_many, no_bytes, bad, big = [], [], [], [], []
    sizes: dict[int, list[tuple[int, int]]] = {}
    for row, (entries, prompt) in enumerate(
        tqdm(
            zip(images, prompts, strict=True),
            total=len(images),
            desc="check images",
            unit="row",
            disable=None,
            leave=False,
        )
    ):
        entries = entries or []
        if placeholder_count(prompt) != len(entries):
            mismatch.append((row, placeholder_count(prompt), len(entries)))
        if len(entries) > limit:
            too_many.append(row)
        for k, e in enumerate(entries):
            data = image_bytes(e)
            if data is None:
                no_bytes.append(row)
                continue
            found = image_problem(data, cfg.data.max_image_pixels)
            if isinstance(found[1], tuple):
                sizes.setdefault(row, []).append(found[1])
            else:
                (big if found[0] == "large" else bad).append((row, k, found[1]))
    if mismatch:
        row, n_ph, n_img = mismatch[0]
        problems.error(
            f"{uri} {rows_text(np.array([m[0] for m in mismatch]))}",
            f"the number of <image> placeholders in the prompt differs from the number of "
            f"images (row {row}: {n_ph} placeholders, {n_img} images)",
            "put exactly one <image> in the prompt text for each entry of the images column",
        )
    if too_many:
        problems.error(
            f"{uri} {rows_text(np.array(too_many))}",
            f"more than generate.max_images_per_prompt={limit} images in a prompt",
            "raise generate.max_images_per_prompt or split those rows",
        )
    if no_bytes:
        problems.error(
            f"{uri} {rows_text(np.unique(no_bytes))} column {IMAGE_COLUMN!r}",
            "an image has no bytes (a path alone cannot be read inside the pipeline's stages)",
            "embed the image bytes in the Parquet file (datasets' Image feature with "
            "embed_external_files, or read each file into the bytes field)",
        )
    for found, what in ((bad, "does not decode"), (big, "is too large")):
        if found:
            row, k, why = found[0]
            problems.error(
                f"{uri} {rows_text(np.unique([f[0] for f in found]))} column {IMAGE_COLUMN!r}",
                f"{len(found)} image(s) {what} (row {row} image {k}: {why})",
                "re-encode those images as PNG or JPEG"
                if what == "does not decode"
                else f"downscale them, or raise data.max_image_pixels "
                f"({cfg.data.max_image_pixels})",
            )
    return None if (mismatch or no_bytes or bad or big) else sizes


def image_problem(data: bytes, max_pixels: int) -> tuple[str, str | tuple[int, int]]:
    """Why encoded image bytes are unusable, ("large" or "decode", why), or ("ok", (width,
    height)): the header is read first (a too-large image is refused before it is decoded),
    then the whole image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if w * h > max_pixels:
                return "large", f"{w}x{h} = {w * h} pixels, over {max_pixels}"
            im.load()
    except UnidentifiedImageError:
        return "decode", f"not an image Pillow reads ({len(data)} bytes, starting {data[:8]!r})"
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        return "decode", f"{type(e).__name__}: {e}"
    return "ok", (w, h)


def check_prompt_lengths(
    cfg: RunConfig,
    name: str,
    uri: str,
    table: pa.Table,
    sizes: dict[int, list[tuple[int, int]]],
    vision,
    model_config,
    problems: Problems,
) -> None:
    """Image rows' prompt lengths as generate will count them: the rendered text plus each
    image's tokens at the size the image processor scales it to (from the header's size; no
    pixel is processed). The first row that does not render stops it, named."""
    g = cfg.generate
    count = getattr(vision.image_processor, "get_number_of_image_patches", None)
    if count is None:  # an image processor that cannot say: generate counts them itself
        return
    prompts = table.column("prompt")
    lengths: dict[int, int] = {}
    for row, dims in sizes.items():
        try:
            text = vision.chat_text(prompts[row].as_py())
        except UserError as e:
            problems.error(f"{uri} row {row}", str(e))
            return
        image_tokens = sum(count(h, w, {}) // (vision.merge * vision.merge) for w, h in dims)
        text_tokens = len(vision.tokenizer(text, add_special_tokens=False)["input_ids"])
        lengths[row] = text_tokens - len(dims) + image_tokens
    over = np.array(sorted(r for r, n in lengths.items() if n > g.max_prompt_tokens))
    if over.size and over.size == len(lengths) == table.num_rows:
        problems.error(
            uri,
            f"every prompt is longer than generate.max_prompt_tokens={g.max_prompt_tokens} "
            f"with its image tokens (the shortest: {min(lengths.values())})",
            "raise it, or lower the image processor's max_pixels",
        )
    elif over.size:
        problems.warn(
            f"{uri} {rows_text(over)}",
            f"{over.size} image prompt(s) longer than generate.max_prompt_tokens="
            f"{g.max_prompt_tokens} with their image tokens will be skipped",
            "raise it to sample them",
        )
    context = getattr(getattr(model_config, "text_config", None), "max_position_embeddings", None)
    fitting = [n for n in lengths.values() if n <= g.max_prompt_tokens]
    new = next((e.max_new_tokens for e in cfg.data.eval if e.name == name), None)
    new = new or g.max_new_tokens
    if context and fitting and max(fitting) + new > context:
        problems.error(
            f"config generate.max_new_tokens ({name})",
            f"an image prompt of {max(fitting)} tokens plus {new} new tokens exceeds the "
            f"model's context of {context} positions",
            "lower max_new_tokens or max_prompt_tokens, or the image processor's max_pixels",
        )
