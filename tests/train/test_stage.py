"""Train stage: one DeepSpeed update per iteration, exact under micro-batching, continuous across
stage invocations, and strict about its inputs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from components.core.commit import OutputDir, committed_files
from components.core.layout import RunLayout, store_for
from components.core.schemas import read_records
from components.core.store import LocalStore
from components.generate.stage import run as generate
from components.model import run_setup
from components.model.backends import LOGPROB_DEFINITION
from components.train import distributed, update
from components.train import inputs as train_inputs
from components.train import stage as train
from components.train.batching import Rollouts, learning_rate, plan_micro_batches
from components.verify.stage import run as verify


def rollouts_of(cfg, i: int) -> Rollouts:
    store, layout = store_for(cfg), RunLayout.of(cfg)
    table = read_records(store, committed_files(store, layout.scored(i), ".parquet"), "scored")
    return Rollouts.from_table(table, "test")


def weights(cfg, c: int) -> dict[str, torch.Tensor]:
    return load_file(f"{RunLayout.of(cfg).checkpoint(c)}/model.safetensors")


def engine_weights(engine) -> dict[str, torch.Tensor]:
    """The engine's weights in fp32 as a checkpoint stores them (components/train/handoff.py)."""
    from components.train.handoff import WeightPlan

    return dict(WeightPlan(engine, torch.float32).tensors(keep=True))


def reference_engine(cfg, *, iterations: int, total_steps: int):
    """One process, one engine from checkpoint 0, the run's rollouts of `iterations` trained
    back to back (the stage's own choice of old logprobs): what N stage invocations must
    equal. Returns the engine and the tokenizer."""
    import deepspeed

    from components.model.checkpoint import load_policy

    model, tok = load_policy(Path(RunLayout.of(cfg).checkpoint(0)))
    distributed.init_distributed("cpu")
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=list(model.parameters()),
        config=distributed.deepspeed_config(cfg.train, 1, torch.float32),
    )
    step = 0
    for i in range(iterations):
        torch.manual_seed(cfg.run.seed + i)
        choice = train_inputs.decide_old_logprobs(cfg, sampled_stats(cfg, i), 0)
        step, _ = update.train_iteration(
            update.Trainer(engine, "cpu", tok.pad_token_id),
            update.IterationWork(
                rollouts_of(cfg, i),
                i,
                temperature=1.0,
                horizon=6,
                start_step=step,
                total_steps=total_steps,
                seed=cfg.run.seed,
                old_logprobs=choice,
            ),
            cfg.train,
        )
    return engine, tok


def test_learning_rate_schedule_hand_values():
    kw = dict(base_lr=1.0, warmup_steps=2, total_steps=6, schedule="cosine", min_lr_ratio=0.0)
    # warmup: (s+1)/2 -> 0.5, 1.0; cosine over the 4 remaining steps: progress 0, .25, .5, .75
    got = [learning_rate(s, **kw) for s in range(6)]
    want = [
        0.5,
        1.0,
        1.0,
        0.5 * (1 + math.cos(math.pi / 4)),
        0.5,
        0.5 * (1 + math.cos(3 * math.pi / 4)),
    ]
    assert got == pytest.approx(want, abs=1e-12)
    assert learning_rate(9, **{**kw, "schedule": "constant"}) == 1.0


def test_micro_batch_plan_respects_budget_and_sorts():
    lengths = [5, 9, 3, 9, 4]
    plan = plan_micro_batches(lengths, [0, 1, 2, 3, 4], token_budget=18)
    assert plan == [[1, 3], [0, 4, 2]]  # 2x9=18 fits; 3x5=15 fits
    assert plan_micro_batches(lengths, [1], token_budget=4) == [[1]]  # an over-long row alone


