"""The policy handoff: what each path costs on this machine, and what it projects to at 1B-70B.

    python benchmarks/handoff.py [--params 134.5e6] [--repeats 3]

Measured here, side by side in one invocation, on random weights shaped like the policy of
--params parameters (SmolLM2-135M's shapes by default: 30 layers, hidden 576, MLP 1536, a
49,152-token tied embedding):

- before: what an iteration wrote before the handoff was reworked, synchronously, before
  generate could start: the fp32 weights and the whole Adam state (exp_avg, exp_avg_sq) as
  safetensors, each file then read back to hash it for the commit manifest; and generate's
  in-place load of the fp32 file into a bf16 model;
- store path now: the weights in the sampler's dtype (bf16) streamed one tensor at a time,
  hashed as written (components/model/weights.py), renamed into the store, and generate's
  in-place load; the full train state is written every train.state_every iterations in the
  background, off this path (its cost is printed apart);
- broadcast: the same bf16 weights from one process to another over gloo on loopback, in
  buckets of --bucket-mb (components/model/channel.py), as train's rank 0 sends them to a
  generate worker; the receiver copies them into its model's parameters.

Each prints bytes, seconds and GB/s, the median of --repeats, and the ratio to `before`. Then
a cost model projects the fixed cost of an iteration's handoff at 1B, 7B and 70B parameters,
with the bandwidths stated in BANDWIDTHS (and this machine's measured hashing rate), beside the
peers' published figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Bandwidths the projection assumes (bytes/s), per node and direction. Local NVMe: a PCIe 4
#: data-center drive's sustained write and read; S3: multipart transfers from one node
#: (about 10 Gb/s, what one instance's S3 throughput commonly reaches); NCCL: a broadcast over
#: one 200 Gb/s InfiniBand HDR port at 80% of its line rate (train and generate on separate
#: nodes; 8 rails would be 8x).
BANDWIDTHS = {
    "nvme_write": 2.0e9,
    "nvme_read": 3.0e9,
    "s3_up": 1.25e9,
    "s3_down": 1.25e9,
    "nccl_ib": 20e9,
}
#: What peers publish for the same step (their docs and code; docs/design.md, "The policy
#: handoff").
PEERS = [
    ("NeMo-RL NCCL reshard, Qwen3-4B (H100)", "0.2-0.3 s"),
    ("NeMo-RL NCCL reshard, Qwen3-30B (H100)", "0.7-1.0 s"),
    ("MoonshotAI checkpoint-engine, GLM-4.5-Air (8xH800)", "3.5 s"),
    ("MoonshotAI checkpoint-engine, Qwen3-235B (8xH800)", "6.2 s"),
    ("MoonshotAI checkpoint-engine, Kimi-K2 1T", "16-20 s"),
    ("verl with checkpoint-engine, Qwen3-30B-A3B", "4.4 s"),
]


def smollm2_shapes(params: float) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a Llama-style model of about `params` parameters (SmolLM2-135M's
    widths; layers scaled to match)."""
    h, inter, vocab = 576, 1536, 49152
    per_layer = 4 * h * h // 1 + 3 * h * inter + 2 * h  # attention (GQA counted as full) + MLP
    layers = max(1, round((params - vocab * h) / per_layer))
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (h, h),
            p + "self_attn.v_proj.weight": (h, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes


def weights(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(*s, generator=g) * 0.02 for k, s in shapes.items()}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def before(w: dict[str, torch.Tensor], work: Path) -> tuple[float, int]:
    """fp32 weights + Adam state saved, then read back for the manifest's sha256s."""
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    out = work / "before"
    out.mkdir()
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    moments = {f"exp_avg.{k}": v.clone() for k, v in w.items()} | {
        f"exp_avg_sq.{k}": v.clone() for k, v in w.items()
    }
    save_file(moments, str(out / "optimizer.safetensors"))
    for f in out.iterdir():
        sha256_file(f)
    nbytes = sum(f.stat().st_size for f in out.iterdir())
    return time.perf_counter() - t0, nbytes


def now(w: dict[str, torch.Tensor], work: Path) -> tuple[float, int]:
    """The bf16 handoff streamed and hashed as written, then renamed into place."""
    from components.model.weights import Entry, plan_order, shard_plan, write_files

    t0 = time.perf_counter()
    tmp = work / ".now.tmp"
    tmp.mkdir()
    entries = [Entry(k, torch.bfloat16, tuple(v.shape)) for k, v in w.items()]
    plan = shard_plan(entries)
    stream = ((e.name, w[e.name].to(torch.bfloat16)) for e in plan_order(plan))
    write_files(tmp, plan, stream, {"format": "pt"})
    tmp.rename(work / "now")
    nbytes = sum(f.stat().st_size for f in (work / "now").iterdir())
    return time.perf_counter() - t0, nbytes


def state_write(w: dict[str, torch.Tensor], work: Path) -> tuple[float, int]:
    """The full state (masters and both moments, fp32) as train writes it every few
    iterations, in the background."""
    from components.train.state import write_shard

    tensors = {f"master.{k}": v for k, v in w.items()}
    tensors |= {f"exp_avg.{k}": v for k, v in w.items()} | {
        f"exp_avg_sq.{k}": v for k, v in w.items()
    }
    t0 = time.perf_counter()
    info = write_shard(work / "state.safetensors", tensors)
    return time.perf_counter() - t0, info.bytes


def load(path: Path, model: dict[str, torch.Tensor]) -> float:
    """Generate's in-place load: every tensor of the file copied into its parameter."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for k in f.keys():  # noqa: SIM118
            model[k].copy_(f.get_tensor(k))
    return time.perf_counter() - t0


def _receiver(run: str, bucket_mb: int, rounds: int, q) -> None:
    """A generate worker's end: `rounds` versions received into a model's parameters."""
    from components.core.store import LocalStore
    from components.model.channel import Receiver, Settings

    r = Receiver(
        Settings(LocalStore(), run, receivers=1, bucket_mb=bucket_mb, timeout_s=120), rank=1
    )
    model: dict[str, torch.Tensor] = {}

    class Sink:
        def start(self, names: list[str]) -> None:
            pass

        def put(self, name: str, t: torch.Tensor) -> None:
            model.setdefault(name, torch.empty_like(t)).copy_(t)

    for v in range(1, rounds + 1):
        while not r.offered(v):
            time.sleep(0.005)
        t0 = time.perf_counter()
        received = r.receive(v, Sink())
        q.put(time.perf_counter() - t0)  # what generate waits for before it samples
        received.digests()  # hashed on a thread of its own while generate samples
    r.close()
    os._exit(0)


def broadcast(
    w16: dict[str, torch.Tensor], repeats: int, bucket_mb: int
) -> list[tuple[float, float]]:
    """(send seconds, receive seconds) per round, one process to another over gloo."""
    from components.core.store import LocalStore
    from components.model.channel import Sender, Settings
    from components.model.weights import Entry

    run = tempfile.mkdtemp(prefix="rlvr-bench-run-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    sender = Sender(Settings(LocalStore(), run, receivers=1, bucket_mb=bucket_mb, timeout_s=120))
    proc = ctx.Process(target=_receiver, args=(run, bucket_mb, repeats, q))
    proc.start()
    entries = [Entry(k, v.dtype, tuple(v.shape)) for k, v in w16.items()]
    out = []
    try:
        for v in range(1, repeats + 1):
            t0 = time.perf_counter()
            sender.begin(v, entries, [("model.safetensors", len(entries))])
            for e in entries:
                sender.put(e.name, w16[e.name])
            send = time.perf_counter() - t0
            if not sender.end():
                raise RuntimeError("the weights were not delivered")
            out.append((send, q.get(timeout=300)))
    finally:
        proc.join(timeout=60)
        sender.close()
        shutil.rmtree(run, ignore_errors=True)
    return out


def project(params: float, hash_bps: float) -> dict[str, float]:
    """Seconds of the handoff an iteration waits for, at `params` parameters (module doc)."""
    b = BANDWIDTHS
    fp32, bf16, adam = 4 * params, 2 * params, 8 * params
    return {
        "before, local NVMe": (fp32 + adam) / b["nvme_write"]
        + (fp32 + adam) / hash_bps
        + fp32 / b["nvme_read"],
        "before, S3": (fp32 + adam) / b["s3_up"] + (fp32 + adam) / hash_bps + fp32 / b["s3_down"],
        "store path, local NVMe": bf16 / b["nvme_write"] + bf16 / b["nvme_read"],
        "store path, S3": bf16 / b["s3_up"] + bf16 / b["s3_down"],
        "broadcast, NCCL over IB": bf16 / b["nccl_ib"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=134.5e6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=int, default=256)
    args = ap.parse_args()
    from benchmarks.common import cpu_model

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")
    w = weights(smollm2_shapes(args.params))
    n = sum(v.numel() for v in w.values())
    print(
        f"policy: {n / 1e6:.1f}M parameters ({n * 2 / 1e6:.0f} MB in bf16, {n * 4 / 1e6:.0f} MB in fp32)\n"
    )
    w16 = {k: v.to(torch.bfloat16) for k, v in w.items()}
    rows: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    for _ in range(args.repeats):
        work = Path(tempfile.mkdtemp(prefix="rlvr-bench-handoff-"))
        try:
            # each write starts with no dirty pages of the one before (the kernel would throttle
            # it while writing them back), in both orders over the repeats
            paths = [
                ("before: write + hash (fp32 + Adam)", before),
                ("now: streamed write (bf16)", now),
            ]
            for name, fn in paths if len(rows.get(paths[0][0], [])) % 2 == 0 else paths[::-1]:
                os.sync()
                s, sizes[name] = fn(w, work)
                rows.setdefault(name, []).append(s)
            os.sync()
            model = {k: torch.empty_like(v) for k, v in w16.items()}
            rows.setdefault("before: load fp32 into bf16", []).append(
                load(work / "before/model.safetensors", model)
            )
            sizes["before: load fp32 into bf16"] = 4 * n
            rows.setdefault("now: load bf16", []).append(
                load(work / "now/model.safetensors", model)
            )
            sizes["now: load bf16"] = 2 * n
            os.sync()
            s, sizes["full state, in the background"] = state_write(w, work)
            rows.setdefault("full state, in the background", []).append(s)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    pairs = broadcast(w16, args.repeats, args.bucket_mb)
    rows["broadcast over gloo: send"] = [p[0] for p in pairs]
    rows["broadcast over gloo: receive"] = [p[1] for p in pairs]
    sizes["broadcast over gloo: send"] = sizes["broadcast over gloo: receive"] = 2 * n

    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{'path':44} {'bytes':>10} {'seconds':>8} {'GB/s':>6}   (median of {args.repeats})")
    for k, s in med.items():
        print(f"{k:44} {sizes[k] / 1e6:>8.0f}MB {s:>8.3f} {sizes[k] / s / 1e9:>6.2f}")
    old = med["before: write + hash (fp32 + Adam)"] + med["before: load fp32 into bf16"]
    new = med["now: streamed write (bf16)"] + med["now: load bf16"]
    bc = med["broadcast over gloo: receive"]
    print(f"\nhandoff an iteration waits for, before:     {old:.3f} s")
    print(f"store path now (write + load):             {new:.3f} s = {new / old:.3f} of before")
    print(f"broadcast (received by generate):          {bc:.3f} s = {bc / old:.3f} of before")

    data = os.urandom(1 << 28)
    t0 = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    hash_bps = len(data) / (time.perf_counter() - t0)
    print(
        f"\nprojection (sha256 here {hash_bps / 1e9:.2f} GB/s; bandwidths: "
        + json.dumps({k: f"{v / 1e9:g} GB/s" for k, v in BANDWIDTHS.items()})
        + ")"
    )
    names = list(project(1e9, hash_bps))
    print(f"{'params':>7} " + " ".join(f"{k:>24}" for k in names))
    for p in (1e9, 7e9, 70e9):
        cost = project(p, hash_bps)
        print(f"{p / 1e9:>6.0f}B " + " ".join(f"{cost[k]:>23.1f}s" for k in names))
    print("\npeers' published handoffs (weights to the inference engine):")
    for what, figure in PEERS:
        print(f"  {what:54} {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
