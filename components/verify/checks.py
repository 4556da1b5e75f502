"""The verify section, checked before any work: every verifier spec resolves (plugins import),
every data_source of the train and eval sets has a verifier, and every verifier is called once
on a sample row of a data source it scores, in a worker process with the verify deadline, so a
plugin that raises, hangs or returns nonsense is found before any generation."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from components.core.config import RunConfig
from components.core.errors import Problems, UserError
from components.verify.executor import ScoreItem, score_batch
from components.verify.rewards import resolve_verifier
from components.verify.scoring import DEFAULT_REWARDS, resolve_rewards


def _specs(cfg: RunConfig) -> dict[str, list[tuple[str, str]]]:
    """data_source -> [(config key, verifier spec)] as configured."""
    out: dict[str, list[tuple[str, str]]] = {}
    for ds, spec in cfg.verify.rewards.items():
        if isinstance(spec, str):
            out[ds] = [(f"verify.rewards.{ds}", spec)]
        else:
            out[ds] = [
                (f"verify.rewards.{ds}.components[{i}].verifier", c.verifier)
                for i, c in enumerate(spec.components)
            ]
    return out


def check_verifier_specs(cfg: RunConfig, problems: Problems) -> set[str]:
    """Every configured spec resolves here; returns the specs that do."""
    good: set[str] = set()
    for entries in _specs(cfg).values():
        for key, spec in entries:
            try:
                resolve_verifier(spec)
                good.add(spec)
            except (UserError, ImportError, OSError, SyntaxError) as e:
                problems.error(
                    f"config {key}",
                    str(e),
                    "fix the spec, or make the plugin importable (PYTHONPATH)",
                )
    return good


def check_verify(
    cfg: RunConfig,
    datasets: dict[str, tuple[str, pa.Table]],
    problems: Problems,
    *,
    call: bool = True,
) -> None:
    """`datasets`: name -> (uri, table) of the train and eval sets."""
    good = check_verifier_specs(cfg, problems) | {
        spec for spec in DEFAULT_REWARDS.values() if spec in ("math", "exact", "format", "code")
    }
    table = {**DEFAULT_REWARDS, **cfg.verify.rewards}
    samples: dict[str, tuple[str, str, int, dict]] = {}  # data_source -> (uri, gt, row, extra)
    for _name, (uri, t) in datasets.items():
        sources = [s for s in pc.unique(t.column("data_source")).to_pylist() if s]
        missing = sorted(s for s in sources if s not in table)
        if missing:
            problems.error(
                f"{uri} data_source {missing}",
                "has no verifier",
                f"map it in the config, e.g. verify.rewards: {{{missing[0]!r}: math}} (built-ins: "
                "math, exact, code, format; or a plugin 'module:function' / 'file.py:function')",
            )
        for s in sources:
            if s in samples or s in missing:
                continue
            idx = pc.index(t.column("data_source"), s).as_py()
            row = t.slice(idx, 1).to_pylist()[0]
            gt = (row.get("reward_model") or {}).get("ground_truth")
            extra = row.get("extra_info")
            samples[s] = (
                uri,
                gt if isinstance(gt, str) else json.dumps(gt),
                idx,
                extra if isinstance(extra, dict) else None,
            )
    if not call or not samples:
        return
    items, where = [], []
    for ds, (uri, gt, idx, extra) in samples.items():
        for _key, spec, _w in resolve_rewards({ds}, cfg.verify.rewards)[ds]:
            if spec in good:  # a spec that does not resolve is already reported
                items.append(ScoreItem(spec, ds, gt or "", gt or "", extra))
                where.append((spec, ds, uri, idx))
    results = score_batch(items, num_workers=1, timeout_s=cfg.verify.timeout_s)
    for (spec, ds, uri, idx), res in zip(where, results, strict=True):
        if res.error is not None:
            problems.error(
                f"verifier {spec!r}",
                f"failed on a sample of data_source {ds!r} ({uri} row {idx}, the ground truth "
                f"as the response): {res.error}",
                "fix the verifier (or raise verify.timeout_s if it is only slow)",
            )
