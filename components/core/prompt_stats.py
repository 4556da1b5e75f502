"""Per-prompt pass rates of an iteration: what the verify stage commits for every prompt
(`iterations/<i>/prompt_stats/`, :data:`PROMPT_STATS`): how many samples it scored and how many
succeeded. The curriculum sampler (components/generate/curriculum.py) and run health read them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["PROMPT_STATS", "group_shares", "prompt_stats_table", "row_of", "scored_prompt_stats"]

#: One row per prompt of an iteration (one verify shard's prompts per file).
PROMPT_STATS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("data_source", pa.string()),
        ("iteration", pa.int64()),
        ("attempts", pa.int64()),
        ("successes", pa.int64()),
        ("reward_mean", pa.float64()),
        ("reward_min", pa.float64()),
        ("reward_max", pa.float64()),
    ]
)


def prompt_stats_table(
    prompt_ids: Sequence[str],
    data_sources: Sequence[str],
    rewards: Sequence[float],
    iteration: int,
    success_threshold: float,
) -> pa.Table:
    """Per-prompt attempts, successes (reward above the threshold, as evaluate counts a sample
    correct above 0.5) and reward range of one iteration, in first-seen prompt order."""
    acc: dict[str, list] = {}
    for pid, ds, r in zip(prompt_ids, data_sources, rewards, strict=True):
        row = acc.setdefault(pid, [ds, 0, 0, 0.0, float("inf"), float("-inf")])
        r = float(r)
        row[1] += 1
        row[2] += r > success_threshold
        row[3] += r
        row[4] = min(row[4], r)
        row[5] = max(row[5], r)
    cols = list(zip(*acc.values(), strict=True)) if acc else [[]] * 6
    return pa.table(
        {
            "prompt_id": list(acc),
            "data_source": list(cols[0]),
            "iteration": [iteration] * len(acc),
            "attempts": list(cols[1]),
            "successes": [int(s) for s in cols[2]],
            "reward_mean": [s / n for s, n in zip(cols[3], cols[1], strict=True)],
            "reward_min": list(cols[4]),
            "reward_max": list(cols[5]),
        },
        schema=PROMPT_STATS,
    )


def scored_prompt_stats(scored: pa.Table, iteration: int, success_threshold: float) -> pa.Table:
    """:func:`prompt_stats_table` of a scored-rollouts table (verify commits it; the sampler
    derives it this way for iterations scored before prompt stats existed)."""
    return prompt_stats_table(
        scored.column("prompt_id").to_pylist(),
        scored.column("data_source").to_pylist(),
        scored.column("reward").to_pylist(),
        iteration,
        success_threshold,
    )


def group_shares(table: pa.Table) -> dict[str, float]:
    """The verify figures of one iteration's prompt stats: how many groups, the share whose
    rewards all agree (zero GRPO signal), all succeeded, all failed, and the pass rate."""
    n = table.num_rows
    if n == 0:
        return {"groups": 0}
    attempts = np.asarray(table.column("attempts"))
    successes = np.asarray(table.column("successes"))
    equal = np.asarray(table.column("reward_min")) == np.asarray(table.column("reward_max"))
    return {
        "groups": n,
        "zero_signal_share": float(equal.mean()),
        "all_correct_share": float((successes == attempts).mean()),
        "all_wrong_share": float((successes == 0).mean()),
        "pass_rate": float(successes.sum() / attempts.sum()),
    }


def row_of(prompt_id: str, prefix: str = "train") -> int:
    """The train-set row of a prompt id (`train-0001234` -> 1234)."""
    head, _, index = prompt_id.rpartition("-")
    if head != prefix or not index.isdigit():
        raise ValueError(f"prompt_id {prompt_id!r} is not of the form {prefix}-<row>")
    return int(index)