def test_stage_continuity_and_micro_batch_invariance(train_cfg):
    """Two iterations as two stage invocations == one engine taking the updates back to back;
    and one mini-batch's gradient is the same for micro-batches of 1 row, a few rows, and all."""
    cfg = train_cfg
    cfg.run.iterations = 3  # the LR schedule spans the whole run: 3 iterations x 2 steps
    run_setup.run(cfg)
    for i in range(3):
        generate(cfg, i)
        verify(cfg, i)
        result = train.run(cfg, i)
        assert result["skipped"] is False
    stats = result["stats"]
    for key in ("train/loss", "train/clipfrac_low", "train/grad_norm", "train/tokens_per_s"):
        assert key in stats and math.isfinite(stats[key])
    assert stats["train/global_step"] == 6.0 and stats["train/grad_norm"] > 0
    state = json.loads(Path(RunLayout.of(cfg).train_state(3), "state.json").read_text())
    assert state["step"] == 6
    assert train.run(cfg, 2)["skipped"] is True

    # Reference: one process, one engine, the same rollouts, the iterations back to back.
    engine, tok = reference_engine(cfg, iterations=3, total_steps=6)
    assert from_rollout(cfg, sampled_stats(cfg, 0), 0)
    got = weights(cfg, 3)
    base = weights(cfg, 0)
    for name, ref in engine.module.state_dict().items():
        if name in got:
            assert not torch.equal(got[name], base[name]) or name.endswith("bias")
            # Same batch layout on both sides (same micro-batch plan, one process), so the same
            # kernels run on the same shapes: equal in practice on any CPU. It cannot be looser
            # across layouts: Adam's first steps move a weight by ~lr*sign(g).
            torch.testing.assert_close(got[name], ref, rtol=0, atol=1e-6, msg=name)

    # Micro-batch invariance of one mini-batch's gradient.
    from components.train.objective import build_targets, pad_rows, response_mask_of

    ro = rollouts_of(cfg, 0)
    n = len(ro)
    mask = response_mask_of([len(r) for r in ro.response_tokens])
    old = pad_rows(ro.rollout_logprobs, mask.shape[1])
    targets = build_targets(
        cfg.train,
        rewards=torch.tensor(ro.rewards, dtype=torch.float32),
        group_ids=ro.group_ids(),
        response_mask=mask,
        truncated=torch.tensor(ro.truncated),
        old_logprobs=old,
        rollout_logprobs=old,
    )
    rows = list(range(n))
    num_tokens = int(mask.sum())
    assert len(plan_micro_batches(ro.lengths(), rows, 1)) == n  # really one row per micro-batch
    for mode in (
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ):
        t = cfg.train.model_copy(update={"loss_agg": mode})
        grads = {}
        for budget in (1, 64, 10**6):
            engine.zero_grad()
            for p in engine.module.parameters():
                p.grad = None
            plan = plan_micro_batches(ro.lengths(), rows, budget)
            update.accumulate_mini_batch(
                engine,
                ro,
                plan,
                targets,
                old,
                None,
                t,
                num_tokens=num_tokens,
                num_seqs=n,
                horizon=6,
                temperature=1.0,
                pad_id=tok.pad_token_id,
                device="cpu",
            )
            grads[budget] = torch.cat([p.grad.flatten() for p in engine.module.parameters()])
        assert grads[10**6].abs().sum() > 0, mode
        for budget in (1, 64):
            # Micro-batches regroup float32 sums of the same per-token terms (~1e-7 relative
            # rounding here); 1e-5 holds on any CPU with two orders of margin.
            rel = (grads[budget] - grads[10**6]).norm() / grads[10**6].norm()
            assert rel < 1e-5, (mode, budget, float(rel))


