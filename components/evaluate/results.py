"""What an evaluation computes and writes from its scored samples: per-problem samples, pass@k,
maj@k and bootstrap CIs per eval set (metrics.py), the greedy metrics, the run's history, the
checkpoint's plots and its tables. The evaluate stage (stage.py) calls these."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from components.core.commit import (
    OutputDir,
)
from components.core.config import EvalSetConfig, RunConfig
from components.core.layout import RunLayout, committed_indices
from components.core.schemas import stamp
from components.core.store import Store
from components.evaluate.metrics import (
    CORRECT_THRESHOLD,
    ProblemSamples,
    default_ks,
    summarize,
    summarize_by,
)
from components.report.history import history
from components.report.markdown import render_markdown
from components.report.plots import plot_history, plot_pass_at_k

log = logging.getLogger("rlvr.evaluate")


def problems_from(table) -> list[ProblemSamples]:
    """Group scored samples by prompt. A sample is correct when its FIRST reward component (the
    correctness verifier; list it first in a weighted sum) is above 0.5; mean@n averages the
    total reward."""
    cols = {
        c: table.column(c).to_pylist()
        for c in (
            "prompt_id",
            "sample_index",
            "data_source",
            "reward",
            "extracted_answer",
            "response_token_ids",
            "reward_components",
        )
    }
    groups: dict[str, list[int]] = {}
    for i, pid in enumerate(cols["prompt_id"]):
        groups.setdefault(pid, []).append(i)

    def correct(i: int) -> bool:
        comps = cols["reward_components"][i]
        first = comps[0]["value"] if comps else cols["reward"][i]
        return float(first) > CORRECT_THRESHOLD

    out = []
    for pid in sorted(groups):
        rows = sorted(groups[pid], key=lambda i: cols["sample_index"][i])
        out.append(
            ProblemSamples(
                prompt_id=pid,
                data_source=cols["data_source"][rows[0]],
                rewards=[float(cols["reward"][i]) for i in rows],
                correct=[correct(i) for i in rows],
                extracted_answers=[cols["extracted_answer"][i] for i in rows],
                response_lengths=[len(cols["response_token_ids"][i]) for i in rows],
            )
        )
    return out


def compute_metrics(
    table, ev: EvalSetConfig, cfg: RunConfig, checkpoint_uri: str
) -> dict[str, Any]:
    problems = problems_from(table)
    ks = default_ks(ev.n, [*cfg.evaluate.ks, *ev.ks])
    opts = dict(ks=ks, bootstrap_resamples=cfg.evaluate.bootstrap_resamples, seed=cfg.evaluate.seed)
    return {
        "checkpoint": checkpoint_uri,
        "eval_set": ev.name,
        "n": ev.n,
        "overall": summarize(problems, **opts),
        "by_data_source": summarize_by(problems, "data_source", **opts),
    }


def write_table(out: OutputDir, table, name: str, tmp: Path) -> None:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(stamp(table.schema, "scored").metadata), path)
    out.put_file(path, name)


def greedy_metrics(table) -> dict[str, Any]:
    problems = problems_from(table)

    def acc(ps: list[ProblemSamples]) -> float:
        return sum(p.correct[0] for p in ps) / len(ps) if ps else 0.0

    by: dict[str, list[ProblemSamples]] = {}
    for p in problems:
        by.setdefault(p.data_source, []).append(p)
    return {"overall": acc(problems), "by_data_source": {k: acc(v) for k, v in sorted(by.items())}}


def write_outputs(
    cfg: RunConfig,
    store: Store,
    layout: RunLayout,
    c: int,
    results: dict[str, dict[str, Any]],
    out: OutputDir,
    tmp: Path,
    lm_eval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Samples, metrics, plots and the report of checkpoint c into `out` (not committed);
    `lm_eval`: the lm-eval suites' summaries by suite (lm_eval_suite.run_suite), written whole to
    `lm_eval.json` and by task into metrics.json's `lm_eval`."""
    ckpt_uri = layout.checkpoint(c)
    out.begin(force=True)
    all_metrics: dict[str, dict] = {}
    for ev in cfg.data.eval:
        res = results[ev.name]
        scored = res["samples"]
        write_table(out, scored, f"{ev.name}/samples.parquet", tmp)
        metrics = compute_metrics(scored, ev, cfg, ckpt_uri)
        if "samples_verify" in res:
            v = res["samples_verify"]
            metrics["verify"] = {k: v[k] for k in ("errors", "timeouts", "error_fraction")}
        if ev.greedy:
            write_table(out, res["greedy_samples"], f"{ev.name}/greedy_samples.parquet", tmp)
            g = greedy_metrics(res["greedy_samples"])
            metrics["overall"]["greedy_pass@1"] = g["overall"]
            for ds, value in g["by_data_source"].items():
                metrics["by_data_source"].setdefault(ds, {})["greedy_pass@1"] = value
        out.put_bytes(json.dumps(metrics, indent=2).encode(), f"{ev.name}/metrics.json")
        all_metrics[ev.name] = metrics

    primary = all_metrics[cfg.data.eval[0].name] if cfg.data.eval else {}
    top = {**primary, "checkpoint_index": c, "sets": all_metrics}
    if lm_eval:
        top["lm_eval"] = {t: r for s in lm_eval.values() for t, r in s["tasks"].items()}
        top["lm_eval_version"] = next(iter(lm_eval.values()))["lm_eval_version"]
        out.put_bytes(json.dumps(lm_eval, indent=2).encode(), "lm_eval.json")
    out.put_bytes(json.dumps(top, indent=2).encode(), "metrics.json")
    if primary:
        images = _plots(store, layout, c, top, tmp, out)
        report = render_markdown(
            {
                "model": ckpt_uri,
                "checkpoint": f"{c:05d}",
                **{k: primary[k] for k in ("overall", "by_data_source")},
            },
            history(store, layout, c, top),
            images,
        )
    else:
        report = f"# Evaluation report\n\n- **model**: {ckpt_uri}\n- **checkpoint**: {c:05d}\n"
    if lm_eval:
        report += standard_benchmarks_markdown(top)
    out.put_bytes(report.encode(), "report.md")
    return top


