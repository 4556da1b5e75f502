"""Checkpoints are plain HF safetensors directories that round-trip exactly, locally and on S3."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from components.core.checkpoint import (
    CheckpointError,
    import_checkpoint,
    load_policy,
    local_checkpoint,
    write_checkpoint,
)
from components.core.commit import OutputDir
from components.core.store import LocalStore, S3Store


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
