"""Building runs for tests: a config over the tiny assets, a free loopback port, a varied reward
plugin, and one prepared update to compare across layouts."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import yaml
from safetensors.torch import load_file

from components.core.config import RunConfig, load_config
from components.core.layout import RunLayout
from components.model import run_setup


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
        "generate": {"n": 4, "max_new_tokens": 6, "transformers": {"batch_size": 32}},
        "verify": {"rewards": {"arithmetic": "math"}, "num_workers": 1, "timeout_s": 10},
        "train": {"lr": 1e-3, "micro_batch_tokens": 256},
        "evaluate": {"bootstrap_resamples": 50},
        # The tiny untrained policy rarely earns a reward, so its runs often have no signal,
        # which would stop them under health.stop_after (tests/e2e/test_run_health.py)
        "health": {"stop_after": 0},
    }
    for section, values in sections.items():
        if values is None:
            cfg.pop(section, None)
        else:
            cfg.setdefault(section, {}).update(values)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REWARD_PLUGIN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A deterministic, varied reward so an untrained policy still gets a gradient."""
    return (sum(map(ord, solution_str)) % 5) / 4.0
'''


def prepare_update(tmp_path, tiny_assets, **train) -> RunConfig:
    """Iteration 0's scored rollouts, ready for one update (one optimizer step)."""
    plugin = tmp_path / "reward_plugin.py"
    plugin.write_text(REWARD_PLUGIN)
    cfg = load_config(
        write_config(
            tmp_path,
            tiny_assets,
            verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
            train={"lr": 1e-3, "micro_batch_tokens": 4096, "mini_batches": 1, **train},
        )
    )
    from components.generate.stage import run as generate
    from components.verify.stage import run as verify

    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    return cfg


def one_update(cfg: RunConfig) -> tuple[dict, dict, dict]:
    """Checkpoint 1's weights, train state 1's tensors and metrics; then both are removed, so
    the next run computes the same update again."""
    layout = RunLayout.of(cfg)
    weights = load_file(f"{layout.checkpoint(1)}/model.safetensors")
    state = {}  # every rank's share of the state (each rank writes its own file)
    for shard in sorted(Path(layout.train_state(1)).glob("state-*.safetensors")):
        state.update(load_file(str(shard)))
    metrics = json.loads(Path(layout.checkpoint(1), "_SUCCESS").read_text())["stats"]
    shutil.rmtree(layout.checkpoint(1))
    shutil.rmtree(layout.train_state(1))
    return weights, state, metrics
