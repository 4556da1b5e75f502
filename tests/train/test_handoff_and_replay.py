"""The policy handoff and resume by replay (components/train/stage.py, handoff.py, state.py):
checkpoints in the sampler's dtype, full states every few iterations, and a train worker lost
between two states resumed to the very bytes an uninterrupted run writes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from components.core.errors import StageError
from components.core.layout import RunLayout
from components.core.timing import Timeline
from components.generate.stage import GenerateStage
from components.generate.stage import run as generate
from components.model import run_setup
from components.model.checkpoint import load_policy
from components.train import state as train_state
from components.train.stage import TrainStage
from components.train.stage import run as train
from components.verify.stage import VerifyStage
from components.verify.stage import run as verify

SHARD = "state-00000-of-00001.safetensors"


def warm_steps(cfg, iterations, *, close_train: bool = True) -> TrainStage:
    """One warm generate / verify / train object each over `iterations`; the train worker is
    closed (its full state written) or, with close_train False, dropped as a killed process
    leaves it: what it committed stays, nothing else is written."""
    stages = [GenerateStage(cfg), VerifyStage(cfg), TrainStage(cfg)]
    try:
        for i in iterations:
            for st in stages:
                st.step(i, timeline=Timeline(st.task, i))
    finally:
        stages[0].close()
        stages[1].close()
        if close_train:
            stages[2].close()
        else:  # SIGKILL: a background write may or may not have finished; let it finish
            stages[2].states.wait()
            stages[2]._release()
    return stages[2]


def files(cfg, uri_of, c: int, name: str) -> bytes:
    return Path(uri_of(RunLayout.of(cfg))(c), name).read_bytes()


def test_a_train_worker_lost_between_states_resumes_to_the_same_bytes(train_cfg):  # noqa: F811
    """State every 2 iterations. One run goes 0..3 uninterrupted; the other's train worker is
    lost after iteration 2 (checkpoint 3 committed, state 2 the newest), and a cold invocation
    of iteration 3 rebuilds from state 2, replays update 2 (checked against checkpoint 3) and
    trains 3. Checkpoint 4 and train state 4 are byte for byte the uninterrupted run's."""
    ref = train_cfg
    ref.run.iterations = 4
    ref.train.state_every = 2
    lost = ref.model_copy(deep=True)
    lost.run.run_id = "lost"
    for cfg in (ref, lost):
        run_setup.run(cfg)
    warm_steps(ref, range(4))
    warm_steps(lost, range(3), close_train=False)
    layout = RunLayout.of(lost)
    assert Path(layout.checkpoint(3), "_SUCCESS").exists()
    assert not Path(layout.train_state(3), "_SUCCESS").exists()
    assert Path(layout.train_state(2), "_SUCCESS").exists()
    generate(lost, 3)
    verify(lost, 3)
    result = train(lost, 3)
    assert result["stats"]["train/replayed"] == 1.0  # update 2, from state 2
    assert result["stats"]["train/engine"] == "load"
    for c in (1, 2, 3, 4):
        assert files(ref, lambda lo: lo.checkpoint, c, "model.safetensors") == files(
            lost, lambda lo: lo.checkpoint, c, "model.safetensors"
        ), c
    assert files(ref, lambda lo: lo.train_state, 4, SHARD) == files(
        lost, lambda lo: lo.train_state, 4, SHARD
    )


def test_a_replay_refuses_a_checkpoint_made_with_other_settings(train_cfg):  # noqa: F811
    """A lost worker's updates are replayed only while the committed checkpoints are this
    config's: with the learning rate changed, checkpoint 1 is another run's, and rebuilding
    iteration 2 from the base says so instead of training from weights the run never had."""
    cfg = train_cfg
    cfg.run.iterations = 3
    run_setup.run(cfg)
    warm_steps(cfg, range(2), close_train=False)  # no state: state_every is 10
    generate(cfg, 2)
    verify(cfg, 2)
    other = cfg.model_copy(deep=True)
    other.train.lr = 5e-4
    with pytest.raises(StageError, match="cannot replay update 0"):
        train(other, 2)
    assert not Path(RunLayout.of(cfg).checkpoint(3)).exists()


