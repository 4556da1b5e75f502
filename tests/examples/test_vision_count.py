"""The vision demo (examples/vision_count): its images are deterministic in the seed and hold as
many shapes as their answer says, its Parquet has verl's multimodal schema with no image shared
between train and eval, and prepare writes a base that transformers and rlvr's own vision helpers
load and render prompts for."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.model.vision import decode_image, image_bytes
from components.verify.math import compute_score
from examples.vision_count.data import (
    BACKGROUND,
    COLOURS,
    DATA_SOURCE,
    IMAGE_SIZE,
    make_splits,
    write_datasets,
    write_table,
)

ROOT = Path(__file__).resolve().parents[2]

#: verl's multimodal dataset columns, with HF datasets' Image struct, written out independently.
EXPECTED_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        (
            "prompt",
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
        ),
        ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct([("index", pa.int64()), ("split", pa.string()), ("shapes", pa.string())]),
        ),
    ]
)


def _shapes_by_colour(image) -> list[set[tuple[int, int, int]]]:
    """The image's 8-connected blobs of non-ground pixels, each as the set of its colours."""
    width, height = image.size
    px = image.load()
    seen: set[tuple[int, int]] = set()
    blobs = []
    for y in range(height):
        for x in range(width):
            if (x, y) in seen or px[x, y] == BACKGROUND:
                continue
            colours, todo = set(), deque([(x, y)])
            seen.add((x, y))
            while todo:
                cx, cy = todo.popleft()
                colours.add(px[cx, cy])
                for dx in (-1, 0, 1):
                    for dy in (-1, 0, 1):
                        nx, ny = cx + dx, cy + dy
                        if (
                            0 <= nx < width
                            and 0 <= ny < height
                            and (nx, ny) not in seen
                            and px[nx, ny] != BACKGROUND
                        ):
                            seen.add((nx, ny))
                            todo.append((nx, ny))
            blobs.append(colours)
    return blobs


def test_the_data_is_deterministic_in_the_seed():
    def drawn(seed):
        splits = make_splits(seed=seed, n_train=20, n_eval=8, n_dev=4)
        return {k: [(p.description, p.png()) for p in v] for k, v in splits.items()}

    first = drawn(5)
    assert first == drawn(5)
    assert first != drawn(6)
    assert [len(first[k]) for k in ("eval", "dev", "train")] == [8, 4, 20]


def test_every_image_holds_as_many_shapes_as_its_answer(tmp_path):
    problems = make_splits(seed=1, n_train=0, n_eval=40)["eval"]
    table = pq.read_table(write_table(problems, "eval", tmp_path / "eval.parquet")).to_pylist()
    counts = set()
    for row in table:
        (entry,) = row["images"]
        image = decode_image(image_bytes(entry), "test")
        assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
        blobs = _shapes_by_colour(image)
        answer = row["reward_model"]["ground_truth"]
        # one blob per shape, each of one of the palette's colours (no anti-aliasing)
        assert len(blobs) == int(answer), row["extra_info"]
        assert all(len(c) == 1 and c <= set(COLOURS.values()) for c in blobs)
        counts.add(int(answer))
        # graded by the math verifier, as the config's reward says
        assert compute_score(f"\\boxed{{{answer}}}", answer)["score"] == 1.0
        assert compute_score(f"\\boxed{{{int(answer) + 1}}}", answer)["score"] == 0.0
    assert len(counts) >= 4  # the counts vary


def test_the_parquet_has_verls_multimodal_schema_and_splits_share_no_image(tmp_path):
    train, evaluation = write_datasets(tmp_path, seed=0, n_train=60, n_eval=20, n_dev=10)
    digests = {}
    for path in (train, evaluation):
        table = pq.read_table(path)
        assert table.schema.remove_metadata() == EXPECTED_SCHEMA
        rows = table.to_pylist()
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        for r in rows:
            assert r["data_source"] == DATA_SOURCE
            (message,) = r["prompt"]
            assert message["role"] == "user" and message["content"].count("<image>") == 1
            (image,) = r["images"]
            assert image["path"] is None and image["bytes"].startswith(b"\x89PNG")
            assert r["reward_model"]["style"] == "rule"
        digests[path.stem] = {
            hashlib.sha1(decode_image(r["images"][0]["bytes"], "t").tobytes()).digest()
            for r in rows
        }
    assert len(digests["train"]) == 60 and len(digests["eval"]) == 20
    assert not digests["train"] & digests["eval"]


