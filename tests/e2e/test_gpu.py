"""The train stage on a CUDA GPU: DeepSpeed over NCCL, bf16, ZeRO-3, through the command a
TrainJob's pods run. Skipped where torch sees no GPU (CI has none); on a GPU node run

    python -m pytest -q -o addopts=-ra tests/e2e/test_gpu.py

(`-o addopts=-ra`: without pytest-xdist, which a GPU image may lack).

1. fp32 on the GPU computes the update the CPU computes (the same rows, the same loss; only
   kernels differ): Adam's first moment, (1 - beta1) x the clipped gradient, to 1e-4 relative
   (fp32 matmuls with TF32 off, torch's default, differ from CPU's by summation order alone,
   ~1e-6 per op, amplified a little through one backward).
2. bf16 at ZeRO-3, launched through the multi-node pod entry (components.train.node with the
   variables Kubeflow Trainer sets, one node of one GPU, NCCL), equals the stage's own one-GPU
   launch at ZeRO-1 bf16: both compute forward and backward in bf16 from fp32 masters, so the
   update differs by how gradients are accumulated and reduced in each ZeRO stage, which 2e-2
   relative on the first moment allows (on the whole flattened vector, not per element: one
   bf16 rounding is 2^-8 = 4e-3; bf16 against fp32 on this model differs by 5.9e-3, measured on
   CPU). The fp32 masters are compared, from the train state: checkpoint 1 is the handoff, in
   the sampler's dtype (bf16 on a GPU, fp32 on a CPU), and the test checks that too.

The weight updates are compared by direction (cosine), not by relative error: Adam's first step
is about lr x sign(gradient), so an element whose gradient is within rounding of zero flips its
whole step, and a few such elements make the relative error large while the update is the same
(bf16 against fp32 on CPU: 0.28% of the steps flip, relative error 0.10, cosine 0.995). Each
flipped element lowers the cosine by about 2 / (number of elements): 0.999 allows 0.05% of them
(fp32), 0.98 allows 1% (bf16).

3. Generate's decode steps replayed as CUDA graphs (components/model/graph_decode.py) sample
   what the eager steps on the growing cache sample, in fp32 on the same GPU, up to rounding (the
   batch-invariance contract of docs/contracts.md); the graphs were captured, one per bucket the
   rows passed through, none given up; a second call replays them and samples the same again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.core.config import RunConfig
from components.core.layout import RunLayout
from components.train import jobspec
from tests.support.runs import free_port, one_update, prepare_update

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none); run on a GPU node"
)


@pytest.fixture
def prepared(tmp_path, tiny_assets) -> RunConfig:
    return prepare_update(tmp_path, tiny_assets, processes=1)


def _train(cfg: RunConfig, tmp_path: Path, *sets: str, env: dict | None = None) -> tuple:
    config = tmp_path / "resolved.json"
    config.write_text(cfg.to_json())
    args = [sys.executable, "-m", "components.train", str(config), "-i", "0"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return one_update(cfg)


def _rel(a: dict, b: dict, keys: list[str]) -> float:
    va = torch.cat([a[k].double().flatten() for k in keys])
    vb = torch.cat([b[k].double().flatten() for k in keys])
    return float((va - vb).norm() / vb.norm())


def _masters(state: dict) -> dict:
    """The fp32 master weights of a train state, by parameter name."""
    return {k.removeprefix("master."): v for k, v in state.items() if k.startswith("master.")}


def _cos(a: dict, b: dict, base: dict) -> float:
    """Cosine of the two updates (weights minus the base's), over all parameters."""
    va = torch.cat([(a[k] - base[k]).double().flatten() for k in sorted(base)])
    vb = torch.cat([(b[k] - base[k]).double().flatten() for k in sorted(base)])
    return float(va @ vb / (va.norm() * vb.norm()))


def test_gpu_fp32_update_equals_the_cpu_update(prepared, tmp_path):
    base = load_file(f"{RunLayout.of(prepared).checkpoint(0)}/model.safetensors")
    cpu = _train(prepared, tmp_path, "train.dtype=float32", env={"CUDA_VISIBLE_DEVICES": ""})
    gpu = _train(prepared, tmp_path, "train.dtype=float32")
    moments = sorted(k for k in cpu[1] if k.startswith("exp_avg."))
    assert moments and gpu[1].keys() == cpu[1].keys()
    assert _rel(gpu[1], cpu[1], moments) < 1e-4
    # the fp32 masters: the checkpoint is the handoff, in the sampler's dtype (bf16 on a GPU)
    assert _cos(_masters(gpu[1]), _masters(cpu[1]), base) > 0.999
    assert gpu[2]["train/loss"] == pytest.approx(cpu[2]["train/loss"], rel=1e-4)


def test_bf16_zero3_through_the_trainjob_pod_entry_equals_one_gpu_zero1(prepared, tmp_path):
    cfg = prepared
    base = load_file(f"{RunLayout.of(cfg).checkpoint(0)}/model.safetensors")
    local = _train(cfg, tmp_path, "train.dtype=bfloat16", "train.zero_stage=1")

    pod = RunConfig.model_validate_json(cfg.to_json())
    pod.train.dtype, pod.train.zero_stage = "bfloat16", 3
    job = jobspec.train_job(pod, ["--iteration", "0"], name="j", namespace="rlvr", iterations=1)
    trainer = job["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    env.update(
        PET_NNODES="1",
        PET_NPROC_PER_NODE="1",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(free_port()),
    )
    ran = subprocess.run(
        [sys.executable, *trainer["command"][1:]],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    pod_update = one_update(cfg)

    for weights, state, metrics in (local, pod_update):
        assert metrics["train/world_size"] == 1
        # the handoff in the sampler's dtype (generate.dtype auto: bf16 on a GPU), the fp32
        # masters in the train state
        assert all(v.dtype == torch.bfloat16 for v in weights.values())
        assert all(v.dtype == torch.float32 for v in _masters(state).values())
        assert any(not torch.equal(weights[k], base[k].bfloat16()) for k in base)
    moments = sorted(k for k in local[1] if k.startswith("exp_avg."))
    assert moments and pod_update[1].keys() == local[1].keys()
    assert _rel(pod_update[1], local[1], moments) < 2e-2
    # the step itself, not the shared base
    assert _cos(_masters(pod_update[1]), _masters(local[1]), base) > 0.98
    assert pod_update[2]["train/loss"] == pytest.approx(local[2]["train/loss"], rel=1e-2)


def test_decode_graphs_sample_what_the_eager_steps_sample(tiny_assets):
    from components.model.checkpoint import load_policy
    from components.model.hf_backend import TransformersBackend
    from tests.support.invariance import assert_equal_up_to_rounding
    from tests.support.sampling import collect, early_stop_spec, keyed_rows, varied_requests

    model, tok = load_policy(tiny_assets / "base", dtype=torch.float32, device="cuda")
    spec = early_stop_spec(tok, 8, 24)
    reqs = varied_requests(tok, spec.n)
    eager = collect(TransformersBackend(model, tok, device="cuda"), reqs, spec)
    backend = TransformersBackend(model, tok, device="cuda", graphs=True)
    graphed = collect(backend, reqs, spec)
    phases = backend.clock.take()
    assert "graphs_off" not in phases and phases["graph_captures"] >= 2, phases
    cpu_model, _ = load_policy(tiny_assets / "base")
    assert_equal_up_to_rounding(
        keyed_rows(eager, reqs), keyed_rows(graphed, reqs), cpu_model, spec, 0, 0
    )
    again = collect(backend, reqs, spec)
    assert backend.clock.take()["graph_captures"] == 0  # replayed only
    assert {k: s.response_token_ids for k, s in again.items()} == {
        k: s.response_token_ids for k, s in graphed.items()
    }