def _commit_scored(cfg, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    layout = RunLayout.of(cfg)
    out = OutputDir(LocalStore(), layout.scored(0), "verify")
    out.begin(force=True)
    path = Path(layout.root) / "bad.parquet"
    pq.write_table(table, path)
    out.put_file(path, "part-00000.parquet")
    out.commit({})


@pytest.mark.parametrize("corruption", ["nan_reward", "length_mismatch"])
def test_bad_rollouts_fail_before_any_update(train_cfg, corruption):
    cfg = train_cfg
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    layout = RunLayout.of(cfg)
    table = read_records(
        LocalStore(), committed_files(LocalStore(), layout.scored(0), ".parquet"), "scored"
    )
    if corruption == "nan_reward":
        rewards = table.column("reward").to_pylist()
        rewards[2] = float("nan")
        table = table.set_column(
            table.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float32())
        )
        message = "non-finite"
    else:
        lps = table.column("response_logprobs").to_pylist()
        lps[1] = lps[1] + [0.0]
        idx = table.schema.get_field_index("response_logprobs")
        table = table.set_column(idx, "response_logprobs", pa.array(lps, pa.list_(pa.float32())))
        message = "row 1: response_token_ids has"
    _commit_scored(cfg, table)
    with pytest.raises(ValueError, match=message):
        train.run(cfg, 0)
    assert not Path(layout.checkpoint(1)).exists() and not Path(layout.train_state(1)).exists()


def test_unknown_algorithm_lists_valid_names(train_cfg):
    cfg = train_cfg
    cfg.train.advantage = "gpro"
    with pytest.raises(ValueError, match="gpro.*grpo"):
        train.run(cfg, 0)


def test_stage_with_every_objective_option(train_cfg):
    """KL (reference loaded), entropy bonus, TIS, dynamic sampling, overlong filter and forking
    tokens together through the real stage: finite metrics and a committed checkpoint."""
    cfg = train_cfg
    for key, value in dict(
        kl_coef=0.1,
        entropy_coef=0.01,
        rollout_correction="tis",
        dynamic_sampling=True,
        overlong_filter=True,
        forking_top_rho=0.5,
    ).items():
        setattr(cfg.train, key, value)
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    stats = train.run(cfg, 0)["stats"]
    for key in (
        "train/kl",
        "train/kl_loss",
        "train/entropy",
        "train/tis_clipped",
        "train/zero_var_groups",
        "train/overlong_masked",
        "train/grad_norm",
    ):
        assert key in stats and math.isfinite(stats[key]), key
    # Rollout logprobs come from the same definition, so TIS weights are ~1: nothing clipped,
    # and the sampler-trainer mismatch is within the logprob contract (1e-4 per token).
    assert stats["train/tis_clipped"] == 0.0
    assert 0.0 <= stats["train/rollout_lp_diff_max"] < 1e-4


def test_rollout_correction_refuses_a_different_logprob_definition(train_cfg):
    cfg = train_cfg
    cfg.train.rollout_correction = "mis"
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    manifest_path = Path(RunLayout.of(cfg).rollouts(0), "_SUCCESS")
    manifest = json.loads(manifest_path.read_text())
    manifest["stats"]["logprob_definition"] = "vllm raw logprobs"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="vllm raw logprobs"):
        train.run(cfg, 0)


