"""Warm stages train and sample exactly like cold ones; bounded staleness is recorded and
enforced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.core.commit import committed_files
from components.core.errors import StageError
from components.core.layout import RunLayout, store_for
from components.core.schemas import read_records
from components.core.timing import Timeline
from components.generate.stage import GenerateStage
from components.generate.stage import run as generate
from components.model import run_setup
from components.train.stage import TrainStage
from components.train.stage import run as train
from components.verify.stage import VerifyStage
from components.verify.stage import run as verify


def rows(cfg, i: int) -> dict:
    store, layout = store_for(cfg), RunLayout.of(cfg)
    t = read_records(store, committed_files(store, layout.rollouts(i), ".parquet"), "rollouts")
    return {(r["prompt_id"], r["sample_index"]): r for r in t.to_pylist()}


def state(cfg, c: int) -> dict[str, torch.Tensor]:
    """Checkpoint c's weights and, where train state c was written, its masters and moments."""
    layout = RunLayout.of(cfg)
    out = {f"w.{k}": v for k, v in load_file(f"{layout.checkpoint(c)}/model.safetensors").items()}
    shard = Path(layout.train_state(c), "state-00000-of-00001.safetensors")
    if shard.exists():
        out.update({k: v for k, v in load_file(shard).items() if not k.startswith("rng.")})
    return out


def manifest(cfg, uri: str) -> dict:
    return json.loads(Path(uri, "_SUCCESS").read_text())["stats"]


def test_warm_workers_equal_cold_stage_runs(train_cfg):  # noqa: F811
    """Three iterations with one warm generate / verify / train object each (weights loaded in
    place, engine and Adam state kept in memory) give the same rollouts, checkpoints and optimizer
    state, bit for bit, as three cold invocations of every stage. The warm train writes its full
    state every train.state_every iterations and when it closes; each cold invocation (a
    one-iteration worker) when it ends."""
    cold = train_cfg
    cold.run.iterations = 3
    cold.retention.enabled = False  # every state stays, to compare
    warm = cold.model_copy(deep=True)
    warm.run.run_id = "warm"
    warm.train.state_every = 2
    run_setup.run(cold)
    run_setup.run(warm)
    for i in range(3):
        generate(cold, i)
        verify(cold, i)
        train(cold, i)
    stages = [GenerateStage(warm), VerifyStage(warm), TrainStage(warm)]
    try:
        for i in range(3):
            for st in stages:
                st.step(i, timeline=Timeline(st.task, i))
    finally:
        for st in stages:
            st.close()
    for i in range(3):
        a, b = rows(cold, i), rows(warm, i)
        assert a.keys() == b.keys()
        for k in a:  # same batch layout on both sides: identical
            assert a[k]["response_token_ids"] == b[k]["response_token_ids"], (i, k)
            assert a[k]["response_logprobs"] == b[k]["response_logprobs"], (i, k)
    layout = RunLayout.of(warm)
    written = [c for c in (1, 2, 3) if Path(layout.train_state(c), "_SUCCESS").exists()]
    assert written == [2, 3]  # every 2nd iteration, and when the worker closed
    for c in (1, 2, 3):
        sa, sb = state(cold, c), state(warm, c)
        assert any(k.startswith("exp_avg.") for k in sa)  # every cold invocation wrote one
        assert sb.keys() <= sa.keys() and any(k.startswith("w.") for k in sb)
        for k in sb:
            assert torch.equal(sa[k], sb[k]), (c, k)
    loads = [manifest(warm, layout.rollouts(i))["policy_load"] for i in range(3)]
    assert loads == ["load", "weights", "weights"]  # the policy was loaded once, then updated
    engines = [manifest(warm, layout.checkpoint(c))["train/engine"] for c in (1, 2, 3)]
    assert engines == ["load", "reuse", "reuse"]
    spans = manifest(warm, layout.checkpoint(2))["timeline"]["seconds"]
    assert {"read", "work", "commit"} <= set(spans)
    assert manifest(warm, layout.checkpoint(2))["train/checkpoint_save_bytes_per_s"] > 0


