"""Checkpoint save and load throughput against the disk's own sequential throughput.

    python benchmarks/checkpoint_io.py [--hidden 1024] [--layers 8] [--store DIR] [--rounds 3]

A Qwen2 model of the given size (about 0.1 B parameters, 0.4 GB of float32 by default) is saved the
way the train stage saves a checkpoint (its weights streamed one tensor at a time into safetensors,
hashed as written, components/model/weights.py; renamed into a store directory and committed with
the sha256s in the manifest) and loaded the way a warm generate engine takes a new
policy (weights read into the running model in place, components/model/engine.py) and the way
a cold stage loads one (from_pretrained). The baseline, measured side by side on the same
filesystem with the same number of bytes: one sequential write of a file (in 8 MiB chunks,
flushed and fsynced) and one sequential read of it. Printed: bytes/s of each and the ratio to the
baseline (goal: close to 1; saving also hashes every byte). The page cache is dropped only where
the machine allows (root); otherwise reads may come from memory on both sides alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHUNK = 8 << 20


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def disk_write(path: Path, nbytes: int) -> float:
    buf = os.urandom(CHUNK)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(buf[: min(left, CHUNK)])
            left -= CHUNK
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def disk_read(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(CHUNK):
            pass
    return time.perf_counter() - t0


def save_streamed(weights: dict, src: Path, out) -> None:
    """The train stage's save (components/train/handoff.py) without an engine: the weights
    streamed into safetensors and hashed as written, the other files copied, renamed into the
    store and committed."""
    from components.model.weights import Entry, plan_order, shard_plan, write_files

    tmp = out.scratch_dir()
    plan = shard_plan([Entry(k, v.dtype, tuple(v.shape)) for k, v in weights.items()])
    infos = write_files(tmp, plan, ((e.name, weights[e.name]) for e in plan_order(plan)))
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copyfile(f, tmp / f.name)
    for p in sorted(tmp.iterdir()):
        info = infos.get(p.name)
        out.put_file(p, p.name, sha256=info.sha256 if info else None, move=True)
    out.commit({}, {})
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--store", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import torch

    from components.core.commit import OutputDir
    from components.core.store import LocalStore
    from components.model.checkpoint import load_policy
    from components.model.hf_backend import TransformersBackend
    from examples.arithmetic.model import build_model, build_tokenizer, save_checkpoint

    Path(args.store).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ckpt-io-", dir=args.store))
    tok = build_tokenizer()
    model = build_model(tok, hidden_size=args.hidden, num_layers=args.layers, num_heads=8, seed=0)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if "lm_head.weight" in weights and model.config.tie_word_embeddings:
        del weights["lm_head.weight"]
    nbytes = sum(v.numel() * v.element_size() for v in weights.values())
    save_checkpoint(model, tok, work / "src")  # the config and tokenizer files every save copies
    store = LocalStore()
    cached = drop_caches()
    times: dict[str, list[float]] = {k: [] for k in ("write", "read", "save", "warm", "cold")}
    backend = TransformersBackend(model, tok)
    try:
        for r in range(args.rounds):
            raw = work / f"raw-{r}.bin"
            times["write"].append(disk_write(raw, nbytes))
            drop_caches()
            times["read"].append(disk_read(raw))
            raw.unlink()

            out = OutputDir(store, str(work / f"ckpt-{r}"), "train")
            out.begin(force=True)
            t0 = time.perf_counter()
            save_streamed(weights, work / "src", out)
            os.sync()
            times["save"].append(time.perf_counter() - t0)

            drop_caches()
            t0 = time.perf_counter()
            backend.load_weights(work / f"ckpt-{r}")
            times["warm"].append(time.perf_counter() - t0)

            drop_caches()
            t0 = time.perf_counter()
            load_policy(work / f"ckpt-{r}", dtype=torch.float32)
            times["cold"].append(time.perf_counter() - t0)
            shutil.rmtree(work / f"ckpt-{r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: nbytes / v for k, v in med.items()}
    gb = 1e9
    print(
        f"{nbytes / gb:.2f} GB of weights, median of {args.rounds} rounds"
        f"{'' if cached else ' (page cache not dropped: not root)'}"
    )
    print(f"disk sequential write        {rate['write'] / gb:6.2f} GB/s   (baseline)")
    print(f"disk sequential read         {rate['read'] / gb:6.2f} GB/s   (baseline)")
    print(
        f"checkpoint save + commit     {rate['save'] / gb:6.2f} GB/s   "
        f"{rate['save'] / rate['write']:.2f} x disk write"
    )
    print(
        f"warm engine weight load      {rate['warm'] / gb:6.2f} GB/s   "
        f"{rate['warm'] / rate['read']:.2f} x disk read"
    )
    print(
        f"cold from_pretrained load    {rate['cold'] / gb:6.2f} GB/s   "
        f"{rate['cold'] / rate['read']:.2f} x disk read"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
