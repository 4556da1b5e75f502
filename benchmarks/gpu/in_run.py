"""The generate stage inside a finished run against bare `model.generate` on the same rows, and
train's tokens/s and MFU, read from the run's manifests (the GPU check: benchmarks/gpu/run2.sh).

    python benchmarks/gpu/in_run.py RUN_ROOT [--rounds 3] [--iterations 4] [--out FIGURES.json]

For each iteration whose policy checkpoint the run still keeps (retention: the base, the
evaluated ones, the last few), on the same device and dtype the run sampled in:

- in run: the stage's response tokens/s as its manifest recorded it (its sampling, the
  Parquet parts and the store included), with where the call's time went (`stats.phases`) and
  how long an evaluation or a train update computed at the same time;
- bare: `model.generate` on the same prompts x n, left-padded, with the run's sampling
  settings, max_new_tokens and stop tokens; response tokens counted up to and including the
  first stop token, as the stage counts them. The median of --rounds after one warm-up;
- the stage's backend alone (TransformersBackend on the same requests, no pipeline around
  it, with the run's `generate.transformers.cuda_graphs`), and the same backend with eager decode steps on
  the growing cache (`eager`: what the graphs are measured against), alternating with bare so
  machine noise hits all alike.

Then the ratios in run / bare, alone / bare and alone / eager per iteration, and their
medians (with the graphs the stage captured, or why they were off, from `stats.phases`); train's
tokens/s per iteration and its MFU (6 x parameters x tokens/s over the GPU's dense bf16 peak;
train also recomputes the old log-probabilities, a forward more, not counted); and the policy
handoff's share of an iteration (components/report/timeline.py). Prints a table and writes
the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import stage_overlaps  # noqa: E402
from components.core.commit import committed_files, read_manifest  # noqa: E402
from components.core.config import RunConfig  # noqa: E402
from components.core.layout import RunLayout  # noqa: E402
from components.core.schemas import read_records  # noqa: E402
from components.core.store import get_store, join  # noqa: E402
from components.generate.rollouts import spec_from  # noqa: E402
from components.model.backends import PromptRequest  # noqa: E402
from components.model.checkpoint import load_policy  # noqa: E402
from components.model.hf_backend import TransformersBackend, left_pad  # noqa: E402
from components.report.timeline import handoff_times, load_timeline, summary  # noqa: E402

#: Dense bf16 peak FLOP/s by the name CUDA gives the card (the vendors' datasheets, no sparsity).
PEAK_BF16 = {"H200": 989.5e12, "H100": 989.5e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def peak_flops() -> tuple[str, float | None]:
    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    return name, next((v for k, v in PEAK_BF16.items() if k in name), None)


def requests_of(store, uri: str) -> tuple[list[PromptRequest], int]:
    """The iteration's prompts (in first-seen order) with their rows' seeds, and n."""
    table = read_records(store, committed_files(store, uri, ".parquet"), "rollouts").to_pylist()
    by: dict[str, list] = {}
    for r in table:
        by.setdefault(r["prompt_id"], []).append(r)
    reqs = [
        PromptRequest(
            pid, list(rows[0]["prompt_token_ids"]), [7919 * k + j for j in range(len(rows))]
        )
        for k, (pid, rows) in enumerate(by.items())
    ]
    return reqs, max(len(rows) for rows in by.values())


def timed(fn, device: str) -> tuple[int, float]:
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    tokens = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - t


def measure(ckpt_dir: str, reqs: list[PromptRequest], cfg: RunConfig, rounds: int) -> dict:
    """Bare `model.generate`, the stage's backend alone and that backend's eager steps on the
    same requests: tokens/s, the median of `rounds` after one warm-up each, alternating."""
    from components.model.checkpoint import device_and_dtype

    device, dtype = device_and_dtype(cfg.generate.dtype)
    model, tok = load_policy(Path(ckpt_dir), dtype=dtype, device=device)
    spec = spec_from(cfg.generate, cfg.run.seed)
    graphs = cfg.generate.transformers.cuda_graphs and device.startswith("cuda")
    backend, eager_backend = (
        TransformersBackend(
            model, tok, batch_size=cfg.generate.transformers.batch_size, device=device, graphs=g
        )
        for g in (graphs, False)
    )
    backend.before_forward = eager_backend.before_forward = None  # alone: no turns to wait for
    stops = sorted(backend.eos_ids | set(spec.stop_token_ids))
    prompts = [r.prompt_token_ids for r in reqs for _ in range(spec.n)]
    ids, attn = left_pad(prompts, max(map(len, prompts)), tok.pad_token_id)
    ids, attn = ids.to(device), attn.to(device)
    stop_t = torch.tensor(stops, device=device)

    def bare() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=spec.temperature > 0,
                temperature=spec.temperature or None,
                top_k=spec.top_k or 0,
                top_p=spec.top_p,
                max_new_tokens=spec.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=stops,
            )
        resp = out[:, ids.shape[1] :]
        hit = torch.isin(resp, stop_t)
        first = torch.where(hit.any(1), hit.int().argmax(1) + 1, resp.shape[1])
        return int(first.sum())

    def sample(b: TransformersBackend) -> int:
        return sum(len(s.response_token_ids) for batch in b.generate(reqs, spec) for s in batch)

    fns = {"bare": bare, "alone": lambda: sample(backend), "eager": lambda: sample(eager_backend)}
    for fn in fns.values():  # warm-up
        timed(fn, device)
    got: dict[str, list] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n, s = timed(fn, device)
            got[name].append(n / s)
    out = {k: statistics.median(v) for k, v in got.items()} | {"rounds": got}
    return out | {"alone_phases": backend.clock.take()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=4, help="at most this many measured")
    ap.add_argument("--skip", default="", help="iterations left out (profiled ones), e.g. 1,5")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    store = get_store(args.root)
    layout_root = args.root.rstrip("/")
    cfg = RunConfig.model_validate(yaml.safe_load(store.read_text(join(layout_root, "run.yaml"))))
    layout = RunLayout.of(cfg)
    tl = load_timeline(store, layout_root)
    rows = stage_overlaps(tl)
    skip = {int(x) for x in args.skip.split(",") if x}
    figures: dict = {"device": peak_flops()[0], "iterations": {}}

    kept = [
        i
        for i in sorted(rows)
        if i not in skip and store.exists(join(layout.checkpoint(i), "config.json"))  # not retired
    ]
    # evenly over the kept ones, the first and the last included
    step = max(1, -(-(len(kept) - 1) // max(1, args.iterations - 1)))
    picked = (kept[::step] + kept[-1:])[: args.iterations] if kept else []
    for i in sorted(rows):
        m = read_manifest(store, layout.rollouts(i))["stats"]
        row = {
            **rows[i],
            "in_run": m["tokens_per_s"],
            "tokens": m["response_tokens"],
            "seconds": m["seconds"],
            "phases": m.get("phases", {}),
        }
        if i in picked:
            reqs, _ = requests_of(store, layout.rollouts(i))
            row.update(measure(layout.checkpoint(i), reqs, cfg, args.rounds))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            row["in_run/bare"] = row["in_run"] / row["bare"]
            row["alone/bare"] = row["alone"] / row["bare"]
            row["alone/eager"] = row["alone"] / row["eager"]
        figures["iterations"][i] = row

    measured = [r for r in figures["iterations"].values() if "bare" in r]
    if measured:
        figures["in_run/bare_median"] = statistics.median(r["in_run/bare"] for r in measured)
        figures["alone/bare_median"] = statistics.median(r["alone/bare"] for r in measured)
        figures["alone/eager_median"] = statistics.median(r["alone/eager"] for r in measured)
    figures.update(train_figures(store, layout, cfg, sorted(rows)))
    s = summary(tl)
    figures["handoff_share"] = s["handoff_share"]
    figures["handoff_s"] = s["handoff_s"]
    figures["iteration_s"] = s["iteration_s"]
    figures["handoff_per_iteration_s"] = [round(h, 3) for _, h, _ in handoff_times(tl)]
    print(report(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1, default=float) + "\n")


def train_figures(store, layout: RunLayout, cfg: RunConfig, iterations: list[int]) -> dict:
    """Train's tokens/s per iteration (its manifests' metrics) and the MFU of their median."""
    from safetensors import safe_open

    tps = []
    for i in iterations:
        try:
            stats = read_manifest(store, layout.checkpoint(i + 1))["stats"]
        except Exception:  # noqa: BLE001 - a stopped run's last iterations
            continue
        if "train/tokens_per_s" in stats:
            tps.append(float(stats["train/tokens_per_s"]))
    params = 0
    for f in Path(layout.checkpoint(0)).glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            params += sum(_numel(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118
    name, peak = peak_flops()
    out = {"train_tokens_per_s": tps, "params": params}
    if tps:
        med = statistics.median(tps)
        out["train_tokens_per_s_median"] = med
        out["train_model_flops_per_s"] = 6 * params * med
        if peak:
            out["train_mfu"] = 6 * params * med / peak
    return out


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def report(f: dict) -> str:
    lines = [
        f"device: {f['device']}",
        "iter  in-run tok/s  bare  alone  eager  in/bare  alone/bare  alone/eager  decode ms/step"
        "  eval overlap s  phases",
    ]
    for i, r in f["iterations"].items():
        ph = r.get("phases", {})
        phases = " ".join(
            f"{k.removesuffix('_s')} {v:.2f}" for k, v in ph.items() if k.endswith("_s")
        ) + "".join(f" {k} {ph[k]}" for k in ("graph_captures", "graphs_off") if k in ph)
        lines.append(
            f"{i:>4}  {r['in_run']:12.0f}  {r.get('bare', float('nan')):5.0f}  {r.get('alone', float('nan')):5.0f}"
            f"  {r.get('eager', float('nan')):5.0f}  {r.get('in_run/bare', float('nan')):7.2f}"
            f"  {r.get('alone/bare', float('nan')):10.2f}  {r.get('alone/eager', float('nan')):11.2f}"
            f"  {ph.get('decode_ms_per_step', float('nan')):14.1f}  {r['evaluate_overlap_s']:14.2f}  {phases}"
        )
    for k in (
        "in_run/bare_median",
        "alone/bare_median",
        "alone/eager_median",
        "train_tokens_per_s_median",
        "train_mfu",
        "handoff_share",
        "handoff_s",
        "iteration_s",
    ):
        if k in f:
            lines.append(f"{k}: {f[k]:.4g}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
