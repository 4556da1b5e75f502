"""Helpers shared by the benchmarks that compare learning: evaluate every checkpoint of a run
with rlvr's evaluator (the same sample seeds for every checkpoint and side), and compare."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (the platform's word elsewhere)."""
    import platform
    import re

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def bench_setup(name: str, config: str, iterations: int | None, overrides=()):
    """A fresh output folder `benchmarks/out/<name>-<time>/` and the config of its runs: the
    store under `runs/`, the inputs prepared (built offline on first use, untimed)."""
    from components.core.config import load_config
    from pipelines.local import prepare_inputs

    bench = ROOT / "benchmarks" / "out" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    bench.mkdir(parents=True)
    cfg = load_config(config, list(overrides), iterations=iterations)
    cfg.run.store = str(bench / "runs")
    prepare_inputs(cfg)
    return bench, cfg


def ci(m: dict) -> str:
    """pass@1 [95% CI] of an `overall` metrics record."""
    lo, hi = m["pass@1_ci95"]
    return f"{m['pass@1']:.3f} [{lo:.3f}, {hi:.3f}]"


def timed(cmd: list[str], log: Path) -> float:
    """Wall seconds of `cmd` as a whole process (its output goes to `log`)."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} failed ({proc.returncode}); see {log}")
    return wall


def evaluate_run(cfg, run_id: str) -> dict[int, dict]:
    """The `overall` metrics of every checkpoint the config evaluates, for run `run_id` (trained
    without evaluation: the eval sets are copied into it first)."""
    from components.core.layout import RunLayout
    from components.core.timing import Timeline
    from components.core.warm import eval_checkpoints
    from components.evaluate.stage import EvaluateStage
    from components.model import run_setup

    rcfg = cfg.model_copy(deep=True)
    rcfg.run.run_id = run_id
    run_setup.run(rcfg)
    stage = EvaluateStage(rcfg)
    out = {}
    try:
        for c in eval_checkpoints(rcfg):
            stage.step(c, timeline=Timeline("evaluate", c))
            path = Path(RunLayout.of(rcfg).evals(c), "metrics.json")
            out[c] = json.loads(path.read_text())["overall"]
    finally:
        stage.close()
    return out


def evaluate_dirs(cfg, dirs: dict[int, str]) -> dict[int, dict]:
    """The `overall` metrics of HF checkpoint directories, by checkpoint index."""
    from components.evaluate.local import evaluate_external

    out = {}
    for c, src in sorted(dirs.items()):
        res = evaluate_external(cfg, src)
        m = json.loads(Path(res["root"], "evals", "00000", "metrics.json").read_text())
        out[c] = m["overall"]
    return out


def compare_table(a: dict[int, dict], b: dict[int, dict], names: tuple[str, str]) -> bool:
    """Print pass@1 [95% CI] of two runs per checkpoint; True when every pair is within CI (each
    side's value inside the other's interval)."""
    print(
        f"\n{'checkpoint':>10}  {names[0] + ' pass@1 [95% CI]':>28}  "
        f"{names[1] + ' pass@1 [95% CI]':>28}  within CI"
    )
    all_within = True
    for c in sorted(a):
        x, y = a[c], b[c]
        (xl, xh), (yl, yh) = x["pass@1_ci95"], y["pass@1_ci95"]
        within = yl <= x["pass@1"] <= yh and xl <= y["pass@1"] <= xh
        all_within &= within
        print(
            f"{c:>10}  {x['pass@1']:.3f} [{xl:.3f}, {xh:.3f}]{'':>7}  "
            f"{y['pass@1']:.3f} [{yl:.3f}, {yh:.3f}]{'':>7}  {'yes' if within else 'NO'}"
        )
    return all_within


def overlap(a: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    """Seconds of the spans inside span `a`."""
    return sum(max(0.0, min(a[1], e) - max(a[0], s)) for s, e in spans)


def stage_overlaps(tl) -> dict[int, dict]:
    """Per iteration of a run's timeline (components/report/timeline.py): the generate step's
    work seconds, and how much of an evaluation's and of train's work spans lie inside it (an
    evaluation's waits for its turn are `turn` spans, cut out of its work)."""
    work = [(st, [(s, e) for k, s, e in st.spans if k == "work"]) for st in tl.steps]
    evals = [w for st, ws in work if st.stage == "evaluate" for w in ws]
    trains = [w for st, ws in work if st.stage == "train" for w in ws]
    out = {}
    for st, ws in work:
        if st.stage == "generate" and ws:
            span = ws[0]
            out[st.iteration] = {
                "work_s": span[1] - span[0],
                "evaluate_overlap_s": overlap(span, evals),
                "train_overlap_s": overlap(span, trains),
            }
    return out
