"""Verify and evaluate stages on a tiny model, and their bad-input behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from components.core.layout import RunLayout
from components.core.schemas import SCORED, components_dict
from components.evaluate.sampling import EVAL_SEED_ITERATION
from components.evaluate.stage import run as evaluate
from components.generate.rollouts import spec_from
from components.generate.stage import run as generate
from components.model import run_setup
from components.model.checkpoint import load_policy
from components.verify.scoring import resolve_rewards
from components.verify.stage import run as verify
from tests.support.invariance import assert_equal_up_to_rounding


def test_verify_scores_with_the_contract(cfg):
    run_setup.run(cfg)
    generate(cfg, 0)
    result = verify(cfg, 0)
    stats = result["stats"]
    assert stats["samples"] == 24 and stats["error_fraction"] == 0.0
    table = pq.read_table(f"{RunLayout.of(cfg).scored(0)}/part-00000.parquet")
    assert table.schema.names[: len(SCORED)] == SCORED.names
    assert table.schema.metadata[b"rlvr.schema"] == b"scored"
    rows = table.to_pylist()
    assert {r["verifier"] for r in rows} == {"math"}
    # Rewards are what the math verifier says for each response, recomputed here.
    from components.verify.math import compute_score

    for r in rows:
        assert r["reward"] == compute_score(r["response"], r["ground_truth"])["score"]
    assert verify(cfg, 0)["skipped"] is True


def test_unknown_data_source_lists_registered_ones(cfg):
    with pytest.raises(ValueError) as e:
        resolve_rewards({"arithmetic", "mystery"}, {"arithmetic": "math"})
    msg = str(e.value)
    assert "['mystery']" in msg and "'arithmetic'" in msg and "openai/gsm8k" in msg
    run_setup.run(cfg)
    generate(cfg, 0)
    cfg.verify.rewards = {}
    with pytest.raises(
        ValueError, match="no verifier registered for data_source \\['arithmetic'\\]"
    ):
        verify(cfg, 0)
    assert not Path(RunLayout.of(cfg).scored(0)).exists()  # nothing committed


def test_broken_verifier_fails_the_stage(cfg, tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise RuntimeError('boom')\n"
    )
    run_setup.run(cfg)
    generate(cfg, 0)
    cfg.verify.rewards = {"arithmetic": f"{plugin}:compute_score"}
    with pytest.raises(ValueError, match="24/24 samples errored.*boom"):
        verify(cfg, 0)
    assert not Path(RunLayout.of(cfg).scored(0), "_SUCCESS").exists()


def test_evaluate_writes_metrics_plots_and_report(cfg):
    run_setup.run(cfg)
    result = evaluate(cfg, 0)
    root = Path(RunLayout.of(cfg).evals(0))
    for name in (
        "metrics.json",
        "heldout/metrics.json",
        "heldout/samples.parquet",
        "pass_at_k.png",
        "history.png",
        "report.md",
        "_SUCCESS",
    ):
        assert (root / name).is_file(), name
    m = json.loads((root / "metrics.json").read_text())
    assert m["checkpoint"].endswith("checkpoints/00000") and m["n"] == 4
    assert set(m["overall"]) >= {"pass@1", "pass@2", "pass@4", "mean@4"}
    assert set(m["by_data_source"]) == {"arithmetic"}
    samples = pq.read_table(root / "heldout" / "samples.parquet")
    assert samples.num_rows == 12 * 4
    # pass@1 is the mean reward for binary rewards; recompute it from the samples.
    rewards = samples.column("reward").to_pylist()
    assert m["overall"]["pass@1"] == pytest.approx(sum(r > 0.5 for r in rewards) / len(rewards))
    assert (root / "pass_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pass@1" in (root / "report.md").read_text()
    assert result["stats"]["pass@1"] == m["overall"]["pass@1"]


def test_evaluate_rejects_k_above_n_before_sampling(cfg):
    run_setup.run(cfg)
    cfg.evaluate.ks = [8]
    with pytest.raises(ValueError, match="evaluate.ks"):
        evaluate(cfg, 0)
    assert not Path(RunLayout.of(cfg).evals(0)).exists()


def test_reruns_skip_only_when_inputs_are_unchanged(cfg):
    """A committed output is reused only if computed from the same inputs and config section."""
    from components.core.commit import OutputDir
    from components.core.store import LocalStore

    run_setup.run(cfg)
    first = generate(cfg, 0)
    assert first["skipped"] is False and generate(cfg, 0)["skipped"] is True
    verify(cfg, 0)
    assert verify(cfg, 0)["skipped"] is True
    # A changed generate setting makes the rollouts stale: they are redone...
    cfg.generate.temperature = 0.5
    assert generate(cfg, 0)["skipped"] is False
    # ...and verify, whose input changed content, redoes too.
    assert verify(cfg, 0)["skipped"] is False
    # A re-committed upstream with identical content does not invalidate downstream.
    layout = RunLayout.of(cfg)
    out = OutputDir(LocalStore(), layout.rollouts(0), "generate")
    manifest = json.loads(Path(layout.rollouts(0), "_SUCCESS").read_text())
    manifest["committed_at"] = "2000-01-01T00:00:00Z"
    Path(layout.rollouts(0), "_SUCCESS").write_text(json.dumps(manifest))
    assert out.is_committed() and verify(cfg, 0)["skipped"] is True


def test_stages_run_against_s3(cfg, s3_bucket):
    """The same stages with the run in s3:// (moto's server, real HTTP through boto3)."""
    import boto3

    from components.train.stage import run as train

    cfg.run.store = f"s3://{s3_bucket}/runs"
    run_setup.run(cfg)
    generate(cfg, 0)
    assert verify(cfg, 0)["stats"]["samples"] == 24
    train(cfg, 0)
    result = evaluate(cfg, 1)
    assert 0.0 <= result["stats"]["pass@1"] <= 1.0
    keys = {
        o["Key"]
        for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=s3_bucket)
        for o in page.get("Contents", [])
    }
    for d in (
        "checkpoints/00000",
        "checkpoints/00001",
        "train_state/00001",
        "iterations/00000/rollouts",
        "iterations/00000/scored",
        "evals/00001",
    ):
        assert f"runs/t/{d}/_SUCCESS" in keys, d
    assert "runs/t/checkpoints/00001/model.safetensors" in keys


