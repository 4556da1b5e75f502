"""The policy's modes in the train stage (components/train/policy.py): dropout stays off in the
base, gradient checkpointing recomputes the decoder layers and changes no gradient, LoRA's
dropout applies to the gradient passes only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from components.core.config import LoraSection
from components.model.checkpoint import load_policy
from components.train.policy import enable_checkpointing, eval_modes, set_train_modes


def _loss_and_grads(model, ids) -> dict[str, torch.Tensor]:
    model.zero_grad()
    out = model(input_ids=ids, use_cache=False)
    out.logits.float().log_softmax(-1)[..., 3].mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_recomputes_each_layer_and_gives_the_same_gradients(
    tiny_assets, lora
):
    pytest.importorskip("peft") if lora else None
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 4, 8], [2, 6, 1, 1, 3, 9, 5, 7]])
    grads, calls = {}, {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model, _ = load_policy(tiny_assets / "base")
        if lora:
            from components.model.adapter import attach

            model = attach(model, LoraSection(rank=2))
            with torch.no_grad():  # B != 0, so A gets a gradient too
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.fill_(0.01)
        if checkpointing:
            enable_checkpointing(model)
        set_train_modes(model, checkpointing=checkpointing, lora_dropout=0.0)
        mlp = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp"))
        count = [0]

        def counted(*args, forward=mlp.forward, count=count, **kwargs):
            count[0] += 1  # a forward hook would miss the recompute: torch runs it hook-free
            return forward(*args, **kwargs)

        mlp.forward = counted
        grads[checkpointing] = _loss_and_grads(model, ids)
        calls[checkpointing] = count[0]
        # The base's own modules stay in eval: no dropout anywhere.
        assert not any(m.training for n, m in model.named_modules() if n.endswith("self_attn"))
    # Once in the forward without checkpointing; again in the backward's recompute with it.
    assert calls == {False: 1, True: 2}
    assert grads[False].keys() == grads[True].keys() and grads[False]
    for name, g in grads[False].items():
        # The recompute runs the same kernels on the same shapes and threads, so the gradients
        # agree to rounding (bit-equal on the machines tried; 1e-6 leaves room for a CPU whose
        # backward fuses differently with and without saved activations).
        torch.testing.assert_close(grads[True][name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_lora_dropout_applies_to_the_gradient_passes_only(tiny_assets):
    pytest.importorskip("peft")
    from components.model.adapter import attach

    model, _ = load_policy(tiny_assets / "base")
    model = attach(model, LoraSection(rank=2, dropout=0.5))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.05)
    set_train_modes(model, checkpointing=False, lora_dropout=0.5)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    torch.manual_seed(0)
    a = model(input_ids=ids).logits
    b = model(input_ids=ids).logits
    assert not torch.equal(a, b)  # dropout on the adapter's input: two draws differ
    with eval_modes(model), torch.no_grad():
        c = model(input_ids=ids).logits
        d = model(input_ids=ids).logits
    torch.testing.assert_close(c, d, rtol=0, atol=0)
    # The per-module modes come back after the no-grad pass, not a flat model.train(False).
    drop = [
        m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Dropout) and ".lora_dropout." in f".{n}."
    ]
    assert drop and all(m.training for m in drop)
    assert not any(
        m.training for m in model.modules() if isinstance(m, torch.nn.Dropout) and m not in drop
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("zero_stage", "lora"),
    [(0, None), (3, {"rank": 2, "alpha": 2.0})],
    ids=["full-zero0", "lora-zero3"],
)
def test_a_train_step_with_gradient_checkpointing_commits_the_same_weights(
    tmp_path, tiny_assets, zero_stage, lora, monkeypatch
):
    """One train iteration with and without train.gradient_checkpointing: the same weights (the
    stage's own path: DeepSpeed, ZeRO, the adapter). The flag is kept out of train's lineage, so
    turning it on does not retrain a committed iteration."""
    if lora:
        pytest.importorskip("peft")
    from components.core.config import load_config
    from components.core.layout import RunLayout
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
    from components.train import build as stage  # where the stage builds its engine

    calls = [0]

    def counting(model, **kwargs):  # the stage's own modes, and a count of MLP forwards
        set_train_modes(model, **kwargs)
        mlp = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp"))

        def counted(*args, forward=mlp.forward, **kw):
            calls[0] += 1
            return forward(*args, **kw)

        mlp.forward = counted

    monkeypatch.setattr(stage, "set_train_modes", counting)
    digests, forwards = [], []
    for checkpointing in (False, True):
        calls[0] = 0
        root = tmp_path / f"gc{int(checkpointing)}"
        root.mkdir()
        path = write_config(
            root,
            tiny_assets,
            model={"lora": lora},
            verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
            train={
                "lr": 1e-2,
                "micro_batch_tokens": 128,
                "mini_batches": 2,
                "zero_stage": zero_stage,
                "gradient_checkpointing": checkpointing,
            },
            run={"iterations": 1},
        )
        cfg = load_config(path)
        run_setup.run(cfg)
        generate(cfg, 0)
        verify(cfg, 0)
        assert train(cfg, 0)["skipped"] is False
        forwards.append(calls[0])
        ckpt = Path(RunLayout.of(cfg).checkpoint(1))
        weights = sorted(ckpt.glob("*.safetensors"))
        digests.append([hashlib.sha256(w.read_bytes()).hexdigest() for w in weights])
        if not checkpointing:  # the other setting of the flag: up to date, nothing retrained
            flipped = cfg.model_copy(deep=True)
            flipped.train.gradient_checkpointing = True
            assert train(flipped, 0)["skipped"] is True
    assert digests[0] == digests[1]
    # The recompute ran: every gradient micro-batch's MLP forward twice (the no-grad passes once).
    assert forwards[1] > forwards[0] > 0