@pytest.mark.slow
def test_two_processes_in_one_pod_match_one(train_cfg, tmp_path):
    """`python -m components.train` with train.processes=2 re-launches itself under
    torch.distributed.run (gloo on CPU); the update equals the single-process one."""
    import shutil
    import subprocess
    import sys

    cfg = train_cfg
    cfg.train.mini_batches = 1
    cfg.train.lr_schedule = "constant"
    cfg.train.warmup_steps = 0
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    train.run(cfg, 0)
    single = weights(cfg, 1)
    layout = RunLayout.of(cfg)
    single_stats = json.loads(Path(layout.checkpoint(1), "_SUCCESS").read_text())["stats"]
    shutil.rmtree(layout.checkpoint(1))
    shutil.rmtree(layout.train_state(1))
    config = tmp_path / "resolved.yaml"
    config.write_text(cfg.to_json())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            str(config),
            "-i",
            "0",
            "--set",
            "train.processes=2",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        json.loads(Path(layout.checkpoint(1), "_SUCCESS").read_text())["stats"]["train/world_size"]
        == 2
    )
    two = weights(cfg, 1)
    two_stats = json.loads(Path(layout.checkpoint(1), "_SUCCESS").read_text())["stats"]
    # The same global loss and pre-clip gradient norm (exact gradients across world sizes are
    # proven in test_train_zero). Adam's first step is ~lr*sign(g), so a gradient component at
    # round-off level may flip: compare weights by the share that agree.
    for key in ("train/loss", "train/grad_norm"):
        assert two_stats[key] == pytest.approx(single_stats[key], rel=1e-4), key
    close = sum(int(torch.isclose(two[k], single[k], rtol=0, atol=1e-6).sum()) for k in single)
    total = sum(v.numel() for v in single.values())
    assert close / total > 0.999
    # The state the two ranks wrote, each its own share, resumes on one process (resharded as
    # it is read): iteration 1 trains from it, with nothing to replay.
    state = json.loads(Path(layout.train_state(1), "state.json").read_text())
    assert state["world_size"] == 2 and len(state["files"]) == 2
    shares = [set(load_file(f"{layout.train_state(1)}/{f}")) for f in state["files"]]
    assert all(any(k.startswith("master.") for k in share) for share in shares)
    assert not (shares[0] - {"rng.torch.0"}) & (shares[1] - {"rng.torch.1"})
    generate(cfg, 1)
    verify(cfg, 1)
    stats = train.run(cfg, 1)["stats"]
    assert stats["train/replayed"] == 0.0 and stats["train/world_size"] == 1


def test_single_process_ignores_inherited_rendezvous(train_cfg, tmp_path):
    """A train stage started from a process that is itself rank 0 of a one-process group (a KFP
    local task, a notebook) must not reuse that group's taken MASTER_PORT."""
    import os
    import socket
    import subprocess
    import sys

    cfg = train_cfg
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    config = tmp_path / "resolved.yaml"
    config.write_text(cfg.to_json())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {
            **os.environ,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(taken.getsockname()[1]),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "components.train", str(config), "-i", "0"],
            env=env,
            capture_output=True,
            text=True,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(RunLayout.of(cfg).checkpoint(1), "_SUCCESS").is_file()


def test_zero3_stage_writes_a_standard_checkpoint(train_cfg):
    """Under ZeRO-3 the weights are gathered inside the stage into a plain HF checkpoint."""
    from transformers import AutoModelForCausalLM

    cfg = train_cfg
    cfg.train.zero_stage = 3
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    train.run(cfg, 0)
    path = Path(RunLayout.of(cfg).checkpoint(1))
    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
    base = weights(cfg, 0)
    got = weights(cfg, 1)
    assert set(got) == set(base)  # every tensor gathered, full shapes
    assert all(got[k].shape == base[k].shape for k in base)
    assert any(not torch.equal(got[k], base[k]) for k in base)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_train_state_from_another_architecture_is_refused(train_cfg, tmp_path):
    """A train state whose architecture does not match the run's base fails before any update
    (train builds from the base and the newest state); a checkpoint swapped under a state is
    not trained from (the state records the checkpoint it belongs to)."""
    import shutil

    from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

    cfg = train_cfg
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    train.run(cfg, 0)  # checkpoint 1 and, on leaving, train state 1
    generate(cfg, 1)
    verify(cfg, 1)
    # Swap the base for a differently shaped model (as a mixed-up run would).
    layout = RunLayout.of(cfg)
    other = tmp_path / "other"
    tok = build_tokenizer()
    save_checkpoint(build_model(tok, hidden_size=48, num_layers=1, num_heads=2), tok, other)
    ckpt = Path(layout.checkpoint(0))
    manifest = json.loads((ckpt / "_SUCCESS").read_text())
    shutil.copy(other / "model.safetensors", ckpt / "model.safetensors")
    shutil.copy(other / "config.json", ckpt / "config.json")
    from components.core.commit import sha256_file

    for f in manifest["files"]:
        f["bytes"] = (ckpt / f["path"]).stat().st_size
        f["sha256"] = sha256_file(ckpt / f["path"])
    (ckpt / "_SUCCESS").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="different architecture"):
        train.run(cfg, 1)
    assert not Path(layout.checkpoint(2)).exists()


