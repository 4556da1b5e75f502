"""Shared fixtures: a tiny offline workspace (model, tokenizer, datasets, config) and a real S3
server (moto's server mode on loopback, spoken to over HTTP by boto3)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.runs import REWARD_PLUGIN, free_port, write_config

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MAX_WORKERS = 4
"""pytest-xdist workers for `-n auto` (pyproject's addopts): one per core, at most this many.
Many tests start multi-process runs of their own (DeepSpeed ranks, the local runner's
workers), about 1-2 GB each, so more workers than this would only queue on memory."""


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """An untrained tiny Qwen2 policy plus small arithmetic train/eval sets (built once)."""
    from examples.arithmetic.data import write_datasets
    from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

    root = tmp_path_factory.mktemp("assets")
    tok = build_tokenizer()
    model = build_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    save_checkpoint(model, tok, root / "base")
    write_datasets(root, seed=0, n_train=120, n_eval=12)
    return root


@pytest.fixture
def train_cfg(tmp_path, tiny_assets):
    """A run config whose reward varies with the response, so an untrained policy has a
    gradient; two mini-batches, warmup and a cosine schedule."""
    from components.core.config import load_config

    plugin = tmp_path / "reward_plugin.py"
    plugin.write_text(REWARD_PLUGIN)
    path = write_config(
        tmp_path,
        tiny_assets,
        verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
        train={
            "lr": 1e-3,
            "micro_batch_tokens": 4096,
            "mini_batches": 2,
            "warmup_steps": 1,
            "lr_schedule": "cosine",
        },
    )
    return load_config(path)


@pytest.fixture
def workspace(tmp_path, tiny_assets) -> Path:
    return write_config(tmp_path, tiny_assets)


@pytest.fixture
def cfg(workspace):
    from components.core.config import load_config

    return load_config(workspace)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's S3 server on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket; AWS credentials come from the standard environment, as in production."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    name = f"rlvr-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture
def kfp_server():
    """The recording KFP API server (tests/support/kfp_api.py)."""
    from tests.support.kfp_api import FakeKFP

    server = FakeKFP()
    yield server
    server.server.shutdown()
