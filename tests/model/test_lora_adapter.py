"""LoRA adapter checkpoints (components/model/adapter.py): PEFT's format, tied to their base,
merged for serving; and what an adapter weighs against the full weights it replaces."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="peft is the LoRA dependency (pip install -e '.[lora]')")

from components.core.config import LoraSection  # noqa: E402
from components.model.adapter import (  # noqa: E402
    AdapterError,
    adapter_parameter_count,
    attach,
    base_digest,
    load_adapter,
    merge,
    save_adapter,
)
from components.model.checkpoint import load_policy  # noqa: E402


@pytest.fixture
def base_dir(tiny_assets):
    return tiny_assets / "base"


def _trained(base_dir, section: LoraSection, seed: int = 0):
    """The base with an adapter whose B matrices are nonzero (a fresh adapter is the base)."""
    model, tok = load_policy(base_dir)
    peft_model = attach(model, section)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return peft_model.eval(), tok


def test_only_the_adapter_trains_and_a_fresh_one_is_the_base(base_dir):
    section = LoraSection(rank=2)
    model, tok = load_policy(base_dir)
    ids = tok("12+34=", return_tensors="pt").input_ids
    with torch.no_grad():
        before = model(ids).logits
    peft_model = attach(model, section)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    # all-linear: attention and MLP projections, never the output head
    assert any("mlp" in n for n in trainable) and not any("lm_head" in n for n in trainable)
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, before, rtol=0, atol=0)


def test_an_adapter_checkpoint_loads_with_plain_peft_and_is_refused_on_another_base(
    base_dir, tmp_path
):
    from peft import PeftModel

    section = LoraSection(rank=2, alpha=4.0)
    peft_model, tok = _trained(base_dir, section)
    ids = tok("7*8=", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = peft_model(ids).logits
    digest = base_digest(base_dir)
    files = save_adapter(peft_model, tmp_path / "adapter", digest)
    assert sorted(f.name for f in files) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "rlvr_base.json",
    ]
    assert json.loads((tmp_path / "adapter" / "rlvr_base.json").read_text()) == {
        "base_digest": digest
    }
    # Whoever has PEFT loads it: PeftModel.from_pretrained(base, path).
    plain = PeftModel.from_pretrained(load_policy(base_dir)[0], str(tmp_path / "adapter"))
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(ids).logits, expected, rtol=0, atol=0)
        ours = load_adapter(load_policy(base_dir)[0], tmp_path / "adapter", digest).eval()
        torch.testing.assert_close(ours(ids).logits, expected, rtol=0, atol=0)
    with pytest.raises(AdapterError, match="trained on the base with digest .* not on this base"):
        load_adapter(load_policy(base_dir)[0], tmp_path / "adapter", "0123456789abcdef")
    (tmp_path / "adapter" / "rlvr_base.json").unlink()
    with pytest.raises(AdapterError, match="has no rlvr_base.json"):
        load_adapter(load_policy(base_dir)[0], tmp_path / "adapter", digest)


def test_the_base_digest_comes_from_the_manifest_or_the_files(base_dir, tmp_path):
    import hashlib
    import shutil

    digest = base_digest(base_dir)
    files = [
        {"path": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in base_dir.iterdir()
        if p.is_file()
    ]
    assert base_digest(base_dir, {"files": files}) == digest  # no file read again
    other = tmp_path / "other"
    shutil.copytree(base_dir, other)
    assert base_digest(other) == digest  # content, not location
    model, _ = load_policy(other)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    model.save_pretrained(other, safe_serialization=True)
    assert base_digest(other) != digest
    with pytest.raises(AdapterError, match=r"holds no \*\.safetensors"):
        base_digest(tmp_path)


@pytest.mark.parametrize("output_head", [False, True])
def test_merge_gives_a_plain_checkpoint_with_the_same_greedy_tokens(
    base_dir, tmp_path, output_head
):
    """With the output head adapted (model.lora.output_head) on a base whose head is tied to
    its input embeddings, the merge unties it first: only the head takes the delta."""
    from transformers import AutoModelForCausalLM

    section = LoraSection(rank=4, alpha=8.0, output_head=output_head)
    peft_model, tok = _trained(base_dir, section, seed=1)
    save_adapter(peft_model, tmp_path / "adapter", base_digest(base_dir))
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)  # no base weights
    out = merge(base_dir, tmp_path / "adapter", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    adapted = {
        n.split(".lora_B")[0].rsplit(".", 1)[-1]
        for n, _ in peft_model.named_parameters()
        if "lora_B" in n
    }
    assert ("lm_head" in adapted) == output_head
    base = load_policy(base_dir)[0]
    torch.testing.assert_close(
        merged.get_input_embeddings().weight, base.get_input_embeddings().weight, rtol=0, atol=0
    )
    ids = tok(["12+34=", "7*8=", "90-45="], return_tensors="pt", padding=True)
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tok.pad_token_id}
    with torch.no_grad():
        a = peft_model.generate(
            input_ids=ids.input_ids, attention_mask=ids.attention_mask, **kwargs
        )
        b = merged.generate(input_ids=ids.input_ids, attention_mask=ids.attention_mask, **kwargs)
        # Folding B @ A into W changes float rounding only.
        torch.testing.assert_close(
            merged(ids.input_ids).logits, peft_model(ids.input_ids).logits, rtol=1e-4, atol=1e-5
        )
    assert torch.equal(a, b)


def test_a_7b_adapter_weighs_at_least_50x_less_than_its_base():
    """Qwen2.5-7B's shape on the meta device (no weight allocated). all-linear LoRA of rank r
    adds r * (d_in + d_out) per linear layer: per layer r * 90,112 here, 2.52M * r in all."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
    )
    adapter, base = adapter_parameter_count(cfg, LoraSection(rank=32))
    assert adapter == 32 * 28 * (
        2 * (3584 + 3584) + 2 * (3584 + 512) + 2 * (3584 + 18944) + (18944 + 3584)
    )
    assert base > 7.0e9 and base / adapter >= 50  # 94x at rank 32
    assert adapter_parameter_count(cfg, LoraSection(rank=1))[0] * 32 == adapter


