"""What the vLLM backend sends for an image prompt, checked without vLLM: each image's run of
pad tokens goes back to one placeholder, which vLLM expands itself (sending them expanded made
vLLM expand every pad again)."""

from __future__ import annotations

from components.generate.vllm_backend import unexpanded

PAD, START, END = (
    151655,
    151652,
    151653,
)  # Qwen2-VL's <|image_pad|>, <|vision_start|>, <|vision_end|>


def test_each_images_pads_go_back_to_one_placeholder():
    ids = [1, START, PAD, PAD, PAD, END, 2, START, PAD, PAD, END, 3]
    assert unexpanded(ids, {PAD}) == [1, START, PAD, END, 2, START, PAD, END, 3]


def test_text_and_single_placeholders_are_left_as_they_are():
    assert unexpanded([5, 5, 5, 7], {PAD}) == [5, 5, 5, 7]  # repeats of ordinary tokens stay
    assert unexpanded([START, PAD, END], {PAD}) == [START, PAD, END]
    assert unexpanded([], {PAD}) == []
