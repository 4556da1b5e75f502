"""Generate throughput and memory, each against a baseline measured side by side in this run.

    python benchmarks/generate_throughput.py [--prompts 64] [--n 8] [--max-new-tokens 32]
    python benchmarks/generate_throughput.py --model examples/smollm2/.build/base \
        --prompts-from examples/smollm2/.build/eval.parquet --prompts 16 --n 8 --max-new-tokens 64

1. Throughput: response tokens/s of the generate stage's code path (TransformersBackend + the
   Parquet part writer) against a bare `model.generate` loop on the same model, prompts and
   settings (same batch size, sampling, max_new_tokens). Goal: stage / bare >= 0.9. Rounds
   alternate between the two so machine noise hits both alike; the median of each is reported.
2. Against the machine: the stage's useful FLOP/s (2 x the matmul parameters, the output head
   included, per generated token, times tokens/s) against what one matmul of a decode step's
   shape (batch rows x hidden x intermediate) reaches here, timed in the same run. Goal (a
   real model, `--model`): at least half of the fp32 matmul. `--dtype bfloat16` runs the model
   in bf16 (the smollm2 example's generate.dtype) and also prints the ratio to a bf16 matmul.
   With `--model` it also prints the ceiling the step's matmuls set by themselves: the model's
   own weights (streamed from memory, unlike the reference's one cached weight) at the full
   batch and at a quarter of it.
3. Memory (the default tiny model only): peak RSS of the generate stage run as a subprocess with
   P and 10 x P prompts. Goal: ratio < 1.3 (rollouts stream to Parquet parts, so memory does not
   grow with prompts).
4. stage(vllm) / raw vLLM on a GPU node: benchmarks/vllm_throughput.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_model  # noqa: E402
from components.core.commit import OutputDir  # noqa: E402
from components.core.store import LocalStore  # noqa: E402
from components.generate.rollouts import PromptRow, generate_rollouts, prompts_from  # noqa: E402
from components.model.backends import SamplingSpec  # noqa: E402
from components.model.hf_backend import TransformersBackend  # noqa: E402
from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint  # noqa: E402


def make_prompts(k: int) -> list[PromptRow]:
    return [
        PromptRow(
            f"p{i}", "arithmetic", str(i), [{"role": "user", "content": f"{i}+{i * 7 % 97}="}], None
        )
        for i in range(k)
    ]


def read_prompts(path: Path, k: int) -> list[PromptRow]:
    """The first `k` prompts of a verl-format Parquet file (an example's eval set)."""
    import pyarrow.parquet as pq

    return prompts_from(pq.read_table(path), str(path), "p", list(range(k)))


def matmul_params(model) -> int:
    """Parameters that take part in a matmul per generated token: every 2-D weight except the
    input embedding, plus the output head (counted once more when tied to the embedding)."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not emb)
    return n + (head.numel() if head is emb else 0)


def matmul_gflops(
    rows: int, hidden: int, inter: int, dtype=torch.float32, seconds: float = 2.0
) -> float:
    """GFLOP/s of `[rows, hidden] x [hidden, inter]` (a decode step's MLP matmul) in `dtype`."""
    a, w = torch.randn(rows, hidden, dtype=dtype), torch.randn(inter, hidden, dtype=dtype)
    torch.nn.functional.linear(a, w)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.nn.functional.linear(a, w)
        n += 1
    return 2 * rows * hidden * inter * n / (time.perf_counter() - t0) / 1e9


def model_matmul_gflops(model, rows: int, seconds: float = 2.0) -> float:
    """GFLOP/s of the model's own matmuls at `rows` rows, alone: each 2-D weight counted by
    `matmul_params` (the output head included) times a `[rows, in]` input, one after another as
    a decode step runs them. Unlike `matmul_gflops`, whose one small weight stays in cache, these
    weights stream from memory at every step: this is what the matmuls of a decode step can reach
    here with nothing else in the step."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    weights = [p.detach() for p in model.parameters() if p.dim() == 2 and p is not emb]
    if head is emb:
        weights.append(head.detach())
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    flops = sum(2 * rows * w.numel() for w in weights)

    def step() -> None:
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    step()
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < seconds:
            step()
            n += 1
    return flops * n / (time.perf_counter() - t0) / 1e9


def bare_generate(model, tok, prompts: list[PromptRow], spec: SamplingSpec, batch: int) -> int:
    """A plain HF loop: left-padded batches of prompts x n, sample, count real response tokens."""
    texts = [
        tok.apply_chat_template(p.prompt, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    per_batch = max(1, batch // spec.n)
    tokens = 0
    # Left padding, as a decoder-only batch needs (a real tokenizer's default is right padding:
    # the rows would continue after their pads and end early).
    tok.padding_side = "left"
    for s in range(0, len(texts), per_batch):
        chunk = [t for t in texts[s : s + per_batch] for _ in range(spec.n)]
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=spec.temperature,
                top_p=spec.top_p,
                top_k=0,
                max_new_tokens=spec.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        resp = out[:, enc["input_ids"].shape[1] :]
        for row in resp.tolist():
            n = len(row)
            if tok.eos_token_id in row:
                n = row.index(tok.eos_token_id) + 1
            tokens += n
    return tokens


def stage_generate(model, tok, prompts, spec, batch: int) -> int:
    backend = TransformersBackend(model, tok, batch_size=batch)
    with tempfile.TemporaryDirectory() as tmp:
        out = OutputDir(LocalStore(), tmp, "bench")
        stats = generate_rollouts(
            out,
            backend,
            tok,
            prompts,
            spec,
            iteration=0,
            checkpoint_uri="bench",
            max_prompt_tokens=512,
            rows_per_part=4096,
            desc="stage",
            policy_version=0,
        )
    return stats["response_tokens"]


def peak_rss_mb(workdir: Path, prompts: int) -> float:
    """Peak RSS of `python -m components.generate` on a run with `prompts` prompts per iteration."""
    code = f"""
import resource, sys, subprocess
p = subprocess.run([sys.executable, "-m", "components.generate", "{workdir}/config.yaml",
    "--run-id", "mem{prompts}", "--set", "data.prompts_per_iteration={prompts}",
    "--set", "generate.rows_per_part=256"], cwd="{ROOT}", capture_output=True)
assert p.returncode == 0, p.stderr.decode()[-2000:]
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""
    from components.core.config import load_config
    from components.model import run_setup

    run_setup.run(load_config(workdir / "config.yaml", run_id=f"mem{prompts}"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="an HF checkpoint directory")
    ap.add_argument("--prompts-from", type=Path, default=None, help="verl-format Parquet")
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--memory-prompts", type=int, default=64)
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the model's dtype (--model only; bfloat16 is the example's generate.dtype)",
    )
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )

    if args.model:
        from components.model.checkpoint import load_policy

        model, tok = load_policy(args.model, dtype=getattr(torch, args.dtype))
        model.eval()
        name = f"{type(model).__name__} from {args.model}"
    else:
        tok = build_tokenizer()
        model = build_model(tok, hidden_size=args.hidden, num_layers=args.layers, num_heads=4)
        model.eval()
        name = "Qwen2 (examples/arithmetic's tokenizer)"
    params = sum(p.numel() for p in model.parameters())
    spec = SamplingSpec(
        n=args.n,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=args.max_new_tokens,
    )
    prompts = (
        read_prompts(args.prompts_from, args.prompts)
        if args.prompts_from
        else make_prompts(args.prompts)
    )
    print(
        f"model: {name}, {params / 1e6:.2f}M params, vocab {len(tok)}; {len(prompts)} prompts "
        f"x n={args.n}, max_new_tokens={args.max_new_tokens}, batch {args.batch}"
    )

    cfg = model.config
    rows = min(args.batch, len(prompts) * args.n)
    inter = getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
    flops_per_token = 2 * matmul_params(model)
    # The goal's reference is the fp32 matmul (the dtype the goal was set in); a bf16 model is
    # also put against a bf16 matmul, which on a CPU with AMX is several times faster. Each is
    # timed right after each round's stage side, and each round gives its own ratio: on a shared
    # host the machine's speed drifts by a quarter within minutes, which a reference timed once
    # at the end put into the ratio.
    ref_dtypes = sorted({torch.float32, model.dtype}, key=str, reverse=True)
    refs: dict[torch.dtype, list[float]] = {d: [] for d in ref_dtypes}

    stage_rates, bare_rates = [], []
    stage_generate(model, tok, prompts[:2], replace(spec, max_new_tokens=4), args.batch)  # warm
    for r in range(args.rounds):
        sides = [("stage", stage_generate, stage_rates), ("bare", bare_generate, bare_rates)]
        for side, fn, rates in sides if r % 2 == 0 else sides[::-1]:  # alternate who goes first
            torch.manual_seed(r)
            t0 = time.perf_counter()
            tokens = fn(model, tok, prompts, spec, args.batch)
            rate = tokens / (time.perf_counter() - t0)
            rates.append(rate)
            print(f"  round {r} {side:5s}: {tokens} tokens, {rate:,.1f} tokens/s", flush=True)
            if side == "stage":
                for d in ref_dtypes:
                    refs[d].append(matmul_gflops(rows, cfg.hidden_size, inter, d, seconds=1.0))
    s, b = statistics.median(stage_rates), statistics.median(bare_rates)
    print(
        f"\nthroughput  stage {s:,.1f} tok/s   bare model.generate {b:,.1f} tok/s   "
        f"stage/bare = {s / b:.2f}   (goal >= 0.9)"
    )

    useful = s * flops_per_token / 1e9
    print(f"machine     useful {useful:.1f} GFLOP/s ({flops_per_token / 1e6:.0f} MFLOP per token)")
    for dtype in ref_dtypes:
        ratios = [
            rate * flops_per_token / 1e9 / ref
            for rate, ref in zip(stage_rates, refs[dtype], strict=True)
        ]
        print(
            f"  vs a decode-step matmul [{rows}x{cfg.hidden_size}]x[{cfg.hidden_size}x{inter}] "
            f"{str(dtype).removeprefix('torch.')} {statistics.median(refs[dtype]):.1f} GFLOP/s   "
            f"ratio = {statistics.median(ratios):.2f} (rounds: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + ")"
            + ("   (goal >= 0.5 on a real model)" if dtype == torch.float32 else "")
        )
    if args.model:
        # The ceiling a decode step's matmuls set by themselves: the model's own weights, read
        # from memory at each step, at the full batch and at a batch a quarter full (the rows
        # left when most answers have ended).
        own = model_matmul_gflops(model, rows)
        tail = model_matmul_gflops(model, max(1, rows // 4))
        dt = str(model.dtype).removeprefix("torch.")
        print(
            f"  vs the model's own matmuls alone at {rows} rows {dt} {own:.1f} GFLOP/s   "
            f"ratio = {useful / own:.2f}\n"
            f"  (the same at {max(1, rows // 4)} rows, the tail's ceiling: {tail:.1f} GFLOP/s)"
        )
        return

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        from examples.arithmetic.data import write_datasets

        save_checkpoint(model, tok, work / "base")
        write_datasets(work, seed=0, n_train=max(1200, 10 * args.memory_prompts), n_eval=10)
        (work / "config.yaml").write_text(
            f"run: {{store: {work}/runs}}\nmodel: {{base: base}}\n"
            f"data: {{train: train.parquet}}\n"
            f"generate: {{n: {args.n}, max_new_tokens: {args.max_new_tokens}, "
            f"transformers: {{batch_size: {args.batch}}}}}\n"
        )
        small = peak_rss_mb(work, args.memory_prompts)
        large = peak_rss_mb(work, 10 * args.memory_prompts)
    print(
        f"peak RSS    {args.memory_prompts} prompts {small:,.0f} MB   "
        f"{10 * args.memory_prompts} prompts {large:,.0f} MB   ratio = {large / small:.2f}   (goal < 1.3)"
    )

    try:
        import vllm  # noqa: F401

        has_vllm = torch.cuda.is_available()
    except ImportError:
        has_vllm = False
    if not has_vllm:
        print("vllm: not importable or no GPU here; stage/raw-vLLM ratio not measured")


if __name__ == "__main__":
    main()
