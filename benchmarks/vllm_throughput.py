"""vLLM generate throughput on a GPU node: the stage's vLLM path against raw vLLM, side by side.

    python benchmarks/vllm_throughput.py --model /path/to/hf/checkpoint [--prompts 512] [--n 8]

Both sides use the same engine (one `vllm.LLM`), prompts and sampling settings, so the ratio
isolates our overhead: request construction with per-prompt seeds and logprobs, conversion into
Samples, and the Parquet part writer. Rounds alternate; medians are reported.
Goal: stage / raw vLLM >= 0.9 response tokens/s. Needs vllm and a CUDA GPU; on other
machines it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF checkpoint directory")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch
        import vllm  # noqa: F401

        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as e:
        print(f"vllm benchmark not run: {e} (needs vllm and a CUDA GPU)")
        return 0
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from components.core.commit import OutputDir
    from components.core.store import LocalStore
    from components.generate.rollouts import PromptRow, generate_rollouts
    from components.model.backends import SamplingSpec
    from components.model.vllm_backend import VLLMBackend

    backend = VLLMBackend(
        args.model, tensor_parallel_size=args.tensor_parallel_size, dtype="bfloat16"
    )
    tok = backend.tokenizer
    rows = [
        PromptRow(
            f"p{i}",
            "bench",
            "0",
            [{"role": "user", "content": f"Compute {i} * {i + 7} step by step."}],
            None,
        )
        for i in range(args.prompts)
    ]
    spec = SamplingSpec(
        n=args.n, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens
    )
    texts = [
        tok.apply_chat_template(r.prompt, add_generation_prompt=True, tokenize=False) for r in rows
    ]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]

    def raw() -> int:
        params = SamplingParams(
            n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_new_tokens, seed=0
        )
        outs = backend.llm.generate(
            [TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False
        )
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def stage() -> int:
        with tempfile.TemporaryDirectory() as tmp:
            out = OutputDir(LocalStore(), tmp, "bench")
            stats = generate_rollouts(
                out,
                backend,
                tok,
                rows,
                spec,
                iteration=0,
                checkpoint_uri=args.model,
                max_prompt_tokens=10**6,
                rows_per_part=4096,
                desc="stage",
            )
        return stats["response_tokens"]

    raw()  # warm-up: CUDA graphs, prefix cache
    s_rates, r_rates = [], []
    for r in range(args.rounds):
        sides = [("stage", stage, s_rates), ("raw", raw, r_rates)]
        for name, fn, rates in sides if r % 2 == 0 else sides[::-1]:  # alternate who goes first
            t0 = time.perf_counter()
            tokens = fn()
            rates.append(tokens / (time.perf_counter() - t0))
            print(f"  round {r} {name:5s}: {rates[-1]:,.0f} tokens/s")
    s, rr = statistics.median(s_rates), statistics.median(r_rates)
    print(
        f"\nstage(vllm) {s:,.0f} tok/s   raw vLLM {rr:,.0f} tok/s   stage/raw = {s / rr:.2f}   (goal >= 0.9)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
