"""The one naming scheme of a run's dynamics (components/core/figures.py), by hand."""

from __future__ import annotations

import pytest

from components.core.figures import combine_shards, eval_figures, stage_figures

TIMELINE = {
    "seconds": {"start": 2.0, "wait": 5.0, "read": 0.5, "load": 1.0, "work": 3.0, "commit": 0.25}
}


def test_generate_figures():
    stats = {
        "samples": 64,
        "prompts": 4,
        "response_length_mean": 7.5,
        "response_length_max": 12,
        "truncated_fraction": 0.25,
        "tokens_per_s": 100.0,
        "backend": "transformers",
        "sampler": {"explored": 2.0, "seen_share": 0.5},
        "timeline": TIMELINE,
        "skipped_prompt_ids": [],
        "policy_version": 3,
    }
    assert stage_figures("generate", stats) == {
        "rollout/samples": 64.0,
        "rollout/prompts": 4.0,
        "rollout/response_length_mean": 7.5,
        "rollout/response_length_max": 12.0,
        "rollout/truncated_fraction": 0.25,
        "rollout/tokens_per_s": 100.0,
        "rollout/policy_version": 3.0,
        "rollout/sampler_explored": 2.0,
        "rollout/sampler_seen_share": 0.5,
        # everything but the wait for inputs and the process start: 0.5 + 1 + 3 + 0.25
        "time/generate_s": 4.75,
        "time/generate_work_s": 3.0,
    }


def test_verify_figures_name_sources_and_components_only_when_several():
    stats = {
        "samples": 8,
        "reward_mean": 0.5,
        "error_fraction": 0.0,
        "groups": 2,
        "zero_signal_share": 0.5,
        "reward_mean_by_data_source": {"a": 0.25, "b": 0.75},
        "reward_components_mean": {"math": 0.5},
        "errors": {},
        "verifiers": {"a": "math"},
    }
    got = stage_figures("verify", stats)
    assert got == {
        "verify/samples": 8.0,
        "verify/reward_mean": 0.5,
        "verify/error_fraction": 0.0,
        "verify/groups": 2.0,
        "verify/zero_signal_share": 0.5,
        "verify/reward_mean/a": 0.25,
        "verify/reward_mean/b": 0.75,
    }
    stats["reward_components_mean"] = {"math": 0.5, "format": 1.0}
    assert stage_figures("verify", stats)["verify/reward/format"] == 1.0


def test_train_figures_keep_numbers_only():
    stats = {
        "train/loss": 0.5,
        "train/engine": "load",
        "train/kl_ref": float("nan"),
        "train/grad_norm": 2,
        "iteration": 3,
    }
    assert stage_figures("train", stats) == {"train/loss": 0.5, "train/grad_norm": 2.0}
    with pytest.raises(ValueError, match="unknown stage 'evaluate'"):
        stage_figures("evaluate", {})


def test_eval_figures_per_set_with_ci_bounds():
    metrics = {
        "sets": {
            "heldout": {
                "overall": {
                    "n": 4,
                    "num_problems": 10,
                    "pass@1": 0.3,
                    "pass@1_ci95": [0.2, 0.4],
                    "mean@4": 0.3,
                }
            },
            "hard": {"overall": {"pass@1": 0.1}},
        }
    }
    got = eval_figures(metrics, {"timeline": {"seconds": {"wait": 9.0, "work": 2.0}}})
    assert got == {
        "eval/heldout/pass@1": 0.3,
        "eval/heldout/pass@1_ci95_lo": 0.2,
        "eval/heldout/pass@1_ci95_hi": 0.4,
        "eval/heldout/mean@4": 0.3,
        "eval/hard/pass@1": 0.1,
        "time/evaluate_s": 2.0,
        "time/evaluate_work_s": 2.0,
    }
    # A single set's metrics.json without "sets" is named by its eval_set.
    assert eval_figures({"eval_set": "x", "overall": {"pass@1": 0.5}}) == {"eval/x/pass@1": 0.5}


def test_shards_combine_as_one_run_would():
    a = {
        "rollout/samples": 30.0,
        "rollout/response_length_mean": 4.0,
        "rollout/response_length_max": 9.0,
        "rollout/tokens_per_s": 10.0,
        "time/generate_s": 2.0,
    }
    b = {
        "rollout/samples": 10.0,
        "rollout/response_length_mean": 8.0,
        "rollout/response_length_max": 12.0,
        "rollout/tokens_per_s": 5.0,
        "time/generate_s": 3.0,
    }
    assert combine_shards([a, b]) == {
        "rollout/samples": 40.0,
        "rollout/response_length_mean": (30 * 4.0 + 10 * 8.0) / 40,  # = 5.0, by samples
        "rollout/response_length_max": 12.0,
        "rollout/tokens_per_s": 15.0,  # shards run side by side: rates add up
        "time/generate_s": 3.0,  # the slowest shard
    }
    v1 = {
        "verify/samples": 12.0,
        "verify/groups": 3.0,
        "verify/zero_signal_share": 1 / 3,
        "verify/reward_mean": 0.5,
    }
    v2 = {
        "verify/samples": 4.0,
        "verify/groups": 1.0,
        "verify/zero_signal_share": 1.0,
        "verify/reward_mean": 1.0,
    }
    got = combine_shards([v1, v2])
    assert got["verify/zero_signal_share"] == pytest.approx((3 * (1 / 3) + 1 * 1.0) / 4, rel=1e-15)
    assert got["verify/reward_mean"] == pytest.approx((12 * 0.5 + 4 * 1.0) / 16, rel=1e-15)
    assert combine_shards([a]) == a
