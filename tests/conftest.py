"""Shared fixtures: a tiny offline workspace (model, tokenizer, datasets, config) and a real S3
server (moto's server mode on loopback, spoken to over HTTP by boto3)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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


def write_config(root: Path, assets: Path, **sections) -> Path:
    """A run config under `root` using the tiny assets; `sections` override per section."""
    cfg = {
        "run": {"store": str(root / "runs"), "run_id": "t", "iterations": 2, "seed": 0},
        "model": {"base": str(assets / "base")},
        "data": {
            "train": str(assets / "train.parquet"),
            "eval": [{"name": "heldout", "path": str(assets / "eval.parquet"), "n": 4}],
            "prompts_per_iteration": 6,
        },
        "generate": {"n": 4, "max_new_tokens": 6, "batch_size": 32},
        "verify": {"rewards": {"arithmetic": "math"}, "num_workers": 1, "timeout_s": 10},
        "train": {"lr": 1e-3, "micro_batch_tokens": 256},
        "evaluate": {"bootstrap_resamples": 50},
    }
    for section, values in sections.items():
        if values is None:
            cfg.pop(section, None)
        else:
            cfg.setdefault(section, {}).update(values)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def workspace(tmp_path, tiny_assets) -> Path:
    return write_config(tmp_path, tiny_assets)


@pytest.fixture
def cfg(workspace):
    from components.core.config import load_config

    return load_config(workspace)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's S3 server on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
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
