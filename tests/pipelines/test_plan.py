"""The attempt's plan (pipelines/plan.py): before warm workers read anything, every committed
output that will be redone, and everything downstream of it, is uncommitted; so no worker can
trust an old input its upstream is about to replace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from components.core.commit import content_digest
from components.core.layout import RunLayout, store_for
from components.core.warm import RunStatus
from components.generate.stage import run as generate
from components.model import run_setup
from components.train.stage import run as train
from components.verify.stage import run as verify
from pipelines.plan import first_out_of_date, plan_segment


def _committed(uri: str) -> bool:
    return Path(uri, "_SUCCESS").is_file()


def _two_iterations(cfg) -> None:
    run_setup.run(cfg)
    for i in range(2):
        generate(cfg, i)
        verify(cfg, i)
        train(cfg, i)


def test_a_changed_config_uncommits_everything_it_affects(train_cfg):  # noqa: F811
    """The reviewer's case: generate's settings change on resume. Without the plan, verify and
    train would skip over the old rollouts while generate redoes them."""
    cfg = train_cfg
    cfg.run.iterations = 2
    _two_iterations(cfg)
    layout = RunLayout.of(cfg)
    changed = cfg.model_copy(deep=True)
    changed.generate.temperature = 0.9
    seg = changed.model_copy()
    from components.core.warm import segment

    assert first_out_of_date(changed, segment(changed, 0)) == (0, "generate", "stale")
    stats = plan_segment(changed, 0, "attempt-1")
    assert set(stats["uncommitted"]) == {
        layout.rollouts(0),
        layout.scored(0),
        layout.rollouts(1),
        layout.scored(1),
        layout.prompt_stats(0),
        layout.prompt_stats(1),
        layout.checkpoint(1),
        layout.checkpoint(2),
        layout.train_state(1),
        layout.train_state(2),
    }
    assert _committed(layout.checkpoint(0)) and _committed(RunStatus.of(seg, "attempt-1").plan)

    # The workers of that attempt (processes, as in a pipeline run) redo every step, each
    # from its upstream's new output.
    config = layout.root + "/../changed.json"
    Path(config).write_text(changed.to_json())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"components.{stage}",
                config,
                "--segment",
                "0",
                "--attempt",
                "attempt-1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for stage in ("generate", "verify", "train")
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    store = store_for(changed)
    for i in range(2):
        scored = json.loads(Path(layout.scored(i), "_SUCCESS").read_text())
        rel = lambda uri: uri[len(layout.root) + 1 :]  # noqa: E731  (inputs are run-relative)
        assert scored["inputs"][rel(layout.rollouts(i))] == content_digest(
            store, layout.rollouts(i)
        )
        ckpt = json.loads(Path(layout.checkpoint(i + 1), "_SUCCESS").read_text())
        assert ckpt["inputs"][rel(layout.scored(i))] == content_digest(store, layout.scored(i))
    assert first_out_of_date(changed, segment(changed, 0)) is None


def test_a_missing_output_uncommits_only_what_could_race(train_cfg):  # noqa: F811
    """Checkpoint 2 lost: its own train state goes (it is redone with it); nothing upstream, and
    no evaluation (their worker checks lineage once the checkpoint is back)."""
    import shutil

    from components.core.warm import segment

    cfg = train_cfg
    cfg.run.iterations = 2
    _two_iterations(cfg)
    layout = RunLayout.of(cfg)
    shutil.rmtree(layout.checkpoint(2))
    assert first_out_of_date(cfg, segment(cfg, 0)) == (1, "train", "missing")
    stats = plan_segment(cfg, 0, "attempt-2")
    assert stats["uncommitted"] == [layout.train_state(2)]
    assert _committed(layout.scored(1)) and _committed(layout.checkpoint(1))