def test_weighted_reward_components_and_overlong_penalty():
    """reward = sum of weighted components + DAPO overlong; each kept in reward_components."""
    import pyarrow as pa

    from components.core.config import OverlongPenalty, RewardSpec
    from components.core.schemas import ROLLOUTS
    from components.verify.scoring import score_table

    rows = {name: [] for name in ROLLOUTS.names}
    cases = [
        ("<think>ok</think> \\boxed{4}", "4", 3),
        ("\\boxed{5}", "4", 10),
        ("<think>x</think> \\boxed{4}", "4", 8),
    ]
    for i, (resp, gt, length) in enumerate(cases):
        values = dict(
            prompt_id=f"p{i}",
            sample_index=0,
            data_source="mix",
            ground_truth=gt,
            prompt="q",
            prompt_token_ids=[1],
            response=resp,
            response_token_ids=list(range(length)),
            response_logprobs=[0.0] * length,
            finish_reason="stop",
            checkpoint="c",
            extra_info=None,
            policy_version=0,
        )
        for k, v in values.items():
            rows[k].append(v)
    table = pa.Table.from_pydict(rows, schema=ROLLOUTS)
    spec = RewardSpec(
        components=[{"verifier": "math", "name": "correct"}, {"verifier": "format", "weight": 0.5}]
    )
    scored, stats = score_table(
        table,
        {"mix": spec},
        num_workers=0,
        timeout_s=5,
        max_error_fraction=0.0,
        overlong=OverlongPenalty(max_length=10, buffer=4, penalty=1.0),
    )
    out = scored.to_pylist()
    # overlong: length <= 6 -> 0; 8 -> -(8-6)/4 = -0.5; 10 -> -(10-6)/4 = -1.0
    assert [components_dict(r["reward_components"]) for r in out] == [
        {"correct": 1.0, "format": 1.0, "overlong": 0.0},
        {"correct": 0.0, "format": 0.0, "overlong": -1.0},
        {"correct": 1.0, "format": 1.0, "overlong": -0.5},
    ]
    assert [r["reward"] for r in out] == pytest.approx([1.5, -1.0, 1.0])
    assert out[0]["verifier"] == "1*correct:math + 0.5*format:format"
    assert stats["reward_components_mean"]["correct"] == pytest.approx(2 / 3)


