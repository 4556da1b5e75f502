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
<store>/<run-id>/eval_shards/00001/          sharded evaluation: each shard's scored samples
<store>/<run-id>/eval_scratch/00001-i-of-S/  an evaluation shard's scratch samples
<store>/<run-id>/report/                     the run dashboard and report (`rlvr report`)
<store>/<run-id>/tensorboard/<task>/         TensorBoard event files (components/core/tracking.py)
<store>/<run-id>/status/<attempt>/           an attempt's failure markers and plan (warm.RunStatus)
<store>/<run-id>/status/stopped.json         the stop record (components/core/run_control.py)
<store>/<run-id>/status/retention/           readers' leases and sweepers' intents (retention.py)
<store>/<run-id>/status/segments/00001.json  the claim of a chained segment's submission
<store>/<run-id>/status/channel/train.json   the weight channel's address (components/model)
<run's local directory>/logs/segment-00000/  the local runner's task logs, per segment
<run's local directory>/kfp/                 the local KFP runner's pipeline root

Every path under a run is spelled here, and only here (tests/repo/test_run_paths.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.core.config import RunConfig
from components.core.store import Store, get_store, join

CHECKPOINTS = "checkpoints"
TRAIN_STATE = "train_state"
ITERATIONS = "iterations"
ROLLOUTS = "rollouts"
SCORED = "scored"
EVALS = "evals"
EVAL_SHARDS = "eval_shards"
STATUS = "status"
"""The run's directories that more than one method names, or that readers parse."""


def _n(i: int) -> str:
    return f"{i:05d}"


@dataclass(frozen=True)
class RunLayout:
    root: str

    @classmethod
    def of(cls, cfg: RunConfig) -> RunLayout:
        return cls(join(cfg.run.store, cfg.run_id))

    @classmethod
    def above(cls, uri: str) -> RunLayout:
        """The run of a numbered artifact, `<run>/<kind>/<n>` (a checkpoint, a train state)."""
        return cls(uri.rstrip("/").rsplit("/", 2)[0])

    @staticmethod
    def retainable(uri: str) -> bool:
        """`<run>/checkpoints/<n>` or `<run>/train_state/<n>`: what retention may delete."""
        parts = uri.rstrip("/").rsplit("/", 2)
        return len(parts) == 3 and parts[1] in (CHECKPOINTS, TRAIN_STATE) and parts[2].isdigit()

    @staticmethod
    def checkpoint_number(uri: str) -> int | None:
        """n of `.../checkpoints/<n>`; None for any other directory."""
        parts = uri.rstrip("/").rsplit("/", 2)[-2:]
        if len(parts) == 2 and parts[0] == CHECKPOINTS and parts[1].isdigit():
            return int(parts[1])
        return None

    @staticmethod
    def base_beside(checkpoint_uri: str) -> str:
        """The base policy numbered beside a checkpoint: `<dir>/00000` for `<dir>/<n>`."""
        return join(checkpoint_uri.rstrip("/").rsplit("/", 1)[0], _n(0))

    @property
    def run_yaml(self) -> str:
        return join(self.root, "run.yaml")

    @property
    def train_data(self) -> str:
        return join(self.root, "data", "train")

    def eval_data(self, name: str) -> str:
        return join(self.root, "data", "eval", name)

    @property
    def checkpoints_dir(self) -> str:
        """Every checkpoint, one numbered directory each."""
        return join(self.root, CHECKPOINTS)

    def checkpoint(self, i: int) -> str:
        return join(self.checkpoints_dir, _n(i))

    @property
    def iterations_dir(self) -> str:
        """Every iteration's rollouts, scored samples, prompt stats and train figures."""
        return join(self.root, ITERATIONS)

    def iteration_output(self, i: int, kind: str) -> str:
        """Iteration i's `rollouts` (ROLLOUTS) or `scored` (SCORED) samples."""
        return join(self.iterations_dir, _n(i), kind)

    def rollouts(self, i: int) -> str:
        return self.iteration_output(i, ROLLOUTS)

    def scored(self, i: int) -> str:
        return self.iteration_output(i, SCORED)

    def prompt_stats(self, i: int) -> str:
        return join(self.iterations_dir, _n(i), "prompt_stats")

    @property
    def train_state_dir(self) -> str:
        return join(self.root, TRAIN_STATE)

    def train_state(self, i: int) -> str:
        return join(self.train_state_dir, _n(i))

    def train_metrics(self, i: int) -> str:
        return join(self.iterations_dir, _n(i), "train")

    @property
    def evals_dir(self) -> str:
        return join(self.root, EVALS)

    def evals(self, i: int) -> str:
        return join(self.evals_dir, _n(i))

    def eval_metrics(self, i: int) -> str:
        """Checkpoint i's evaluation figures over every eval set."""
        return join(self.evals(i), "metrics.json")

    def eval_set(self, i: int, name: str) -> str:
        return join(self.evals(i), name)

    @property
    def eval_shards_dir(self) -> str:
        return join(self.root, EVAL_SHARDS)

    def eval_shards(self, i: int) -> str:
        """Checkpoint i's sharded evaluation: one `shard-i-of-S` per shard, then gathered."""
        return join(self.eval_shards_dir, _n(i))

    def eval_scratch(self, i: int, shard: int, num_shards: int) -> str:
        """Scratch samples of shard `shard` of checkpoint i's evaluation."""
        return join(self.root, "eval_scratch", f"{_n(i)}-{shard}-of-{num_shards}")

    @property
    def stage_outputs(self) -> tuple[str, ...]:
        """The directories under which every stage commits its outputs."""
        return (
            self.iterations_dir,
            self.checkpoints_dir,
            self.train_state_dir,
            self.evals_dir,
            self.eval_shards_dir,
        )

    @property
    def report(self) -> str:
        return join(self.root, "report")

    @property
    def tensorboard_dir(self) -> str:
        return join(self.root, "tensorboard")

    def tensorboard(self, task: str) -> str:
        return join(self.tensorboard_dir, task)

    def status(self, attempt: str) -> str:
        """One attempt's markers (components/core/warm.py, RunStatus)."""
        return join(self.root, STATUS, attempt)

    @property
    def stop_record(self) -> str:
        return join(self.root, STATUS, "stopped.json")

    @property
    def retention_leases(self) -> str:
        """Readers' leases on artifacts retention may delete."""
        return join(self.root, STATUS, "retention", "leases")

    @property
    def retention_intents(self) -> str:
        """Sweepers' intents to delete an artifact."""
        return join(self.root, STATUS, "retention", "retiring")

    def segment_claim(self, segment: int) -> str:
        """The record that chained segment `segment` was submitted (pipelines/chain.py)."""
        return join(self.root, STATUS, "segments", f"{_n(segment)}.json")

    @property
    def channel_address(self) -> str:
        """Where train's weight channel says how to reach it (components/model/channel.py)."""
        return join(self.root, STATUS, "channel", "train.json")

    def segment_logs(self, segment: int) -> str:
        """The local runner's task logs of one segment."""
        return join(self.root, "logs", f"segment-{_n(segment)}")

    @property
    def local_kfp(self) -> str:
        """The local KFP runner's pipeline root."""
        return join(self.root, "kfp")


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