def test_bf16_keeps_adam_moments_and_fp32_masters(train_cfg):
    """Under bf16 the Adam moments live on DeepSpeed's fp32 master copies: they are saved for
    every parameter, restored, and checkpoints hold the fp32 masters (not rounded bf16)."""
    from safetensors.torch import load_file as load

    cfg = train_cfg
    cfg.train.dtype = "bfloat16"
    cfg.run.iterations = 2
    run_setup.run(cfg)
    for i in range(2):
        generate(cfg, i)
        verify(cfg, i)
        train.run(cfg, i)
    layout = RunLayout.of(cfg)
    state = load(f"{layout.train_state(2)}/state-00000-of-00001.safetensors")
    names = [k for k in weights(cfg, 0)]
    assert all(
        f"exp_avg.{n}" in state and f"exp_avg_sq.{n}" in state for n in names if "lm_head" not in n
    )
    got = weights(cfg, 2)
    assert all(v.dtype == torch.float32 for v in got.values())
    # Small updates survive: a bf16 round trip of the masters would erase most of them.
    base = weights(cfg, 0)
    changed = sum(int((got[k] != base[k]).sum()) for k in base)
    assert changed > 0.5 * sum(v.numel() for v in base.values())


def test_zero2_state_restores_exactly(train_cfg):
    """Under ZeRO-2 (flat partitioned Adam state) two stage invocations equal one engine
    taking both iterations' updates back to back."""
    cfg = train_cfg
    cfg.train.zero_stage = 2
    cfg.run.iterations = 2
    run_setup.run(cfg)
    for i in range(2):
        generate(cfg, i)
        verify(cfg, i)
        train.run(cfg, i)
    engine, _ = reference_engine(cfg, iterations=2, total_steps=4)
    got = weights(cfg, 2)
    for name, ref in engine_weights(engine).items():
        # Same layout on both sides (see test_stage_continuity_and_micro_batch_invariance).
        torch.testing.assert_close(got[name], ref, rtol=0, atol=1e-6, msg=name)