def test_the_chat_template_renders_image_parts():
    from examples.vision_count.model import build_tokenizer

    tok = build_tokenizer()
    parts = [{"type": "image"}, {"type": "text", "text": "How many?"}]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|vision_start|><|image_pad|><|vision_end|>How many?"
    plain = [{"role": "user", "content": "2+2="}]
    assert tok.apply_chat_template(plain, add_generation_prompt=True, tokenize=False) == "2+2="
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert ids[:3] == tok.convert_tokens_to_ids(
        ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
    )


def test_the_warm_up_loss_spreads_no_mass_onto_vision_tokens():
    import torch

    from examples.vision_count.model import build_model, build_tokenizer
    from examples.vision_count.prepare import smoothed_loss, smoothing_tokens

    tok = build_tokenizer()
    model = build_model(tok, vision_depth=1)
    spread = smoothing_tokens(model)
    vision = tok.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"])
    assert spread.sum() == len(tok) - 3 and not spread[vision].any()
    logits = torch.zeros(1, 2, len(tok), requires_grad=True)
    labels = torch.tensor([[-100, 5]])
    smoothed_loss(logits, labels, 0.1, spread).backward()
    assert logits.grad[0, 0].abs().sum() == 0  # ignored position
    assert (logits.grad[0, 1, vision] > 0).all()  # pushed down, hard


def test_prepare_writes_a_base_that_transformers_and_rlvr_load(tmp_path, capsys):
    import torch
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModelForImageTextToText,
        AutoTokenizer,
    )

    from components.model.vision import VisionProcessor, rope_index
    from examples.vision_count.model import build_tokenizer
    from examples.vision_count.prepare import VisionWarmup, prepare

    out = tmp_path / "build"
    cfg = VisionWarmup(
        n_train=32,
        n_eval=6,
        n_dev=4,
        max_steps=2,
        eval_every=2,
        batch_size=8,
        dev_samples=1,
        eval_samples=1,
    )
    prepare(out, cfg)
    base = out / "base"
    for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
        assert (base / name).is_file(), name
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["curve"][-1]["step"] == 2 and "eval_sampled" in summary["base"]
    assert pq.read_table(out / "eval.parquet").num_rows == 6

    model = AutoModelForImageTextToText.from_pretrained(base)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert AutoImageProcessor.from_pretrained(base).merge_size == 2
    tok, config = AutoTokenizer.from_pretrained(base), AutoConfig.from_pretrained(base)
    text = "<|vision_start|><|image_pad|><|vision_end|>How many shapes?\\boxed{3}<eos>"
    assert (
        tok(text, add_special_tokens=False)["input_ids"]
        == build_tokenizer()(text, add_special_tokens=False)["input_ids"]
    )

    vp = VisionProcessor.of_checkpoint(base, tok, config)
    row = pq.read_table(out / "eval.parquet").to_pylist()[0]
    image = decode_image(row["images"][0]["bytes"], "eval row 0")
    _, ids, vision = vp.render(row["prompt"], [image])
    (grid,) = vision.image_grid_thw
    assert ids.count(config.image_token_id) == int(grid.prod()) // 4 == 4
    assert tuple(vision.pixel_values.shape) == (16, 1176)
    x = torch.tensor([ids])
    mask = torch.ones_like(x)
    pos, _ = rope_index(model, x, mask, vision)
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=mask, position_ids=pos, **vision.kwargs()).logits
    assert logits.shape == (1, len(ids), len(tok))

    # a second run finds the outputs and does nothing
    before = (base / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    prepare(out, cfg)
    assert "nothing to do" in capsys.readouterr().out
    assert (base / "model.safetensors").stat().st_mtime_ns == before


def test_the_config_and_readme_describe_the_demo():
    from components.core.config import load_config
    from examples.vision_count.model import build_model, build_tokenizer, count_parameters

    cfg = load_config(ROOT / "examples/vision_count/config.yaml")
    assert cfg.prepare.module == "examples.vision_count.prepare"
    assert cfg.verify.rewards == {DATA_SOURCE: "math"}
    assert [e.name for e in cfg.data.eval] == ["heldout"] and not cfg.data.lm_eval
    assert cfg.model.base.endswith("examples/vision_count/.build/base")
    readme = (ROOT / "examples/vision_count/README.md").read_text()
    assert f"{count_parameters(build_model(build_tokenizer())):,} parameters" in readme
    results = readme.split("## RL results", 1)[1]
    assert "| 0 (the base) |" in results and "| 10 |" in results  # the run's table


@pytest.mark.parametrize("seed", [0, 3])
def test_shapes_never_touch(seed):
    from examples.vision_count.data import GAP, _apart

    for p in make_splits(seed=seed, n_train=50, n_eval=0)["train"]:
        boxes = [s.box for s in p.shapes]
        assert all(0 <= v < IMAGE_SIZE for b in boxes for v in b)
        assert all(_apart(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), GAP