def standard_benchmarks_markdown(top: dict[str, Any]) -> str:
    """report.md's table of the lm-eval tasks: each metric with its standard error."""
    lines = ["", "## Standard benchmarks (lm-evaluation-harness)", ""]
    lines += [f"lm-eval {top.get('lm_eval_version')}", ""]
    lines += ["| task | version | shots | samples | metric | value | stderr |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for task, res in top["lm_eval"].items():
        n = res.get("n_samples", {}).get("effective", "")
        for name, value in res["metrics"].items():
            if name.endswith("_stderr"):
                continue
            err = res["metrics"].get(f"{name}_stderr")
            err_text = f"{err:.4f}" if err is not None else ""
            lines.append(
                f"| {task} | {res.get('version')} | {res.get('n_shot', '')} | {n} | {name} "
                f"| {value:.4f} | {err_text} |"
            )
    return "\n".join(lines) + "\n"


def suite_record(suites: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation's manifest records of its lm-eval suites, so that two checkpoints'
    numbers can be compared and a rerun reproduced: lm-eval's version, and each task's version,
    few-shot count and sample counts; the suites' seconds."""
    first = next(iter(suites.values()))
    return {
        "lm_eval_version": first["lm_eval_version"],
        "seconds": round(sum(s["seconds"] for s in suites.values()), 3),
        "tasks": {
            task: {k: res[k] for k in ("version", "n_shot", "n_samples")}
            for s in suites.values()
            for task, res in s["tasks"].items()
        },
    }


def _plots(
    store: Store, layout: RunLayout, c: int, top: dict, tmp: Path, out: OutputDir
) -> dict[str, str]:
    """pass@k against the base and the previous evaluated checkpoint; history over the run."""

    def curve(m: dict) -> dict[int, float]:
        return {
            int(k.split("@")[1]): v
            for k, v in m["overall"].items()
            if k.startswith("pass@") and "_" not in k
        }

    curves = {f"this ({c:05d})": curve(top)}
    previous = [i for i in committed_indices(store, layout.evals_dir) if i < c]
    for label, idx in (("base", 0), ("previous", previous[-1] if previous else None)):
        if idx is None or idx == c or idx not in previous:
            continue
        m = json.loads(store.read_text(layout.eval_metrics(idx)))
        curves.setdefault(f"{label} ({idx:05d})", curve(m))
    images = {}
    png = plot_pass_at_k(curves, tmp / "pass_at_k.png", f"pass@k, checkpoint {c:05d}")
    out.put_file(png, "pass_at_k.png")
    images["pass@k"] = "pass_at_k.png"
    png = plot_history(history(store, layout, c, top), tmp / "history.png")
    out.put_file(png, "history.png")
    images["history"] = "history.png"
    return images