def test_the_handoff_is_in_the_samplers_dtype_and_samples_as_the_masters_would(train_cfg):  # noqa: F811
    """generate.dtype bfloat16: checkpoint 1 holds the fp32 masters rounded to bf16 (half the
    bytes), says so in its config, and a bf16 sampler holds exactly the weights it would hold
    from the fp32 masters, which only the full state keeps."""
    cfg = train_cfg
    cfg.generate.dtype = "bfloat16"
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    stats = train(cfg, 0)["stats"]
    layout = RunLayout.of(cfg)
    handoff = load_file(f"{layout.checkpoint(1)}/model.safetensors")
    masters = {
        k.removeprefix("master."): v
        for k, v in load_file(f"{layout.train_state(1)}/{SHARD}").items()
        if k.startswith("master.")
    }
    assert stats["handoff_dtype"] == "bfloat16"
    assert all(v.dtype == torch.bfloat16 for v in handoff.values())
    assert json.loads(Path(layout.checkpoint(1), "config.json").read_text())["dtype"] == "bfloat16"
    for name, v in handoff.items():
        assert torch.equal(v, masters[name].to(torch.bfloat16)), name
    # the sampler: bf16 weights from the handoff == bf16 weights cast from the fp32 masters
    fp32 = Path(cfg.run.store) / "fp32"
    fp32.mkdir()
    for f in Path(layout.checkpoint(1)).iterdir():
        if f.name not in ("model.safetensors", "_SUCCESS"):
            (fp32 / f.name).write_bytes(f.read_bytes())
    save_file(masters, str(fp32 / "model.safetensors"), metadata={"format": "pt"})
    a, _ = load_policy(Path(layout.checkpoint(1)), dtype=torch.bfloat16)
    b, _ = load_policy(fp32, dtype=torch.bfloat16)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    result = generate(cfg, 1)  # the warm path's loader takes it too
    assert result["skipped"] is False


def test_a_sharded_handoff_loads_in_transformers_and_in_place(train_cfg, monkeypatch):  # noqa: F811
    """Past the shard size the handoff is split with HF's index, which from_pretrained and a
    warm engine's in-place load both read."""
    import components.model.weights as weights

    monkeypatch.setattr(weights, "MAX_SHARD_BYTES", 20_000)
    cfg = train_cfg
    cfg.run.iterations = 2
    run_setup.run(cfg)
    warm_steps(cfg, range(2))
    layout = RunLayout.of(cfg)
    names = sorted(p.name for p in Path(layout.checkpoint(2)).glob("model*"))
    assert "model.safetensors.index.json" in names and len(names) > 3
    model, _ = load_policy(Path(layout.checkpoint(2)))
    loaded = model.state_dict()
    index = json.loads(Path(layout.checkpoint(2), "model.safetensors.index.json").read_text())
    for name, fname in index["weight_map"].items():
        assert torch.equal(load_file(f"{layout.checkpoint(2)}/{fname}")[name], loaded[name])
    stats = json.loads(Path(layout.rollouts(1), "_SUCCESS").read_text())["stats"]
    assert stats["policy_load"] == "weights"  # checkpoint 1, sharded too, loaded in place


def test_background_writes_one_at_a_time_and_hand_their_errors_on():
    order: list[str] = []
    bg = train_state.Background()

    def slow() -> None:
        time.sleep(0.2)
        order.append("first")

    bg.start(slow, "a")
    assert bg.pending
    bg.start(lambda: order.append("second"), "b")  # waits for the first
    bg.wait()
    assert order == ["first", "second"] and not bg.pending

    def fail() -> None:
        raise OSError("disk full")

    bg.start(fail, "c")
    with pytest.raises(OSError, match="disk full"):
        bg.wait()
    bg.wait()  # handed on once
    assert threading.active_count() >= 1
