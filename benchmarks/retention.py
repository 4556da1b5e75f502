"""A 1,000-iteration run's writes, simulated, under the retention policy: its peak store size.

    python benchmarks/retention.py [--iterations 1000] [--params 134.5e6 7e9]

Replays, in a real local store, what the stages of a run commit in order: each iteration's
rollouts and scored rollouts, train's checkpoint (the handoff, bf16), a full train state every
`train.state_every` iterations and at the end, the evaluations of every `evaluate.every`-th
checkpoint, each followed by the retention sweep the stage runs after its commit
(components/core/retention.py, the very code a run uses). The files are empty stand-ins; their
manifests carry the sizes a policy of --params parameters gives them (bf16 checkpoint 2 B a
parameter, full state 12 B: fp32 master and both Adam moments). The peak and final sizes are
those manifests' bytes over the artifacts not retired, beside what the same run wrote before
(every fp32 checkpoint and every optimizer state kept) and the policy's bound:

    base + (keep_last + milestones + 1 pending evaluation) x checkpoint + (keep_states + 1) x state
    + rollouts

(the +1 state: a new state is committed before the older one is retired).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEMO = ROOT / "examples" / "arithmetic" / "config.yaml"
ROLLOUTS_BYTES = 2_000_000  # a SmolLM2 iteration's rollouts and scored rollouts, about


def simulate(params: float, iterations: int, store: str) -> dict[str, float]:
    from components.core.commit import OutputDir
    from components.core.config import load_config
    from components.core.layout import RunLayout, store_for
    from components.core.retention import Inventory, sweep
    from components.core.warm import eval_checkpoints

    cfg = load_config(
        DEMO,
        [f"run.store={store}", "run.segment_iterations=50", "evaluate.every=10"],
        run_id="sim",
        iterations=iterations,
    )
    s, layout = store_for(cfg), RunLayout.of(cfg)
    ckpt, state, base = 2 * params, 12 * params, 4 * params
    evals = set(eval_checkpoints(cfg))
    sizes: dict[str, float] = {}

    def commit(uri: str, nbytes: float, stage: str) -> None:
        out = OutputDir(s, uri, stage)
        out.begin(force=True)
        out.put_bytes(b"", "data")
        out.record("data", int(nbytes), "0" * 64)  # what a policy of `params` writes
        out.commit({})
        sizes[uri] = nbytes

    def live() -> float:
        inv = Inventory.of(s, layout.root)
        kept = {layout.checkpoint(c) for c in inv.checkpoints}
        kept |= {layout.train_state(c) for c in inv.states}
        return sum(
            v for k, v in sizes.items() if k in kept or "/iterations/" in k or "/evals/" in k
        )

    peak = 0.0
    commit(layout.checkpoint(0), base, "init")
    if 0 in evals:
        commit(layout.evals(0), 0, "evaluate")
    for i in range(iterations):
        commit(layout.rollouts(i), ROLLOUTS_BYTES / 2, "generate")
        commit(layout.scored(i), ROLLOUTS_BYTES / 2, "verify")
        commit(layout.checkpoint(i + 1), ckpt, "train")
        peak = max(peak, live())
        sweep(cfg, "train")
        if (i + 1) % cfg.train.state_every == 0 or i + 1 == iterations:
            commit(layout.train_state(i + 1), state, "train")
            peak = max(peak, live())
            sweep(cfg, "train")
        if i + 1 in evals:
            commit(layout.evals(i + 1), 0, "evaluate")
            sweep(cfg, "evaluate")
    r = cfg.retention
    milestones = iterations // r.milestone_every if r.milestone_every else 0
    bound = (
        base
        + (r.keep_last + milestones + 1) * ckpt
        + (r.keep_states + 1) * state
        + iterations * ROLLOUTS_BYTES
    )
    before = base + iterations * (4 * params + 8 * params) + iterations * ROLLOUTS_BYTES
    return {
        "peak": peak,
        "final": live(),
        "bound": bound,
        "before": before,
        "milestones": milestones,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--params", type=float, nargs="+", default=[134.5e6, 7e9])
    args = ap.parse_args()
    print(
        f"{args.iterations} iterations, the default policy (keep_last 2, milestone_every 50, "
        "keep_states 1, state_every 10; evaluate.every 10)"
    )
    print(
        f"{'policy':>8} {'peak':>10} {'final':>10} {'bound':>10} {'before':>10} {'peak/before':>12}"
    )
    for p in args.params:
        with tempfile.TemporaryDirectory(prefix="rlvr-bench-retention-") as store:
            r = simulate(p, args.iterations, store)
        print(
            f"{p / 1e9:>7.3g}B {r['peak'] / 1e9:>8.1f}GB {r['final'] / 1e9:>8.1f}GB "
            f"{r['bound'] / 1e9:>8.1f}GB {r['before'] / 1e9:>8.0f}GB {r['peak'] / r['before']:>12.4f}"
        )
        assert r["peak"] <= r["bound"], r
    return 0


if __name__ == "__main__":
    sys.exit(main())