def test_cpu_start_compiles_no_deepspeed_op(tmp_path):
    """A CPU start builds nothing: DeepSpeed's shared-memory all-reduce op (inference only) is
    skipped, so no compiler is needed and the first step does not wait a minute for one. Run in
    a fresh process with an empty extensions directory, so an earlier test's build cannot hide
    a compile."""
    import importlib
    import inspect

    import deepspeed.ops

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` is torch

    # The lookup the skip overrides must still be the one DeepSpeed consults.
    from components.train.distributed import SHM_COMM_OP

    assert SHM_COMM_OP in deepspeed.ops.__compatible_ops__
    assert "__compatible_ops__" in inspect.getsource(ds_torch.build_shm_op)
    code = (
        "from components.train import stage  # noqa: F401 - a worker's imports\n"
        "from components.train.distributed import init_distributed\n"
        "init_distributed('cpu')\n"
        "import importlib\n"
        "print('shm op:', importlib.import_module('deepspeed.comm.comm').cdb.shm_comm_op)\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "shm op: None" in out.stdout
    assert not (tmp_path / "ext").exists() or not any((tmp_path / "ext").rglob("*.so"))


def _logprobs_against_the_models_logits(model, V: int) -> None:
    from components.train import update
    from components.train.batching import Rollouts, collate

    ro = Rollouts(
        prompt_ids=["a", "b"],
        prompt_tokens=[[5, 6, 7], [8, 9]],
        response_tokens=[[10, 11, 12, 13], [14, 15]],
        rollout_logprobs=[[0.0] * 4, [0.0] * 2],
        rewards=np.zeros(2),
        truncated=np.array([False, False]),
    )
    mb = collate(ro, [0, 1], 0)
    with torch.no_grad():
        lp, _ = update.sequence_logprobs(model, mb, 1.0, "cpu")
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits.float()
    idx = mb.response_index
    want = torch.log_softmax(logits, -1).gather(1, idx.unsqueeze(-1).expand(-1, -1, V))
    want = want.gather(-1, mb.response_tokens.unsqueeze(-1)).squeeze(-1)
    m = mb.response_mask
    assert torch.allclose(lp[m], want[m], atol=1e-5), (lp[m] - want[m]).abs().max()


def test_sequence_logprobs_keep_the_logits_of_a_forward_that_changes_them(monkeypatch):
    """A model whose logits are not hidden @ W^T by a transform no config attribute names (here a
    hook halving the head's output) passes `output_head`'s static checks; the last position's
    logits, which the model computes anyway (logits_to_keep=1), show the difference, and the
    trainer takes the model's own logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from components.train import update

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    assert update.output_head(model) is not None
    _logprobs_against_the_models_logits(model, 64)  # the chunked path, identical values
    # transformers 4.56's get_decoder() gives None for Llama: the decoder is still found
    with monkeypatch.context() as m:
        m.setattr(type(model), "get_decoder", lambda _self: None)
        assert update.output_head(model)[0] is model.model
    model.lm_head.register_forward_hook(lambda _m, _a, out: out * 0.5)
    _logprobs_against_the_models_logits(model, 64)


def test_sequence_logprobs_keep_the_logits_of_a_model_that_scales_its_head():
    """Falcon-H1 multiplies its head's output by config.lm_head_multiplier: the chunked
    hidden-state path (hidden @ W^T) would drop the factor, so such a model keeps its own logits,
    and the trainer's logprobs equal log_softmax of the model's logits either way."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    from components.train import update

    torch.manual_seed(0)
    cfg = FalconH1Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        mamba_d_ssm=32,
        mamba_n_heads=4,
        mamba_d_head=8,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
        lm_head_multiplier=0.25,
    )
    model = FalconH1ForCausalLM(cfg).eval()
    assert update.output_head(model) is None
    _logprobs_against_the_models_logits(model, 64)


def test_deepspeed_is_imported_without_mlflow():
    """DeepSpeed's autotuner imports mlflow where installed (1.3 s of the train worker's start-up
    on 2 cores): import_deepspeed hides it for that import only, and mlflow imports normally after."""
    import subprocess
    import sys

    code = (
        "import sys; from components.train.distributed import import_deepspeed; "
        "ds = import_deepspeed(); assert ds is sys.modules['deepspeed']; "
        "assert 'mlflow' not in sys.modules, 'deepspeed pulled in mlflow'; "
        "import importlib.util; "
        "ok = importlib.util.find_spec('mlflow') is None or __import__('mlflow') is not None; "
        "print('ok', ok)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok True" in res.stdout, res.stderr[-2000:]


def test_old_logprobs_come_from_the_sampler_only_where_they_are_the_trainers(train_cfg):
    """train.old_logprobs auto takes the sampler's recorded logprobs as PPO's old ones only in
    the setting where the two are equal to float precision, as the rollouts' manifest records
    it (not as this process guesses it); every other setting recomputes."""
    from components.core.errors import Problems, StageError
    from components.train.checks import check_train

    cfg = train_cfg
    decide = from_rollout
    fp32 = {
        "logprob_definition": LOGPROB_DEFINITION,
        "backend": "transformers",
        "dtype": "float32",
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    assert decide(cfg, fp32, 0)
    assert not decide(cfg, fp32, 1)  # stale rollouts: another policy sampled them
    why = train_inputs.Why
    assert train_inputs.decide_old_logprobs(cfg, fp32, 0).why is why.EQUAL
    assert train_inputs.decide_old_logprobs(cfg, fp32, 1).why is why.STALE
    for key, value in [
        ("logprob_definition", "vllm-processed"),
        ("dtype", "bfloat16"),  # a bf16 sampler, whatever this config says now
        ("dtype", None),  # rollouts of an rlvr that did not record it
        ("device", "elsewhere"),
    ]:
        assert not decide(cfg, {**fp32, key: value}, 0), (key, value)
    for section, key, value in [
        ("train", "rollout_correction", "tis"),
        ("train", "forking_top_rho", 0.2),
        ("train", "old_logprobs", "recompute"),
    ]:
        old = getattr(getattr(cfg, section), key)
        setattr(getattr(cfg, section), key, value)
        assert not decide(cfg, fp32, 0), (section, key)
        setattr(getattr(cfg, section), key, old)

    cfg.train.old_logprobs = "rollout"  # asked for: taken off-policy too (verl's bypass mode)
    assert decide(cfg, {**fp32, "dtype": "bfloat16"}, 2)
    with pytest.raises(StageError, match="train.old_logprobs: rollout needs"):
        decide(cfg, {**fp32, "logprob_definition": "vllm-processed"}, 0)
    cfg.generate.dtype = "bfloat16"  # allowed, but said: the ratio is against the bf16 policy
    problems = Problems()
    check_train(cfg, problems)
    assert not problems.errors
    assert any("a bfloat16 sampler" in str(w) for w in problems.warnings), problems.warnings
    cfg.train.rollout_correction = "tis"
    problems = Problems()
    check_train(cfg, problems)
    assert any(
        "train.old_logprobs" in str(e) and "rollout_correction" in str(e) for e in problems.errors
    ), problems.errors


def from_rollout(cfg, sampled: dict, staleness_max: float) -> bool:
    """Whether the iteration's old logprobs are decided to be the sampler's."""
    choice = train_inputs.decide_old_logprobs(cfg, sampled, staleness_max)
    return choice.source is train_inputs.OldLogprobs.ROLLOUT


def sampled_stats(cfg, iteration: int) -> dict:
    """What iteration's rollouts record of how their logprobs were computed (the manifest)."""
    return train_inputs.generation_stats(store_for(cfg), RunLayout.of(cfg).rollouts(iteration))


def test_auto_recomputes_when_its_check_finds_the_sampler_off(train_cfg, monkeypatch):
    """The trainer's own pass on one micro-batch checks the sampler's logprobs every iteration;
    past the tolerance, auto recomputes them all after all."""
    from components.train import update

    cfg = train_cfg
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    cfg.train.micro_batch_tokens = 64  # several micro-batches: auto checks only the first
    monkeypatch.setattr(update, "ROLLOUT_LOGPROB_TOLERANCE", -1.0)  # any difference is too much
    stats = train.run(cfg, 0)["stats"]
    assert stats["train/old_logprobs_from_rollout"] == 0.0
    assert stats["train/rollout_lp_diff_max"] < 1e-4  # now over every row


def test_the_sampler_logprobs_train_as_the_recomputed_ones(train_cfg):
    """One iteration with old logprobs from the sampler and one recomputed: the same update to
    float precision (the first mini-batch's ratio is 1 within 1e-5 either way), and only the
    recomputing side spends the no-grad pass and measures the sampler's mismatch."""
    cfg = train_cfg
    cfg.train.micro_batch_tokens = 64  # several micro-batches: auto checks only the first
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    stats = {}
    for mode in ("auto", "recompute"):
        cfg.train.old_logprobs = mode
        stats[mode] = train.run(cfg, 0, force=True)["stats"]
    assert stats["auto"]["train/old_logprobs_from_rollout"] == 1.0
    assert stats["recompute"]["train/old_logprobs_from_rollout"] == 0.0
    # auto checked the sampler's on one micro-batch of its own pass; recompute on all rows
    assert stats["auto"]["train/rollout_lp_diff_max"] < 1e-4
    assert stats["recompute"]["train/rollout_lp_diff_max"] < 1e-4
    # Both losses are token means of ratio x advantage, with the old logprobs apart by at most the
    # contract's 1e-4 per token (4.8e-7 measured) and |advantage| <= sqrt(n - 1) < 3 for a group
    # of n <= 8: so within 3e-4 on any machine (1.9e-8 measured here).
    assert stats["auto"]["train/loss"] == pytest.approx(stats["recompute"]["train/loss"], abs=3e-4)
