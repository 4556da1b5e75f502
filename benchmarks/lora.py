"""LoRA vs full fine-tuning on the demo: what crosses from train to generate each iteration,
how long a warm engine takes to load it, the train step, and learning at equal rollouts.

    python benchmarks/lora.py [--rank 16] [--alpha 16] [--lr 5e-3] [--iterations N]

Both runs are the demo config from the same base, side by side in one invocation: the baseline
is full fine-tuning at the config's lr; the other sets `model.lora` and its own lr. Printed:
bytes per handoff (the train stage's checkpoint) and their ratio; generate's warm policy load
seconds (median over iterations); train work seconds (median); held-out pass@1 with its 95% CI
at the middle and the last checkpoint; and, from parameter counts on the meta device, the
handoff of a Qwen2.5-7B-shaped model at the same rank against its bf16 weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import timed  # noqa: E402


def figures(root: Path) -> dict:
    """Per-iteration handoff bytes, warm load and train seconds; pass@1 per checkpoint."""
    ckpts = sorted(p for p in (root / "checkpoints").iterdir() if p.name != "00000")
    train = [json.loads((p / "_SUCCESS").read_text())["stats"] for p in ckpts]
    gens = [json.loads(p.read_text())["stats"]
            for p in sorted(root.glob("iterations/*/rollouts/_SUCCESS"))]  # fmt: skip
    warm = [g["policy_load_s"] for g in gens if g.get("policy_load") == "weights"]
    evals = {int(p.parent.name): json.loads(p.read_text())["overall"]
             for p in root.glob("evals/[0-9]*/metrics.json")}  # fmt: skip
    return {
        "bytes": statistics.median(sum(f["bytes"] for f in json.loads(
            (p / "_SUCCESS").read_text())["files"] if f["path"].endswith(".safetensors"))
            for p in ckpts),
        "load_s": statistics.median(warm) if warm else float("nan"),
        "train_s": statistics.median(t["train/seconds"] for t in train),
        "evals": evals,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--iterations", type=int, default=None)
    args = ap.parse_args()

    from transformers import Qwen2Config

    from components.core.adapter import adapter_parameter_count
    from components.core.config import LoraSection, load_config
    from pipelines.cli import prepare_inputs

    bench = ROOT / "benchmarks" / "out" / f"lora-{time.strftime('%Y%m%d-%H%M%S')}"
    bench.mkdir(parents=True)
    cfg = load_config(args.config, iterations=args.iterations)
    cfg.run.store = str(bench / "runs")
    prepare_inputs(cfg)
    sides = {"full": [], "lora": ["--set", f"model.lora={{rank: {args.rank}, alpha: {args.alpha}}}",
                                  "--set", f"train.lr={args.lr}"]}  # fmt: skip
    out = {}
    for name, extra in sides.items():
        cmd = [sys.executable, "-m", "pipelines.cli", "run", args.config, "--run-id", name,
               "--set", f"run.store={cfg.run.store}", "--iterations", str(cfg.run.iterations),
               *extra]  # fmt: skip
        print(f"running {name} ...", flush=True)
        wall = timed(cmd, bench / f"{name}.log")
        out[name] = {**figures(Path(cfg.run.store, name)), "wall": wall}
        print(f"  {name}: {wall:.1f} s", flush=True)
    f, lo = out["full"], out["lora"]
    print(f"\nLoRA rank {args.rank}, alpha {args.alpha}, lr {args.lr} vs full fine-tuning "
          f"(lr {cfg.train.lr}):")  # fmt: skip
    print(f"  handoff per iteration: {lo['bytes']:,.0f} B vs {f['bytes']:,.0f} B "
          f"({f['bytes'] / lo['bytes']:.1f}x smaller)")  # fmt: skip
    print(f"  warm policy load in generate (median): {lo['load_s'] * 1e3:.1f} ms vs "
          f"{f['load_s'] * 1e3:.1f} ms (ratio {lo['load_s'] / f['load_s']:.2f})")  # fmt: skip
    print(f"  train work per iteration (median): {lo['train_s']:.2f} s vs {f['train_s']:.2f} s "
          f"(ratio {lo['train_s'] / f['train_s']:.2f})")  # fmt: skip
    cs = sorted(set(f["evals"]) & set(lo["evals"]))
    for c in (cs[len(cs) // 2], cs[-1]):
        a, b = f["evals"][c], lo["evals"][c]
        print(f"  checkpoint {c:>2} pass@1: full {a['pass@1']:.3f} [{a['pass@1_ci95'][0]:.3f}, "
              f"{a['pass@1_ci95'][1]:.3f}], LoRA {b['pass@1']:.3f} [{b['pass@1_ci95'][0]:.3f}, "
              f"{b['pass@1_ci95'][1]:.3f}]")  # fmt: skip
    q7 = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)  # fmt: skip
    adapter, base = adapter_parameter_count(q7, LoraSection(rank=args.rank))
    print(f"  Qwen2.5-7B shape: adapter {adapter / 1e6:.1f}M parameters vs {base / 1e9:.2f}B: "
          f"{base / adapter:.0f}x smaller per handoff (bf16 both)")  # fmt: skip
    print(f"  wall: full {f['wall']:.1f} s, LoRA {lo['wall']:.1f} s")
    print(f"outputs: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