def test_sharded_evaluation_matches_unsharded_and_greedy(cfg):
    cfg.data.eval[0].greedy = True
    run_setup.run(cfg)
    whole = evaluate(cfg, 0)["metrics"]
    assert "greedy_pass@1" in whole["overall"]
    sharded = cfg.model_copy(deep=True)
    sharded.run.run_id = "sharded"
    sharded.evaluate.num_shards = 3
    run_setup.run(sharded)
    from components.core.commit import NotCommittedError

    for s in range(2):
        evaluate(sharded, 0, shard=s, num_shards=3)
    with pytest.raises(NotCommittedError, match=r"shards \[2\] of 3"):
        evaluate(sharded, 0)  # the gather refuses an incomplete set
    evaluate(sharded, 0, shard=2, num_shards=3)
    gathered = evaluate(sharded, 0)["metrics"]
    # Shards batch other prompts together: samples agree up to float rounding (the generation
    # contract); where no draw moved (the rule, measured), the metrics are identical.
    model, _ = load_policy(RunLayout.of(cfg).checkpoint(0))
    diverged = []
    for kind, n in (("samples", 4), ("greedy_samples", 1)):
        a, b = (
            {
                (r["prompt_id"], r["sample_index"]): r
                for r in pq.read_table(
                    Path(RunLayout.of(c).evals(0), "heldout", f"{kind}.parquet")
                ).to_pylist()
            }
            for c in (cfg, sharded)
        )
        ev = cfg.data.eval[0]
        spec = spec_from(
            cfg.generate,
            cfg.evaluate.seed,
            n=n,
            temperature=ev.temperature if n > 1 else 0.0,
            top_p=ev.top_p,
            top_k=ev.top_k,
            max_new_tokens=ev.max_new_tokens,
        )
        diverged += assert_equal_up_to_rounding(
            a, b, model, spec, cfg.evaluate.seed, EVAL_SEED_ITERATION
        )
    if not diverged:
        assert gathered["overall"] == whole["overall"]
        assert gathered["by_data_source"] == whole["by_data_source"]
    root = Path(RunLayout.of(sharded).evals(0))
    assert (root / "heldout" / "greedy_samples.parquet").is_file()


def test_eval_set_ks_and_data_source_filter(cfg):
    from components.core.config import EvalSetConfig

    ev = cfg.data.eval[0]
    cfg.data.eval.append(
        EvalSetConfig(
            name="filtered", path=ev.path, n=3, ks=[3], data_sources=["arithmetic"], max_prompts=5
        )
    )
    run_setup.run(cfg)
    metrics = evaluate(cfg, 0)["metrics"]["sets"]
    assert set(
        k for k in metrics["filtered"]["overall"] if k.startswith("pass@") and "_" not in k
    ) == {"pass@1", "pass@2", "pass@3"}
    assert metrics["filtered"]["overall"]["num_problems"] == 5
    cfg.data.eval[1].data_sources = ["nope"]
    with pytest.raises(ValueError, match="matches no prompt"):
        evaluate(cfg, 0, force=True)
