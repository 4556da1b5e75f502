"""Standalone evaluation: any checkpoint, watching a run, and the eval pipeline on kfp.local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from components.core.layout import RunLayout
from components.evaluate.local import watch_run
from components.evaluate.stage import resolve_checkpoint
from components.model import run_setup
from pipelines.cli import main


def test_eval_any_checkpoint_is_kept_and_not_redone(workspace, tiny_assets):
    args = ["eval", str(workspace), "--checkpoint", str(tiny_assets / "base")]
    first = CliRunner().invoke(main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    # its log names the checkpoint evaluated, as its table does, not "00000"
    assert f"evaluate {tiny_assets / 'base'}: pass@1 " in first.stderr, first.stderr[-2000:]
    assert "evaluate 00000" not in first.stderr
    runs = [p for p in (workspace.parent / "runs").iterdir() if p.name.startswith("eval-")]
    assert len(runs) == 1
    success = runs[0] / "evals/00000/_SUCCESS"
    stamp = success.stat().st_mtime_ns
    second = CliRunner().invoke(main, args, catch_exceptions=False)
    assert second.exit_code == 0 and success.stat().st_mtime_ns == stamp  # unchanged: skipped
    assert "00000" in second.output
    # the row is labelled with the checkpoint evaluated (not "00000" of a run it never had),
    # and the output says where the metrics went
    assert "metrics, samples and plots" in second.output and "checkpoint" in second.output
    assert "base" in second.output


def test_eval_needs_exactly_one_target(workspace):
    result = CliRunner().invoke(main, ["eval", str(workspace)])
    assert result.exit_code == 2 and "exactly one of --checkpoint" in result.output


def test_watch_evaluates_each_new_checkpoint(cfg):
    from components.generate.stage import run as generate
    from components.train.stage import run as train
    from components.verify.stage import run as verify

    cfg.run.iterations = 1
    run_setup.run(cfg)
    assert resolve_checkpoint(cfg, "latest") == 0
    assert watch_run(cfg, poll_s=0.01, timeout_s=0.0) == {"evaluated": [0], "timed_out": True}
    generate(cfg, 0)
    verify(cfg, 0)
    train(cfg, 0)
    assert resolve_checkpoint(cfg, "latest") == 1
    assert watch_run(cfg, poll_s=0.01) == {"evaluated": [0, 1]}
    root = Path(RunLayout.of(cfg).root)
    assert json.loads((root / "evals/00001/metrics.json").read_text())["checkpoint_index"] == 1
    # The watch logs each evaluation to TensorBoard as the evaluate worker does, at its index.
    events = sorted(p.name for p in (root / "tensorboard/evaluate").iterdir())
    assert events == ["events.out.tfevents.00000000.rlvr", "events.out.tfevents.00000001.rlvr"]
    with pytest.raises(ValueError, match="not committed"):
        resolve_checkpoint(cfg, "7")


@pytest.mark.slow
def test_eval_pipeline_on_kfp_local(cfg, tmp_path):
    from kfp import local

    from pipelines.evaluation import build_eval_pipeline

    run_setup.run(cfg)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    pipeline = build_eval_pipeline(cfg, for_cluster=False)
    pipeline(config_json=cfg.to_json(), run_id=cfg.run_id, checkpoint="latest")
    root = Path(RunLayout.of(cfg).root)
    metrics = json.loads((root / "evals/00000/metrics.json").read_text())
    assert metrics["checkpoint_index"] == 0 and "pass@1" in metrics["overall"]


def test_report_prints_table_and_regenerates_plots(cfg):
    from components.evaluate.stage import run as evaluate

    run_setup.run(cfg)
    evaluate(cfg, 0)
    root = RunLayout.of(cfg).root
    result = CliRunner().invoke(main, ["report", root], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "00000" in result.output and "heldout" in result.output
    for name in ("report.md", "history.png", "pass_at_k.png", "_SUCCESS"):
        assert (Path(root) / "report" / name).is_file(), name
    empty = CliRunner().invoke(main, ["report", str(Path(root).parent / "nothing")])
    assert empty.exit_code == 2
