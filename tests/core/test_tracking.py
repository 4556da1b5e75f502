"""Experiment tracking (components/core/tracking.py): TensorBoard files in the run read back with
TensorBoard's own reader, a real MLflow file store, W&B offline (when installed), backends that
fail without failing a stage, and the hook in the warm workers (components/core/warm.py).

Fast and offline: every store is under tmp_path (or the loopback moto server).
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from components.core.config import RunConfig
from components.core.errors import Problems
from components.core.timing import Timeline
from components.core.tracking import (
    MultiTracker,
    StageTracking,
    check_tracking,
    event_file_name,
    make_tracker,
    safe_name,
    step_figures,
    wandb_run_id,
)
from components.core.warm import Stage, run_once, serve_stage

RUN_ID = "r1"


def _cfg(store: str, **tracking) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run": {"run_id": RUN_ID, "store": store, "wait_timeout_s": 5},
            "model": {"base": "unused"},
            "data": {"train": "unused.parquet"},
            "tracking": tracking,
        }
    )


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} as TensorBoard itself reads the directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# --- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_writes_one_file_per_step_into_the_run(tmp_path):
    cfg = _cfg(str(tmp_path))
    tracker = make_tracker(cfg, "train")
    assert list(tracker.backends) == ["tensorboard"]  # the default
    for step in range(3):
        tracker.log({"train/loss": 1.5 - step / 4, "eval/heldout/pass@1": step / 8}, step)
    tracker.close()

    logdir = tmp_path / RUN_ID / "tensorboard" / "train"
    assert sorted(p.name for p in logdir.iterdir()) == [event_file_name(s) for s in range(3)]
    assert event_file_name(3) == "events.out.tfevents.00000003.rlvr"
    assert _scalars(logdir) == {
        "train/loss": [(0, 1.5), (1, 1.25), (2, 1.0)],
        "eval/heldout/pass_at_1": [(0, 0.0), (1, 0.125), (2, 0.25)],
    }


def test_a_rerun_of_a_step_replaces_its_point(tmp_path):
    cfg = _cfg(str(tmp_path))
    first = make_tracker(cfg, "train")
    first.log({"train/loss": 2.0}, 0)
    first.log({"train/loss": 1.0}, 1)
    first.close()
    again = make_tracker(cfg, "train")  # a later process reruns iteration 1
    again.log({"train/loss": 0.75}, 1)
    again.close()
    logdir = tmp_path / RUN_ID / "tensorboard" / "train"
    assert len(list(logdir.iterdir())) == 2
    assert _scalars(logdir) == {"train/loss": [(0, 2.0), (1, 0.75)]}


def test_shards_of_a_stage_are_separate_runs(tmp_path):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    cfg = _cfg(str(tmp_path))
    for shard, samples in enumerate((8.0, 4.0)):
        tracker = make_tracker(cfg, f"generate-shard-{shard:05d}-of-00002")
        tracker.log({"rollout/samples": samples}, 0)
        tracker.close()
    mux = EventMultiplexer().AddRunsFromDirectory(str(tmp_path / RUN_ID / "tensorboard"))
    mux.Reload()
    runs = sorted(mux.Runs())
    assert runs == ["generate-shard-00000-of-00002", "generate-shard-00001-of-00002"]
    assert [[(e.step, e.value) for e in mux.Scalars(run, "rollout/samples")] for run in runs] == [
        [(0, 8.0)],
        [(0, 4.0)],
    ]


def test_tensorboard_files_go_through_the_store_to_s3(s3_bucket, tmp_path):
    from components.core.store import get_store

    cfg = _cfg(f"s3://{s3_bucket}/runs")
    tracker = make_tracker(cfg, "verify")
    tracker.log({"verify/reward_mean": 0.5}, 4)
    tracker.close()
    store, logdir = get_store(cfg.run.store), f"s3://{s3_bucket}/runs/{RUN_ID}/tensorboard/verify"
    assert store.list_files(logdir) == [event_file_name(4)]
    store.download_file(f"{logdir}/{event_file_name(4)}", tmp_path / "tb" / event_file_name(4))
    assert _scalars(tmp_path / "tb") == {"verify/reward_mean": [(4, 0.5)]}


def test_tensorboard_reads_the_run_straight_from_s3(s3_bucket, s3_server, monkeypatch):
    """What `tensorboard --logdir s3://…/tensorboard` (and Kubeflow's Tensorboard resource)
    does: TensorBoard's own S3 reader (boto3, endpoint from S3_ENDPOINT) on the run's store."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    cfg = _cfg(f"s3://{s3_bucket}/runs")
    for task, value in (("train", 0.25), ("verify", 0.5)):
        tracker = make_tracker(cfg, task)
        tracker.log({f"{task}/x": value}, 3)
        tracker.close()
    monkeypatch.setenv("S3_ENDPOINT", s3_server)
    mux = EventMultiplexer().AddRunsFromDirectory(f"s3://{s3_bucket}/runs/{RUN_ID}/tensorboard")
    mux.Reload()
    assert sorted(mux.Runs()) == ["train", "verify"]
    assert [(e.step, e.value) for e in mux.Scalars("train", "train/x")] == [(3, 0.25)]
    assert [(e.step, e.value) for e in mux.Scalars("verify", "verify/x")] == [(3, 0.5)]


def test_names_tensorboard_and_mlflow_accept():
    assert safe_name("eval/heldout/pass@16_ci95_lo") == "eval/heldout/pass_at_16_ci95_lo"
    assert safe_name("verify/reward_mean/my source:v2") == "verify/reward_mean/my_source_v2"
    assert safe_name("train/loss") == "train/loss"


# --- MLflow -----------------------------------------------------------------------------------


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed")
    # MLflow 3 keeps the file store only on request; it is the store that needs no server.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return (tmp_path / "mlruns").as_uri()


def _mlflow_runs(uri: str) -> tuple[object, dict[str, object]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rlvr")
    runs = client.search_runs([exp.experiment_id])
    return client, {r.data.tags.get("rlvr.task", "<parent>"): r for r in runs}


def test_mlflow_parent_run_and_one_child_per_task(tmp_path, mlflow_uri):
    cfg = _cfg(str(tmp_path), backends=["mlflow"], mlflow_tracking_uri=mlflow_uri)
    train = make_tracker(cfg, "train")
    train.log({"train/loss": 2.0, "eval/heldout/pass@1": 0.25}, 0)
    train.log({"train/loss": 1.0}, 1)
    train.log({"train/loss": 9.0}, 1)  # a rerun of iteration 1: not a second point
    train.close()
    verify = make_tracker(cfg, "verify")
    verify.log({"verify/reward_mean": 0.5}, 0)
    verify.close()
    assert list(train.backends) == list(verify.backends) == []  # closed

    client, runs = _mlflow_runs(mlflow_uri)
    assert set(runs) == {"<parent>", "train", "verify"}
    parent = runs["<parent>"]
    assert parent.info.run_name == RUN_ID and parent.data.tags["rlvr.run_id"] == RUN_ID
    for task in ("train", "verify"):
        child = runs[task]
        assert child.info.run_name == task and child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["rlvr.run_id"] == RUN_ID
    history = client.get_metric_history(runs["train"].info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 2.0), (1, 1.0)]
    history = client.get_metric_history(runs["train"].info.run_id, "eval/heldout/pass_at_1")
    assert [(m.step, m.value) for m in history] == [(0, 0.25)]


def test_the_health_verdict_tags_the_mlflow_runs_when_it_changes(tmp_path, mlflow_uri):
    cfg = _cfg(str(tmp_path), backends=["mlflow"], mlflow_tracking_uri=mlflow_uri)
    stage = FakeStage(cfg, "train")
    tracking = StageTracking(stage)
    verdicts = ["healthy", "warning", "collapsed"]
    for i, verdict in enumerate(verdicts):
        stats = {"train/loss": 1.0, "health": {"verdict": verdict}, "health/stop": 0.0}
        tracking.after_step(i, {"skipped": False, "stats": stats})
    tracking.close()
    client, runs = _mlflow_runs(mlflow_uri)
    assert runs["<parent>"].data.tags["rlvr.health"] == "collapsed"
    assert runs["train"].data.tags["rlvr.health"] == "collapsed"
    history = client.get_metric_history(runs["train"].info.run_id, "health/stop")
    assert [m.step for m in history] == [0, 1, 2]


def test_mlflow_a_later_segment_continues_the_same_runs(tmp_path, mlflow_uri):
    cfg = _cfg(str(tmp_path), backends=["mlflow"], mlflow_tracking_uri=mlflow_uri)
    first = make_tracker(cfg, "train")
    first.log({"train/loss": 2.0}, 0)
    first.log({"train/loss": 1.0}, 1)
    first.close()
    client, runs = _mlflow_runs(mlflow_uri)
    ids = {k: r.info.run_id for k, r in runs.items()}

    second = make_tracker(cfg, "train")  # a new process: the next segment, or a restart
    second.log({"train/loss": 7.0}, 1)  # rerun of an iteration already in the history
    second.log({"train/loss": 0.5, "train/kl": 0.125}, 2)
    assert client.get_run(ids["train"]).info.status == "RUNNING"
    second.close()

    _, runs = _mlflow_runs(mlflow_uri)
    assert {k: r.info.run_id for k, r in runs.items()} == ids
    history = client.get_metric_history(ids["train"], "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 2.0), (1, 1.0), (2, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(ids["train"], "train/kl")] == [
        (2, 0.125)
    ]


def test_mlflow_tracking_uri_from_the_environment(tmp_path, mlflow_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    tracker = make_tracker(_cfg(str(tmp_path), backends=["mlflow"]), "train")
    assert list(tracker.backends) == ["mlflow"]
    tracker.log({"train/loss": 1.0}, 0)
    tracker.close()
    assert set(_mlflow_runs(mlflow_uri)[1]) == {"<parent>", "train"}


# --- W&B --------------------------------------------------------------------------------------


def test_wandb_offline_one_run_per_task_resumed_by_id(tmp_path, monkeypatch):
    if not _importable("wandb"):
        pytest.skip("wandb is not installed (pip install -e '.[wandb]'); not a dev dependency")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    cfg = _cfg(str(tmp_path), backends=["wandb"], wandb_mode="offline")
    for segment in range(2):  # the second resumes the first's run
        tracker = make_tracker(cfg, "train")
        assert list(tracker.backends) == ["wandb"]
        tracker.log({"train/loss": 1.0 / (segment + 1), "eval/heldout/pass@1": 0.5}, segment)
        tracker.close()
        # W&B names an offline run's directory by the second it started: two in one second
        # would share one directory (the cause of a flake), and a process takes longer anyway.
        time.sleep(1.1)
    run_id = wandb_run_id(RUN_ID, "train")
    assert run_id == wandb_run_id(RUN_ID, "train") != wandb_run_id(RUN_ID, "verify")
    runs = sorted((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2, runs  # one directory per process, both of the same W&B run
    record = b"".join(p.read_bytes() for r in runs for p in r.glob("*.wandb"))
    for text in (RUN_ID, "train/loss", "eval/heldout/pass@1", "iteration"):
        assert text.encode() in record, text


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --- failing backends -------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again once the socket is


def test_an_unreachable_mlflow_server_warns_and_the_rest_still_logs(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg = _cfg(str(tmp_path), backends=["tensorboard", "mlflow"], mlflow_tracking_uri=uri)
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        tracker = make_tracker(cfg, "train")
        tracker.log({"train/loss": 1.0}, 0)
        tracker.close()
    assert list(tracker.backends) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "mlflow is off" in warnings[0], warnings
    assert "MLFLOW_TRACKING_URI" in warnings[0]
    logdir = tmp_path / RUN_ID / "tensorboard" / "train"
    assert _scalars(logdir) == {"train/loss": [(0, 1.0)]}


def test_a_missing_package_warns_with_the_install_command(tmp_path, monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    cfg = _cfg(str(tmp_path), backends=["wandb"])
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        tracker = make_tracker(cfg, "train")
        tracker.log({"train/loss": 1.0}, 0)
        tracker.close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "wandb is off" in warning and "pip install wandb" in warning


@pytest.mark.parametrize("close_on_drop", [True, False])
def test_a_backend_failing_mid_run_is_warned_about_once_and_dropped(close_on_drop, caplog):
    class Broken:
        calls = closes = 0

        def log(self, figures, step):
            Broken.calls += 1
            raise ConnectionError("server went away")

        def close(self):
            Broken.closes += 1
            raise ConnectionError("still away")

    Broken.close_on_drop = close_on_drop  # MLflow's tracker: False (its server just failed)
    tracker = MultiTracker({"mlflow": Broken()})
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        for step in range(3):
            tracker.log({"train/loss": 1.0}, step)
        tracker.close()
    assert Broken.calls == 1
    assert Broken.closes == (1 if close_on_drop else 0)  # never twice, never after the drop
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "ConnectionError: server went away" in warning


def test_a_backend_whose_close_fails_is_closed_once(caplog):
    class Sticky:
        closes = 0

        def log(self, figures, step):
            pass

        def close(self):
            Sticky.closes += 1
            raise TimeoutError("no answer")

    tracker = MultiTracker({"wandb": Sticky()})
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        tracker.log({"train/loss": 1.0}, 0)
        tracker.close()
    assert Sticky.closes == 1 and "TimeoutError: no answer" in caplog.records[0].getMessage()


def test_an_unwritable_store_does_not_fail_the_tracker(tmp_path, caplog):
    (tmp_path / RUN_ID).mkdir()
    (tmp_path / RUN_ID / "tensorboard").write_text("a file where the directory goes")
    tracker = make_tracker(_cfg(str(tmp_path)), "train")
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        tracker.log({"train/loss": 1.0}, 0)
        tracker.log({"train/loss": 1.0}, 1)
    assert len(caplog.records) == 1 and "tensorboard is off" in caplog.records[0].getMessage()


def test_no_backends_is_a_no_op(tmp_path):
    tracker = make_tracker(_cfg(str(tmp_path), backends=[]), "train")
    tracker.log({"train/loss": 1.0}, 0)
    tracker.close()
    assert not (tmp_path / RUN_ID).exists()


def test_rlvr_check_names_a_missing_tracking_package(tmp_path, monkeypatch):
    from components.core import tracking

    monkeypatch.setitem(tracking.PACKAGES, "wandb", ("rlvr_no_such_module", "pip install wandb"))
    cfg = _cfg(str(tmp_path), backends=["tensorboard", "wandb"])
    problems = Problems()
    check_tracking(cfg, problems)
    (error,) = problems.errors
    assert "pip install wandb" in str(error) and "tracking.backends" in str(error)
    problems = Problems()
    check_tracking(cfg, problems, for_cluster=True)  # the images matter there, not this machine
    assert not problems.errors and "stage images" in str(problems.warnings[0])
    problems = Problems()
    check_tracking(_cfg(str(tmp_path)), problems)
    assert not problems.items


# --- the hook in the warm workers --------------------------------------------------------------


class FakeStage(Stage):
    """A stage whose steps 'commit' given stats (or evaluate metrics)."""

    def __init__(self, cfg: RunConfig, task: str, *, rank: int = 0) -> None:
        self.cfg, self.task, self.rank = cfg, task, rank
        self.closed = False

    def needs(self, i: int) -> list[str]:
        return []

    def step(self, i: int, *, force: bool = False, timeline: Timeline) -> dict:
        if self.task.startswith("evaluate"):
            metrics = {
                "sets": {
                    "heldout": {"overall": {"pass@1": i / 4, "n": 8, "pass@1_ci95": [0.0, 0.5]}}
                }
            }
            stats = {"timeline": {"seconds": {"start": 3.0, "work": 2.0}}}  # as evaluate commits
            return {"skipped": False, "uri": "u", "stats": stats, "metrics": metrics}
        if i == 1 and not force:
            return {"skipped": True, "uri": "u"}
        # like train: the timeline goes into the manifest, the returned stats lack it
        timeline.add("work", 0.0, 0.5)
        timeline.add("commit", 0.5, 0.75)
        stats = {"train/loss": 1.0 + i, "train/engine": "deepspeed"}
        return {"skipped": False, "uri": "u", "stats": stats}

    def close(self) -> None:
        self.closed = True


def test_serve_logs_each_committed_step_once(tmp_path):
    cfg = _cfg(str(tmp_path))
    stage = FakeStage(cfg, "train")
    results = serve_stage(stage, range(3), cfg=cfg)
    assert [r["skipped"] for r in results] == [False, True, False] and stage.closed
    logdir = tmp_path / RUN_ID / "tensorboard" / "train"
    assert sorted(p.name for p in logdir.iterdir()) == [event_file_name(0), event_file_name(2)]
    assert _scalars(logdir) == {
        "train/loss": [(0, 1.0), (2, 3.0)],
        "time/train_s": [(0, 0.75), (2, 0.75)],
        "time/train_work_s": [(0, 0.5), (2, 0.5)],
    }
    # a one-step rerun (rlvr stage train -i 1 --force) adds its point
    run_once(FakeStage(cfg, "train"), 1, force=True)
    assert [s for s, _ in _scalars(logdir)["train/loss"]] == [0, 1, 2]


def test_evaluate_logs_its_metrics_at_the_checkpoint_index(tmp_path):
    cfg = _cfg(str(tmp_path))
    run_once(FakeStage(cfg, "evaluate"), 2)
    assert _scalars(tmp_path / RUN_ID / "tensorboard" / "evaluate") == {
        "eval/heldout/pass_at_1": [(2, 0.5)],
        "eval/heldout/pass_at_1_ci95_lo": [(2, 0.0)],
        "eval/heldout/pass_at_1_ci95_hi": [(2, 0.5)],
        "time/evaluate_s": [(2, 2.0)],
        "time/evaluate_work_s": [(2, 2.0)],
    }


def test_only_rank_zero_logs_and_sampling_shards_have_no_figures(tmp_path):
    cfg = _cfg(str(tmp_path))
    run_once(FakeStage(cfg, "train", rank=1), 0)
    assert not (tmp_path / RUN_ID / "tensorboard").exists()
    assert step_figures("evaluate-shard-00000-of-00002", {"skipped": False, "uri": "u"}) == {}
    assert step_figures("generate", {"skipped": True, "uri": "u"}) == {}


def test_tracking_that_fails_never_fails_the_step(tmp_path, monkeypatch, caplog):
    from components.core import tracking

    def explode(cfg, task):
        raise RuntimeError("tracking is broken")

    monkeypatch.setattr(tracking, "make_tracker", explode)
    cfg = _cfg(str(tmp_path))
    stage = FakeStage(cfg, "train")
    with caplog.at_level(logging.WARNING, logger="rlvr.tracking"):
        result = run_once(stage, 0)
    assert result["stats"]["train/loss"] == 1.0 and stage.closed
    assert "could not log train step 0" in caplog.text
    # and a stage without a config (the fakes of tests/core/test_warm_protocol.py) is not tracked at all
    tracking_ = StageTracking(object())
    tracking_.after_step(0, {"skipped": False, "stats": {}})
    tracking_.close()