def test_rlvr_export_merge(base_dir, tmp_path):
    import shutil

    from click.testing import CliRunner
    from transformers import AutoModelForCausalLM

    from pipelines.cli import main

    run = tmp_path / "checkpoints"
    shutil.copytree(base_dir, run / "00000")
    peft_model, _ = _trained(base_dir, LoraSection(rank=2))
    save_adapter(peft_model, run / "00003", base_digest(base_dir))
    result = CliRunner().invoke(
        main, ["export", "--merge", str(run / "00003"), str(tmp_path / "m")]
    )
    assert result.exit_code == 0, result.output
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m") is not None
    (run / "00000" / "config.json").write_text(
        (run / "00000" / "config.json").read_text().replace("}", ', "rlvr_changed": 1}', 1)
    )
    result = CliRunner().invoke(
        main, ["export", "--merge", str(run / "00003"), str(tmp_path / "n")]
    )
    assert result.exit_code == 2 and "not on this base" in result.output
    assert not (tmp_path / "n").exists()  # a refused merge leaves nothing


def test_rlvr_export_refuses_a_used_output_and_a_broken_base_and_writes_nothing(base_dir, tmp_path):
    import shutil

    from click.testing import CliRunner

    from pipelines.cli import main

    run = tmp_path / "checkpoints"
    shutil.copytree(base_dir, run / "00000")
    peft_model, _ = _trained(base_dir, LoraSection(rank=2))
    save_adapter(peft_model, run / "00003", base_digest(base_dir))
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("x")
    result = CliRunner().invoke(main, ["export", "--merge", str(run / "00003"), str(used)])
    assert result.exit_code == 2 and "exists and is not an empty directory" in result.output
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
    (run / "00000" / "config.json").write_text("{nope")
    result = CliRunner().invoke(
        main, ["export", "--merge", str(run / "00003"), str(tmp_path / "m")]
    )
    assert result.exit_code == 2 and "config.json" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "m").exists()
    assert not list(tmp_path.glob(".m.*.tmp"))  # no scratch left either


