"""Checkpoints are plain HF safetensors directories that round-trip exactly, locally and on S3."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from components.core.commit import OutputDir
from components.core.store import LocalStore, S3Store
from components.model.checkpoint import (
    CheckpointError,
    import_checkpoint,
    load_policy,
    local_checkpoint,
    write_checkpoint,
)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_roundtrip_logits_equal(backend, tmp_path, tiny_assets, request):
    if backend == "local":
        store, uri = LocalStore(), str(tmp_path / "ckpt")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        store, uri = S3Store(), f"s3://{bucket}/run/checkpoints/00001"
    model, tok = load_policy(tiny_assets / "base")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    write_checkpoint(model, tok, OutputDir(store, uri, "test"))
    local = local_checkpoint(store, uri)
    names = {p.name for p in local.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    # Loads with plain transformers, no merger step.
    again = AutoModelForCausalLM.from_pretrained(local, use_safetensors=True)
    ids = torch.tensor([tok("12+7=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_import_refuses_pickle_only_and_missing(tmp_path, tiny_assets):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_assets / "base", bad)
    (bad / "model.safetensors").rename(bad / "pytorch_model.bin")
    out = OutputDir(LocalStore(), str(tmp_path / "run" / "checkpoints" / "00000"), "init")
    with pytest.raises(CheckpointError, match="pickle weights.*convert them to safetensors"):
        import_checkpoint(str(bad), out)
    with pytest.raises(CheckpointError, match="does not exist"):
        import_checkpoint(str(tmp_path / "missing"), out)
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_saved_tokenizer_loads_in_either_transformers_major(tmp_path, tiny_assets):
    """transformers 5 names a fast tokenizer `TokenizersBackend`, which 4.x (the images' pin,
    for vLLM) cannot load; rlvr's checkpoints name `PreTrainedTokenizerFast`, the same tokenizer
    to both, and load back with the same token ids."""
    import json

    from transformers import AutoTokenizer

    model, tok = load_policy(tiny_assets / "base")
    write_checkpoint(model, tok, OutputDir(LocalStore(), str(tmp_path / "ckpt"), "test"))
    config = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] != "TokenizersBackend", config  # a class 4.x has
    again = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    assert again("12+7=")["input_ids"] == tok("12+7=")["input_ids"]
    assert again.pad_token_id == tok.pad_token_id and again.eos_token_id == tok.eos_token_id

    # The rewrite itself, on what transformers 5 writes.
    from components.model.checkpoint import portable_tokenizer_config

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "TokenizersBackend", "pad_token": "<pad>"})
    )
    portable_tokenizer_config(tmp_path / "t")
    written = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert written == {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>"}


def test_import_names_a_tokenizer_class_transformers_4_loads(tmp_path, tiny_assets):
    """A base saved by transformers 5 names `TokenizersBackend`; the run's copy names
    `PreTrainedTokenizerFast` (the images pin 4.x) and loads with the same ids; the source is
    left as it was."""
    import json

    from transformers import AutoTokenizer

    src = tmp_path / "base5"
    shutil.copytree(tiny_assets / "base", src)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    out = OutputDir(LocalStore(), str(tmp_path / "run" / "checkpoints" / "00000"), "init")
    import_checkpoint(str(src), out)
    dst = tmp_path / "run" / "checkpoints" / "00000"
    copied = json.loads((dst / "tokenizer_config.json").read_text())
    assert copied == {**config, "tokenizer_class": "PreTrainedTokenizerFast"}
    assert json.loads((src / "tokenizer_config.json").read_text()) == config
    tok, again = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(dst)
    assert again("12+7=")["input_ids"] == tok("12+7=")["input_ids"]


def test_a_chat_template_that_ends_turns_with_a_token_the_sampler_ignores_is_flagged(
    tmp_path, tiny_assets
):
    """As a GGUF converter that takes another eos than the template's turn end (transformers
    5.17 on SmolLM2: eos `<|im_start|>`, turns ending `<|im_end|>`): `rlvr check` warns and
    names the fix; a generation config that lists the token settles it."""
    import json

    from transformers import AutoTokenizer

    from components.core.errors import Problems
    from components.model.checkpoint import check_checkpoint_dir, turn_end_token

    base = tmp_path / "base"
    shutil.copytree(tiny_assets / "base", base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}<unk>\n{% endfor %}"
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    tok = AutoTokenizer.from_pretrained(base)
    assert turn_end_token(tok) == "<unk>"

    problems = Problems()
    assert check_checkpoint_dir(base, "model.base", problems)
    (warning,) = problems.warnings
    assert "ends a turn with '<unk>'" in warning.what and "'<eos>'" in warning.what
    assert "set eos_token: '<unk>'" in warning.fix

    generation = json.loads((base / "generation_config.json").read_text())
    generation["eos_token_id"] = [tok.eos_token_id, tok.convert_tokens_to_ids("<unk>")]
    (base / "generation_config.json").write_text(json.dumps(generation))
    problems = Problems()
    assert check_checkpoint_dir(base, "model.base", problems) and not problems.warnings
