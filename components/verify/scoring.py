"""Scoring a rollouts table: each data source's reward components (verl's well-known data
sources, then the config's `verify.rewards`), run in the executor's process pool, summed with
their weights, plus the overlong penalty and an environment's reward. The verify stage and the
evaluate stage both score with it; `rlvr check` resolves the same routing table."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from components.core.config import OverlongPenalty, RewardSpec
from components.core.errors import StageError
from components.core.schemas import COMPONENTS, SCORED
from components.verify.executor import ScoreItem, ScoreResult, score_batch
from components.verify.format import soft_overlong_penalty

# verl's well-known data sources and the verifier that scores them; config entries win.
DEFAULT_REWARDS: dict[str, str] = {
    "openai/gsm8k": "math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "math_dapo": "math",
}


Component = tuple[str, str, float]  # (name, verifier spec, weight)
_Owner = tuple[int, str, float]  # (row, component name, weight) of one scored item


def resolve_rewards(
    data_sources: set[str], rewards: dict[str, str | RewardSpec]
) -> dict[str, list[Component]]:
    """data_source -> its reward components, or StageError listing what is registered."""
    table = {**DEFAULT_REWARDS, **rewards}
    missing = sorted(d for d in data_sources if d not in table)
    if missing:
        raise StageError(
            f"no verifier registered for data_source {missing}; registered data sources: "
            f"{sorted(table)}. Add e.g. `verify.rewards: {{{missing[0]!r}: math}}` to the config "
            "(built-ins: math, exact, code, format; or a plugin 'module:function' / 'file.py:function')"
        )
    out: dict[str, list[Component]] = {}
    for d in data_sources:
        spec = table[d]
        if isinstance(spec, str):
            out[d] = [(spec, spec, 1.0)]
        else:
            out[d] = [(c.key, c.verifier, c.weight) for c in spec.components]
    return out


def describe(components: list[Component]) -> str:
    """The `verifier` column: the spec, or `w*name:spec + ...` for a weighted sum."""
    if len(components) == 1 and components[0][2] == 1.0:
        return components[0][1]
    return " + ".join(f"{w:g}*{name}:{spec}" for name, spec, w in components)


@dataclass
class _Rows:
    """Per-row scoring results: the reward, each component's value, the first extracted answer
    and the errors; plus how many items each verifier failed or timed out on."""

    reward: list[float]
    components: list[dict[str, float]]
    answer: list[str | None]
    errors: list[list[str]]
    error_counts: Counter[str] = field(default_factory=Counter)
    timeout_counts: Counter[str] = field(default_factory=Counter)

    @classmethod
    def empty(cls, n: int) -> _Rows:
        return cls([0.0] * n, [{} for _ in range(n)], [None] * n, [[] for _ in range(n)])


def score_table(
    table: pa.Table,
    rewards: dict[str, str | RewardSpec],
    *,
    num_workers: int,
    timeout_s: float,
    max_error_fraction: float,
    overlong: OverlongPenalty | None = None,
    env_reward_weight: float = 1.0,
) -> tuple[pa.Table, dict[str, Any]]:
    """Score a rollouts table; returns the scored table and stats.

    reward = sum_k weight_k * component_k (+ the overlong penalty, + the environment's reward
    times `env_reward_weight` where the rollouts carry `env_reward`); every component's value is
    kept in `reward_components`. A component that raises or times out contributes 0 and its
    error goes to `verify_error`; the stage fails when more than `max_error_fraction` of the
    samples had an error.
    """
    sources = table.column("data_source").to_pylist()
    plan = resolve_rewards(set(sources), rewards)
    items, owner = _component_items(table, sources, plan)
    t0 = time.perf_counter()
    results = score_batch(items, num_workers=num_workers, timeout_s=timeout_s)
    elapsed = time.perf_counter() - t0

    rows = _sum_components(len(sources), items, results, owner, plan)
    if overlong is not None:
        _add_overlong_penalty(rows, table, overlong)
    if "env_reward" in table.column_names and env_reward_weight:
        for row, value in enumerate(table.column("env_reward").to_pylist()):
            rows.components[row]["env"] = env_reward_weight * float(value or 0.0)
            rows.reward[row] += rows.components[row]["env"]
    stats = _stats(rows, sources, plan, len(items) / elapsed if elapsed > 0 else 0.0)
    _check_error_fraction(rows, max_error_fraction)
    return _scored_table(table, rows, sources, plan), stats


def _component_items(
    table: pa.Table, sources: list[str], plan: dict[str, list[Component]]
) -> tuple[list[ScoreItem], list[_Owner]]:
    """One item per row and reward component, and the row and component each belongs to."""
    responses = table.column("response").to_pylist()
    truths = table.column("ground_truth").to_pylist()
    extras = [json.loads(e) if e else None for e in table.column("extra_info").to_pylist()]
    items: list[ScoreItem] = []
    owner: list[_Owner] = []
    for row, ds in enumerate(sources):
        for name, spec, weight in plan[ds]:
            items.append(ScoreItem(spec, ds, responses[row], truths[row], extras[row]))
            owner.append((row, name, weight))
    return items, owner


def _sum_components(
    n: int,
    items: list[ScoreItem],
    results: list[ScoreResult],
    owner: list[_Owner],
    plan: dict[str, list[Component]],
) -> _Rows:
    """Each row's weighted sum of its components, its first extracted answer and its errors
    (prefixed by the component's name where the row has several components)."""
    rows = _Rows.empty(n)
    for item, res, (row, name, weight) in zip(items, results, owner, strict=True):
        rows.components[row][name] = res.reward
        rows.reward[row] += weight * res.reward
        if rows.answer[row] is None:
            rows.answer[row] = res.extracted_answer
        if res.timed_out:
            rows.timeout_counts[item.verifier] += 1
        elif res.error is not None:
            rows.error_counts[item.verifier] += 1
        if res.error is not None:
            rows.errors[row].append(
                res.error if len(plan[item.data_source]) == 1 else f"{name}: {res.error}"
            )
    return rows


def _add_overlong_penalty(rows: _Rows, table: pa.Table, overlong: OverlongPenalty) -> None:
    lengths = [len(t) for t in table.column("response_token_ids").to_pylist()]
    for row, length in enumerate(lengths):
        pen = soft_overlong_penalty(
            length,
            max_length=overlong.max_length,
            buffer=overlong.buffer,
            penalty=overlong.penalty,
        )
        rows.components[row]["overlong"] = pen
        rows.reward[row] += pen


def _stats(
    rows: _Rows, sources: list[str], plan: dict[str, list[Component]], per_s: float
) -> dict[str, Any]:
    n = len(rows.reward)
    bad = sum(1 for e in rows.errors if e)
    stats: dict[str, Any] = {
        "samples": n,
        "reward_mean": sum(rows.reward) / n if n else 0.0,
        "errors": dict(rows.error_counts),
        "timeouts": dict(rows.timeout_counts),
        "error_fraction": bad / n if n else 0.0,
        "verifications_per_s": per_s,
        "verifiers": {d: describe(c) for d, c in plan.items()},
    }
    by_source: dict[str, list[float]] = {}
    for ds, r in zip(sources, rows.reward, strict=True):
        by_source.setdefault(ds, []).append(r)
    stats["reward_mean_by_data_source"] = {k: sum(v) / len(v) for k, v in by_source.items()}
    keys = sorted({k for c in rows.components for k in c})
    stats["reward_components_mean"] = (
        {k: sum(c.get(k, 0.0) for c in rows.components) / n for k in keys} if n else {}
    )
    return stats


def _check_error_fraction(rows: _Rows, max_error_fraction: float) -> None:
    """StageError when more than ``max_error_fraction`` of the rows had an error."""
    n = len(rows.reward)
    bad = sum(1 for e in rows.errors if e)
    if n and bad / n > max_error_fraction:
        first = next(e[0] for e in rows.errors if e)
        raise StageError(
            f"{bad}/{n} samples errored or timed out (> verify.max_error_fraction="
            f"{max_error_fraction}); first error: {first}. Fix the verifier or raise the limit"
        )


def _scored_table(
    table: pa.Table, rows: _Rows, sources: list[str], plan: dict[str, list[Component]]
) -> pa.Table:
    """The rollouts table with the scoring columns, in the SCORED schema's column order."""
    scored = (
        table.append_column("reward", pa.array(rows.reward, pa.float32()))
        .append_column("verifier", pa.array([describe(plan[d]) for d in sources], pa.string()))
        .append_column("extracted_answer", pa.array(rows.answer, pa.string()))
        .append_column(
            "verify_error",
            pa.array(["; ".join(e) if e else None for e in rows.errors], pa.string()),
        )
        .append_column(
            "reward_components",
            pa.array(
                [[{"name": k, "value": v} for k, v in c.items()] for c in rows.components],
                COMPONENTS,
            ),
        )
    )
    extra_cols = [c for c in scored.column_names if c not in SCORED.names]
    return scored.select(SCORED.names + extra_cols)
