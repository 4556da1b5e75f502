"""A multi-node run config on a (pretend) cluster, and the segment arguments its train task gets."""

from __future__ import annotations

from components.core.config import RunConfig

SEGMENT_ARGS = ["--segment", "1", "--attempt", "run-abc"]


def cluster_cfg(tmp_path, api: str = "trainer", **train) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run": {
                "run_id": "Demo_Run.7",
                "store": str(tmp_path / "runs"),
                "iterations": 8,
                "segment_iterations": 4,
            },
            "model": {"base": "s3://b/base"},
            "data": {"train": "s3://b/train.parquet"},
            "train": {"nodes": 2, **train},
            "cluster": {
                "image_repo": "registry.example/rlvr",
                "image_tag": "1.2",
                "hf_token_secret": "hf-token",
                "stages": {"train": {"accelerator_count": 8, "cpu_limit": "96"}},
                "train_job": {"api": api, "env": {"NCCL_SOCKET_IFNAME": "eth0"}, "poll_s": 0.01},
            },
        }
    )
