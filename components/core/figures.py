"""One naming scheme for a run's training dynamics (docs/contracts.md, "Training dynamics").

Every stage commits its figures in its output's `_SUCCESS` stats; this module names them:

* ``rollout/…``  generate: response length, truncation, tokens/s, the prompt sampler's figures;
* ``verify/…``   verify: reward, per data source and component, errors, and the share of GRPO
  groups with no signal (every sample of a prompt got the same reward);
* ``train/…``    train: loss, KL, clip fractions, entropy, gradient norm, learning rate, …;
* ``health/…``   train: the run's health after the iteration (components/core/run_control.py);
* ``eval/…``     evaluate: ``eval/<set>/pass@k``, ``mean@n``, ``maj@k`` and 95% CI bounds;
* ``time/…``     each stage's seconds of one iteration (``time/<stage>_s``: everything but the
  wait for inputs; ``time/<stage>_work_s``: sampling, scoring or updating alone).

The step is the iteration: generate, verify and train of iteration i sample, score and update
policy i, and evaluate's step c is checkpoint c (the policy after c updates), so eval/… and the
rest share one x-axis. The same functions serve the trackers (each stage logs its own figures
when it commits) and the run dashboard (which reads every manifest), so both show one set of
names and values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["FAMILIES", "combine_shards", "eval_figures", "stage_figures"]

#: Figure families, in the order the dashboard shows them.
FAMILIES = ("eval", "verify", "rollout", "train", "health", "time")

_ROLLOUT_KEYS = {
    "response_length_mean": "rollout/response_length_mean",
    "response_length_max": "rollout/response_length_max",
    "truncated_fraction": "rollout/truncated_fraction",
    "tokens_per_s": "rollout/tokens_per_s",
    "response_tokens": "rollout/response_tokens",
    "samples": "rollout/samples",
    "prompts": "rollout/prompts",
    "skipped_prompts": "rollout/skipped_prompts",
    "policy_version": "rollout/policy_version",
    "policy_load_s": "rollout/policy_load_s",
    # multi-turn rollouts (generate.tools)
    "turns_mean": "rollout/turns_mean",
    "tool_calls": "rollout/tool_calls",
    "tool_calls_per_sample": "rollout/tool_calls_per_sample",
    "tool_call_rate": "rollout/tool_call_rate",
    "tool_error_share": "rollout/tool_error_share",
}
_VERIFY_KEYS = {
    "reward_mean": "verify/reward_mean",
    "error_fraction": "verify/error_fraction",
    "verifications_per_s": "verify/verifications_per_s",
    "samples": "verify/samples",
    "groups": "verify/groups",
    "zero_signal_share": "verify/zero_signal_share",
    "all_correct_share": "verify/all_correct_share",
    "all_wrong_share": "verify/all_wrong_share",
    "pass_rate": "verify/pass_rate",
}
#: How shards of one iteration combine: sums, maxima, or means weighted by a count figure.
_SUMS = {
    "rollout/samples",
    "rollout/prompts",
    "rollout/response_tokens",
    "rollout/skipped_prompts",
    "rollout/tool_calls",
    "verify/samples",
    "verify/groups",
}
_MAXIMA = {"rollout/response_length_max", "rollout/policy_load_s", "rollout/policy_version"}
_GROUP_WEIGHTED = {
    "verify/zero_signal_share",
    "verify/all_correct_share",
    "verify/all_wrong_share",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def _numbers(values: Mapping[str, Any] | None, name: Callable[[str], str | None]) -> dict:
    """The finite numbers of `values`, each under `name(key)` (keys it maps to None are left
    out)."""
    out: dict[str, float] = {}
    for key, value in (values or {}).items():
        if (new := name(key)) is not None and (x := _number(value)) is not None:
            out[new] = x
    return out


def _seconds(timeline: Mapping[str, Any] | None, stage: str) -> dict[str, float]:
    if not timeline:
        return {}
    seconds = timeline.get("seconds") or {}
    busy = sum(v for k, v in seconds.items() if k not in ("wait", "turn", "start"))
    out = {f"time/{stage}_s": float(busy)}
    if "work" in seconds:
        out[f"time/{stage}_work_s"] = float(seconds["work"])
    if "lm_eval" in seconds:  # evaluate: the standard benchmarks' share
        out[f"time/{stage}_lm_eval_s"] = float(seconds["lm_eval"])
    return out


def stage_figures(stage: str, stats: Mapping[str, Any]) -> dict[str, float]:
    """The named figures of one committed stage output (one shard), from its manifest stats.

    Args:
        stage: ``generate``, ``verify`` or ``train`` (evaluate: :func:`eval_figures`).
        stats: the ``stats`` of the output's ``_SUCCESS`` manifest.

    Returns:
        ``{name: value}`` with finite floats only; keys a stage did not record are absent.
    """
    if stage == "generate":
        out = _numbers(stats, _ROLLOUT_KEYS.get)
        out |= _numbers(stats.get("sampler"), lambda key: f"rollout/sampler_{key}")
    elif stage == "verify":
        out = _numbers(stats, _VERIFY_KEYS.get)
        out |= _numbers(stats.get("reward_mean_by_data_source"), "verify/reward_mean/{}".format)
        components = stats.get("reward_components_mean") or {}
        if len(components) > 1:  # one component is reward_mean itself
            out |= _numbers(components, "verify/reward/{}".format)
    elif stage == "train":
        out = _numbers(stats, lambda key: key if key.startswith(("train/", "health/")) else None)
    else:
        raise ValueError(f"unknown stage {stage!r}: expected generate, verify or train")
    out.update(_seconds(stats.get("timeline"), stage))
    return out


def eval_figures(metrics: Mapping[str, Any], stats: Mapping[str, Any] | None = None) -> dict:
    """The named figures of one committed evaluation (``evals/<c>/metrics.json``).

    Every eval set's overall summary becomes ``eval/<set>/<metric>``, a CI ``[lo, hi]`` becomes
    ``…_ci95_lo`` / ``…_ci95_hi``; each lm-eval task's or group's metrics (a group's members
    stay in metrics.json) and standard errors become
    ``eval/lm_eval/<task>/<metric>``, with ``…_ci95_lo`` / ``_hi`` at 1.96 standard errors; ``stats`` (the manifest's) adds ``time/evaluate_s`` (and
    ``time/evaluate_lm_eval_s``).
    """
    out: dict[str, float] = {}
    sets = metrics.get("sets") or {metrics.get("eval_set", "eval"): metrics}
    for name, m in sets.items():
        for key, value in (m.get("overall") or {}).items():
            if key == "n" or key == "num_problems":
                continue
            if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
                lo, hi = _number(value[0]), _number(value[1])
                if lo is not None and hi is not None and key.endswith("_ci95"):
                    out[f"eval/{name}/{key}_lo"] = lo
                    out[f"eval/{name}/{key}_hi"] = hi
            elif (x := _number(value)) is not None:
                out[f"eval/{name}/{key}"] = x
    for task, res in (metrics.get("lm_eval") or {}).items():  # standard benchmarks
        if res.get("parent"):  # a group's member: in metrics.json, not one figure per subtask
            continue
        values = res.get("metrics") or {}
        for key, value in values.items():
            if (x := _number(value)) is None:
                continue
            out[f"eval/lm_eval/{task}/{key}"] = x
            err = _number(values.get(f"{key}_stderr"))
            if err is not None and not key.endswith("_stderr"):  # a normal 95% interval
                out[f"eval/lm_eval/{task}/{key}_ci95_lo"] = x - 1.96 * err
                out[f"eval/lm_eval/{task}/{key}_ci95_hi"] = x + 1.96 * err
    if stats:
        out.update(_seconds(stats.get("timeline"), "evaluate"))
    return out


def combine_shards(shards: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One iteration's figures from its shards' (each from :func:`stage_figures`).

    Counts add up; maxima and seconds take the slowest shard (shards run side by side); rates per
    second add up; every other figure is a mean weighted by the shard's samples (or, for the
    group shares, its groups), which is what one unsharded run would have recorded.
    """
    if len(shards) == 1:
        return dict(shards[0])
    out: dict[str, float] = {}
    names = sorted({k for s in shards for k in s})
    for name in names:
        present = [s for s in shards if name in s]
        values = [s[name] for s in present]
        if name in _SUMS or name.endswith("per_s"):
            out[name] = sum(values)
        elif name in _MAXIMA or name.startswith("time/"):
            out[name] = max(values)
        else:
            weight_key = "verify/groups" if name in _GROUP_WEIGHTED else _count_of(name)
            weights = [s.get(weight_key, 1.0) for s in present]
            total = sum(weights)
            out[name] = (
                sum(w * v for w, v in zip(weights, values, strict=True)) / total
                if total > 0
                else sum(values) / len(values)
            )
    return out


def _count_of(name: str) -> str:
    if name == "rollout/tool_error_share":  # a share of the calls, not of the samples
        return "rollout/tool_calls"
    return "verify/samples" if name.startswith("verify/") else "rollout/samples"
