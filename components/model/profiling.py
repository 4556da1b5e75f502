"""Where a stage's compute time goes, inside a run.

- `PhaseClock`: seconds per named phase of the sampler (prefill, decode, detokenize), with the
  device drained at each phase's end so that a GPU's queued work is charged to the phase that
  queued it. Recorded in generate's manifests (`stats.phases`; evaluation's sampling keeps its
  own per call); costs one device sync per phase, a few per batch.
- `profiled(stage, iteration)`: with `RLVR_PROFILE=DIR` in a worker's environment (and
  `RLVR_PROFILE_ITERATIONS=1,5` to pick iterations), PyTorch's profiler over that step's compute, summarized into `DIR/<stage>-<iteration>.txt`: the
  operators by self device time and by self CPU time, and the host syncs per decode step
  (docs/usage.md, "Profile a stage inside a run"). Off (and free) otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROFILE_ENV = "RLVR_PROFILE"
PROFILE_ITERATIONS_ENV = "RLVR_PROFILE_ITERATIONS"
"""Which iterations to profile, e.g. `1,5` (unset: every one): the profiler slows what it
watches, so the others stay comparable."""

#: Profiler event names that wait for the device (or read a value back from it).
SYNC_EVENTS = (
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
)


def _drain(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class PhaseClock:
    """Seconds per phase, summed over a call's batches; `take()` returns and resets them."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.steps = 0
        self.notes: dict[str, Any] = {}
        """Other facts of the calls, as the sampler states them (its decode graphs)."""

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            _drain(self.device)
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def take(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"{k}_s": v for k, v in self.seconds.items()}
        if self.steps:
            out["decode_steps"] = self.steps
            out["decode_ms_per_step"] = 1000 * self.seconds.get("decode", 0.0) / self.steps
        out.update(self.notes)
        self.seconds, self.steps, self.notes = {}, 0, {}
        return out


class Profiled:
    """What the caller tells a profile after its block: the decode steps the block ran."""

    steps = 0


@contextlib.contextmanager
def profiled(stage: str, iteration: int) -> Iterator[Profiled]:
    """Profile the block where `RLVR_PROFILE` names a directory (module doc); set the yielded
    object's `steps` inside it to count host syncs per decode step."""
    got = Profiled()
    where = os.environ.get(PROFILE_ENV)
    only = os.environ.get(PROFILE_ITERATIONS_ENV, "").replace(",", " ").split()
    if not where or (only and str(iteration) not in only):
        yield got
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        yield got
    out = Path(where)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{stage}-{iteration:05d}"
    summary = summarize(prof, got.steps)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"{name}.txt").write_text(_table(prof, summary))


def summarize(prof, steps: int) -> dict[str, Any]:
    """The host syncs and the busiest operators of a finished profile."""
    events = prof.key_averages()
    counts = {e.key: e.count for e in events}
    syncs = {k: counts[k] for k in SYNC_EVENTS if k in counts}
    device_us = sum(_self_device_us(e) for e in events)
    return {
        "decode_steps": steps,
        "syncs": syncs,
        "syncs_per_step": {k: v / steps for k, v in syncs.items()} if steps else {},
        "self_device_ms": device_us / 1000,
        "self_cpu_ms": sum(e.self_cpu_time_total for e in events) / 1000,
        "top_device": [
            [e.key, e.count, _self_device_us(e) / 1000]
            for e in sorted(events, key=_self_device_us, reverse=True)[:15]
        ],
    }


def _self_device_us(event) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, attr, None)
        if value is not None:
            return float(value)
    return 0.0


def _table(prof, summary: dict[str, Any]) -> str:
    events = prof.key_averages()
    by = "self_cuda_time_total" if summary["self_device_ms"] > 0 else "self_cpu_time_total"
    head = json.dumps({k: summary[k] for k in ("decode_steps", "syncs", "syncs_per_step")})
    return head + "\n" + events.table(sort_by=by, row_limit=40, max_name_column_width=60) + "\n"
