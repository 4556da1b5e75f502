"""Where a run's artifacts live (docs/contracts.md, "Run layout").

<store>/<run-id>/run.yaml
<store>/<run-id>/data/train/                the train set, copied in
<store>/<run-id>/data/eval/<name>/           each eval set, copied in
<store>/<run-id>/checkpoints/00000/          the base policy, copied in
<store>/<run-id>/iterations/00000/rollouts/  part-*.parquet from generate (policy 00000)
<store>/<run-id>/iterations/00000/scored/    part-*.parquet from verify
<store>/<run-id>/iterations/00000/prompt_stats/  per-prompt attempts/successes, from verify
<store>/<run-id>/checkpoints/00001/          written by train in iteration 00000
<store>/<run-id>/train_state/00001/          optimizer state and step counters
<store>/<run-id>/evals/00001/<name>/         samples.parquet, metrics.json (00000 is the base)
<store>/<run-id>/report/                     the run dashboard and report (`rlvr report`)
<store>/<run-id>/tensorboard/<task>/         TensorBoard event files (components/core/tracking.py)
"""

from __future__ import annotations

from dataclasses import dataclass

from components.core.config import RunConfig
from components.core.store import Store, get_store, join


def _n(i: int) -> str:
    return f"{i:05d}"


@dataclass(frozen=True)
class RunLayout:
    root: str

    @classmethod
    def of(cls, cfg: RunConfig) -> RunLayout:
        return cls(join(cfg.run.store, cfg.run_id))

    @property
    def run_yaml(self) -> str:
        return join(self.root, "run.yaml")

    @property
    def train_data(self) -> str:
        return join(self.root, "data", "train")

    def eval_data(self, name: str) -> str:
        return join(self.root, "data", "eval", name)

    def checkpoint(self, i: int) -> str:
        return join(self.root, "checkpoints", _n(i))

    def rollouts(self, i: int) -> str:
        return join(self.root, "iterations", _n(i), "rollouts")

    def scored(self, i: int) -> str:
        return join(self.root, "iterations", _n(i), "scored")

    def prompt_stats(self, i: int) -> str:
        return join(self.root, "iterations", _n(i), "prompt_stats")

    def train_state(self, i: int) -> str:
        return join(self.root, "train_state", _n(i))

    def train_metrics(self, i: int) -> str:
        return join(self.root, "iterations", _n(i), "train")

    def evals(self, i: int) -> str:
        return join(self.root, "evals", _n(i))

    def eval_set(self, i: int, name: str) -> str:
        return join(self.root, "evals", _n(i), name)


def store_for(cfg: RunConfig) -> Store:
    return get_store(cfg.run.store, cfg.run.s3_endpoint_url)


def committed_indices(store: Store, uri: str) -> list[int]:
    """Numeric sub-directories of `uri` that hold a committed `_SUCCESS` directly."""
    out = []
    for f in store.list_files(uri):
        parts = f.split("/")
        if len(parts) == 2 and parts[1] == "_SUCCESS" and parts[0].isdigit():
            out.append(int(parts[0]))
    return sorted(out)
