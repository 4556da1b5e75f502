"""Per-prompt attempts and successes (components/core/prompt_stats.py), the table verify
writes and the curriculum sampler (tests/generate/test_curriculum.py) reads."""

from __future__ import annotations

import pytest

from components.core.prompt_stats import group_shares, prompt_stats_table, row_of


def test_prompt_stats_by_hand():
    t = prompt_stats_table(
        ["train-0000003", "train-0000003", "train-0000001", "train-0000001", "train-0000001"],
        ["a", "a", "b", "b", "b"],
        [1.0, 0.0, 0.5, 0.75, 0.25],
        iteration=4,
        success_threshold=0.5,
    )
    assert t.to_pylist() == [
        {
            "prompt_id": "train-0000003",
            "data_source": "a",
            "iteration": 4,
            "attempts": 2,
            "successes": 1,
            "reward_mean": 0.5,
            "reward_min": 0.0,
            "reward_max": 1.0,
        },
        {
            "prompt_id": "train-0000001",
            "data_source": "b",
            "iteration": 4,
            "attempts": 3,
            "successes": 1,
            "reward_mean": 0.5,
            "reward_min": 0.25,
            "reward_max": 0.75,
        },
    ]  # 0.5 is not above the threshold: evaluate's rule
    # Shares: no group has equal rewards, none all-correct (2 of 5 samples pass), none all-wrong.
    assert group_shares(t) == {
        "groups": 2,
        "zero_signal_share": 0.0,
        "all_correct_share": 0.0,
        "all_wrong_share": 0.0,
        "pass_rate": 2 / 5,
    }
    same = prompt_stats_table(
        ["train-0000000"] * 2 + ["train-0000002"] * 2, ["a"] * 4, [1.0, 1.0, 0.0, 0.0], 0, 0.5
    )
    assert group_shares(same) == {
        "groups": 2,
        "zero_signal_share": 1.0,
        "all_correct_share": 0.5,
        "all_wrong_share": 0.5,
        "pass_rate": 0.5,
    }
    assert group_shares(prompt_stats_table([], [], [], 0, 0.5)) == {"groups": 0}


def test_row_ids():
    assert row_of("train-0001234") == 1234
    with pytest.raises(ValueError, match="not of the form train-<row>"):
        row_of("eval-0000001")