def test_warm_train_rebuilds_when_an_iteration_was_redone_out_of_band(train_cfg):  # noqa: F811
    """The engine holds exactly the committed state it wrote; when checkpoint 1 is redone by
    another process (here with another learning rate), the warm stage reloads it from the store
    (the full state the rerun wrote) and its result equals a cold run's."""
    cfg = train_cfg
    cfg.run.iterations = 2
    cfg.retention.enabled = False  # the cold rerun at the end needs state 1 as well
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    stage = TrainStage(cfg)
    try:
        stage.step(0, timeline=Timeline("train", 0))
        redo = cfg.model_copy(deep=True)
        redo.train.lr = 5e-4
        train(redo, 0, force=True)  # checkpoint 1 now differs from what the engine holds
        generate(cfg, 1)
        verify(cfg, 1)
        result = stage.step(1, timeline=Timeline("train", 1))
        assert result["stats"]["train/engine"] == "reload"
    finally:
        stage.close()
    warm_state = state(cfg, 2)
    train(cfg, 1, force=True)
    cold_state = state(cfg, 2)
    for k in warm_state:
        assert torch.equal(warm_state[k], cold_state[k]), k


def test_bounded_staleness_is_recorded_and_enforced(train_cfg):  # noqa: F811
    """max_staleness k: generate i samples with checkpoint max(0, i - k), every row records it,
    and train refuses rollouts staler than k with a message that says what to do."""
    cfg = train_cfg
    cfg.run.iterations = 3
    cfg.train.max_staleness = 1
    run_setup.run(cfg)
    layout = RunLayout.of(cfg)
    generate(cfg, 0)
    generate(cfg, 1)  # needs only checkpoint 0: overlaps train 0
    assert {r["policy_version"] for r in rows(cfg, 0).values()} == {0}
    assert {r["policy_version"] for r in rows(cfg, 1).values()} == {0}
    assert manifest(cfg, layout.rollouts(1))["policy_version"] == 0
    verify(cfg, 0)
    verify(cfg, 1)
    train(cfg, 0)
    stats = train(cfg, 1)["stats"]  # rollouts one checkpoint behind: allowed
    assert stats["train/staleness_max"] == 1.0 and stats["train/staleness_mean"] == 1.0
    generate(cfg, 2)
    assert {r["policy_version"] for r in rows(cfg, 2).values()} == {1}

    strict = cfg.model_copy(deep=True)
    strict.train.max_staleness = 0
    with pytest.raises(StageError, match=r"sampled by checkpoint 00000.*max_staleness=0"):
        train(strict, 1, force=True)


@pytest.mark.slow
def test_warm_train_worker_on_two_processes_serves_a_segment(train_cfg, tmp_path):  # noqa: F811
    """`python -m components.train CONFIG --segment 0` with train.processes=2: both ranks serve
    every iteration of the segment with their engines kept, meeting generate and verify (here
    warm workers in threads of the test) through the store; each checkpoint is committed once,
    by rank 0, and the engine is reused from the second iteration on."""
    import subprocess
    import sys
    import threading

    from components.core.warm import serve_stage

    cfg = train_cfg
    cfg.run.iterations = 2
    cfg.train.mini_batches = 1
    run_setup.run(cfg)
    config = tmp_path / "resolved.yaml"
    config.write_text(cfg.to_json())
    errors: list[BaseException] = []

    def worker(stage) -> None:
        try:
            serve_stage(stage, range(2), cfg=cfg)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(s,)) for s in (GenerateStage(cfg), VerifyStage(cfg))
    ]
    for t in threads:
        t.start()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            str(config),
            "--segment",
            "0",
            "--set",
            "train.processes=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    for t in threads:
        t.join(timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not errors, errors
    layout = RunLayout.of(cfg)
    stats = [manifest(cfg, layout.checkpoint(c)) for c in (1, 2)]
    assert [s["train/world_size"] for s in stats] == [2.0, 2.0]
    assert [s["train/engine"] for s in stats] == ["load", "reuse"]
    assert json.loads(Path(layout.train_state(2), "state.json").read_text())["step"] == 2