@pytest.mark.slow
def test_a_lora_run_trains_and_samples_adapters(tmp_path, tiny_assets):
    """model.lora through the stages: train commits adapters (kilobytes here), generate samples
    from base + adapter (warm: the adapter's weights only), the next train resumes the adapter
    and its Adam state, and a cold rerun gives the same bytes."""
    import pyarrow.parquet as pq
    from peft import PeftModel

    from components.core.config import load_config
    from components.core.layout import RunLayout
    from components.core.timing import Timeline
    from components.generate.stage import GenerateStage
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import run as train
    from components.verify.stage import run as verify
    from tests.support.runs import write_config

    plugin = tmp_path / "odd_length.py"  # rewards that differ within a group: a gradient
    plugin.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
        "\n    return float(len(solution_str) % 2)\n"
    )
    path = write_config(
        tmp_path,
        tiny_assets,
        model={"lora": {"rank": 2, "alpha": 4.0}},
        verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
        train={"lr": 5e-2, "micro_batch_tokens": 512, "kl_metric": True},
        run={"iterations": 2},
    )
    cfg = load_config(path)
    layout = RunLayout.of(cfg)
    run_setup.run(cfg)
    warm = GenerateStage(cfg)
    for i in range(2):
        warm.step(i, timeline=Timeline("generate", i))
        verify(cfg, i)
        train(cfg, i)
    ckpt1, ckpt2 = Path(layout.checkpoint(1)), Path(layout.checkpoint(2))
    # KL to the base is taken with the adapter off (no second model): zero while B = 0.
    kl = [
        json.loads(Path(layout.checkpoint(c), "_SUCCESS").read_text())["stats"]["train/kl_ref"]
        for c in (1, 2)
    ]
    assert kl[0] == 0.0 and kl[1] > 0.0
    names = sorted(p.name for p in ckpt2.iterdir())
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names
    assert (ckpt2 / "adapter_model.safetensors").stat().st_size < (
        Path(layout.checkpoint(0)) / "model.safetensors"
    ).stat().st_size / 5
    assert Path(layout.train_state(2), "state-00000-of-00001.safetensors").is_file()
    # The adapter learned, and plain PEFT loads it on the base.
    base = load_policy(Path(layout.checkpoint(0)))[0]
    tuned = PeftModel.from_pretrained(base, str(ckpt2)).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        b = tuned(ids).logits
        with tuned.disable_adapter():
            a = tuned(ids).logits
    assert not torch.allclose(a, b)
    # A warm generate engine takes checkpoint 2 as adapter weights alone, and samples what a
    # cold one does.
    out = warm.step(2, timeline=Timeline("generate", 2))
    assert out["stats"]["policy_load"] == "weights"
    assert out["stats"]["policy_load_bytes_per_s"] > 0
    warm_rows = pq.read_table(Path(layout.rollouts(1), "part-00000.parquet"))
    generate(cfg, 1, force=True)
    cold_rows = pq.read_table(Path(layout.rollouts(1), "part-00000.parquet"))
    assert warm_rows.column("response_token_ids").equals(cold_rows.column("response_token_ids"))
    assert ckpt1.is_dir()
    # Sharded generation with an adapter: the shards' union is the unsharded rollouts.
    sharded = cfg.model_copy(deep=True)
    sharded.generate.num_shards = 2
    for s in range(2):
        generate(sharded, 1, shard=s, num_shards=2)
    union = {}
    for s in range(2):
        part = Path(layout.rollouts(1), f"shard-{s:05d}-of-00002", "part-00000.parquet")
        if part.exists():
            t = pq.read_table(part)
            union.update(
                zip(
                    zip(
                        t.column("prompt_id").to_pylist(),
                        t.column("sample_index").to_pylist(),
                        strict=True,
                    ),
                    t.column("response_token_ids").to_pylist(),
                    strict=True,
                )
            )
    single = dict(
        zip(
            zip(
                cold_rows.column("prompt_id").to_pylist(),
                cold_rows.column("sample_index").to_pylist(),
                strict=True,
            ),
            cold_rows.column("response_token_ids").to_pylist(),
            strict=True,
        )
    )
    assert union == single
    # Evaluate scores an adapter checkpoint like any other.
    from components.evaluate.stage import run as evaluate

    evaluate(cfg, 2)
    metrics = json.loads(Path(layout.evals(2), "metrics.json").read_text())
    assert metrics["checkpoint_index"] == 2 and 0.0 <= metrics["overall"]["pass@1"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("zero_stage", "dtype", "output_head"),
    [
        (0, "float32", False),
        (2, "float32", False),
        (3, "float32", False),
        (1, "bfloat16", False),
        (3, "bfloat16", False),
        (3, "float32", True),
    ],
)
def test_a_warm_lora_train_equals_cold_steps(tmp_path, tiny_assets, zero_stage, dtype, output_head):
    """The warm train worker (engine, adapter and Adam state kept across iterations) commits the
    same adapter bytes as one cold process per iteration, under ZeRO 0, 2 and 3, and under bf16,
    where the adapter saved is DeepSpeed's fp32 masters (a cold step resumes from them), and with
    the output head adapted (tied to the input embeddings in this base)."""
    import hashlib

    from safetensors import safe_open

    from components.core.config import load_config
    from components.core.layout import RunLayout
    from components.core.timing import Timeline
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import TrainStage
    from components.train.stage import run as train
    from components.verify.stage import run as verify
    from tests.support.runs import write_config

    plugin = tmp_path / "odd_length.py"
    plugin.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
        "\n    return float(len(solution_str) % 2)\n"
    )
    digests = []
    for mode in ("cold", "warm"):
        root = tmp_path / mode
        root.mkdir()
        lora = {"rank": 2, "alpha": 2.0, "output_head": output_head}
        path = write_config(
            root,
            tiny_assets,
            model={"lora": lora},
            verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
            train={"lr": 1e-2, "micro_batch_tokens": 512, "zero_stage": zero_stage, "dtype": dtype},
            run={"iterations": 2},
        )
        cfg = load_config(path)
        run_setup.run(cfg)
        stage = TrainStage(cfg) if mode == "warm" else None
        for i in range(2):
            generate(cfg, i)
            verify(cfg, i)
            if stage is None:
                train(cfg, i)
            else:
                stage.step(i, timeline=Timeline("train", i))
        if stage is not None:
            stage.close()
        weights = Path(RunLayout.of(cfg).checkpoint(2), "adapter_model.safetensors")
        digests.append(hashlib.sha256(weights.read_bytes()).hexdigest())
        # the adapter alone: no base weight rides along (PEFT adds the head's if asked)
        keys = list(safe_open(weights, "pt").keys())
        assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)
        assert any("lm_head" in k for k in keys) == output_head
    assert digests[0] == digests[1]
    if dtype == "bfloat16":  # fp32 masters: most values are not bf16-representable
        from safetensors.torch import load_file

        b = [v for k, v in load_file(weights).items() if "lora_B" in k]
        assert all(v.dtype == torch.float32 for v in b)
        off_grid = sum(int((v != v.bfloat16().float()).sum()) for v in b)
        assert off_grid > 0.5 * sum(v.numel() for v in b)


def test_vllm_gets_a_max_lora_rank_it_accepts():
    """vLLM takes `max_lora_rank` from a fixed set (its kernels' sizes): an adapter's rank is
    served by the smallest one that holds it, and a rank past the largest is a clear error. (No
    vllm import: this runs where vllm cannot.)"""
    from components.model.vllm_backend import vllm_max_lora_rank

    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 16, 32, 33, 512)] == [
        8,
        8,
        8,
        16,
        16,
        32,
        64,
        512,
    ]
    with pytest.raises(ValueError, match="up to rank 512; lower model.lora.rank"):
        vllm_max_lora_rank(513)


@pytest.mark.parametrize("output_head", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_train_forward_with_an_adapter(
    base_dir, tmp_path, output_head, temperature
):
    """The logprob contract across stages, with an adapter: generate samples from the base with
    the saved adapter loaded by PEFT (as its engine does), and every response logprob equals the
    train stage's teacher-forced forward through its own model (the base, a fresh adapter with
    the saved weights set, the train modes), within the same 1e-4 as without adapters."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from components.model.hf_backend import TransformersBackend
    from components.train.policy import set_train_modes
    from tests.support.sampling import check_logprobs

    section = LoraSection(rank=4, alpha=8.0, output_head=output_head)
    trained, _ = _trained(base_dir, section, seed=2)
    digest = base_digest(base_dir)
    save_adapter(trained, tmp_path / "adapter", digest)
    # generate's side
    base, tok = load_policy(base_dir)
    sampler = load_adapter(base, tmp_path / "adapter", digest).eval()
    # train's side
    model, _ = load_policy(base_dir)
    model = attach(model, section)
    set_peft_model_state_dict(model, load_file(tmp_path / "adapter" / "adapter_model.safetensors"))
    set_train_modes(model, checkpointing=False, lora_dropout=0.0)
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():  # the adapter matters: a sampler without it would fail the check
        assert not torch.allclose(
            sampler(ids).logits, load_policy(base_dir)[0](ids).logits, atol=1e-3
        )
    check_logprobs(
        TransformersBackend(sampler, tok, batch_size=8), (model, tok), temperature, 1.0, 0
    )


def test_an_adapter_config_is_the_same_bytes_in_every_process(base_dir, tmp_path):
    """PEFT writes target modules in set order (it changes with the hash seed) and the local
    path the base came from; a checkpoint's bytes decide what downstream stages rerun, so two
    processes with other hash seeds and another base path write the same adapter_config.json."""
    import shutil
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from components.model.adapter import attach, save_adapter\n"
        "from components.model.checkpoint import load_policy\n"
        "from components.core.config import LoraSection\n"
        "model, _ = load_policy(Path(sys.argv[1]))\n"
        "peft = attach(model, LoraSection(rank=2, output_head=True))\n"
        "save_adapter(peft, Path(sys.argv[2]), 'd' * 16, base='s3://bucket/run/checkpoints/00000')\n"
    )
    texts = []
    for seed in ("1", "2"):
        base = tmp_path / f"base{seed}"  # another local path to the same base each time
        shutil.copytree(base_dir, base)
        out = tmp_path / f"adapter{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-c", code, str(base), str(out)],
            check=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
        )
        texts.append((out / "adapter_config.json").read_text())
    assert texts[0] == texts[1]
    config = json.loads(texts[0])
    assert config["base_model_name_or_path"] == "s3://bucket/run/checkpoints/00000"
    assert config["target_modules"] == sorted(config["target_modules"])
