"""rlvr's pipeline against TRL's GRPOTrainer on the same rollouts: learning and wall time.

    pip install -e ".[bench]"        # TRL, a benchmark-only dependency
    python benchmarks/vs_trl.py [--config examples/arithmetic/config.yaml] [--trl-first]

Both sides train the demo's base policy on the same prompts in the same order (rlvr's per-iteration
selection, fed to TRL unshuffled), with the same hyperparameters: P prompts x N samples per
iteration, S optimizer steps per iteration (TRL: `steps_per_generation=S`,
`per_device_train_batch_size=P*N/S`), token-mean loss (`loss_type="dapo"`), group-scaled
advantages, PPO clip 0.2, no KL, constant learning rate, gradient clipping 1.0, on CPU. The reward
is rlvr's math verifier on both sides.

1. Wall time, each side as a whole process (interpreter start to exit): `rlvr run` with no
   evaluation (the KFP pipeline on the local runner, warm workers) and a TRL script that trains
   and saves the same checkpoints. The ratio rlvr / TRL is the figure (goal: at most 1.0).
2. Learning: every `evaluate.every`-th checkpoint of both runs is scored afterwards by rlvr's
   evaluator with the same sample seeds (untimed): held-out pass@1 with its 95% bootstrap CI;
   "within CI" means each side's value lies inside the other's interval.
3. rlvr's fixed cost: the share of a steady-state iteration (end of train i-1 to end of train i)
   that is not stage work (components/report/timeline.py; goal under 20%), and the one-off
   start-up before the first stage work.

`--trl-first` runs TRL first (alternate it between repeats so machine drift hits both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    bench_setup,
    compare_table,
    evaluate_dirs,
    evaluate_run,
    timed,
)


def trl_worker(args) -> None:
    """The TRL side, as its own process: train and save checkpoints, nothing else."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from components.core.config import load_config
    from components.core.store import get_store
    from components.core.warm import eval_checkpoints
    from components.generate.prompt_sampler import select_indices
    from components.generate.rollouts import load_prompts
    from components.verify.math import compute_score

    cfg = load_config(args.config, list(args.set), iterations=args.iterations)
    g, t = cfg.generate, cfg.train
    store = get_store(cfg.data.train)
    prompts = load_prompts(store, cfg.data.train, "train")
    rows = []
    for i in range(cfg.run.iterations):
        for idx in select_indices(len(prompts), cfg.data.prompts_per_iteration, cfg.run.seed, i):
            p = prompts[idx]
            rows.append({"prompt": list(p.prompt), "ground_truth": p.ground_truth})

    def reward(completions, ground_truth, **_):
        return [
            float(compute_score(c[0]["content"], gt)["score"])
            for c, gt in zip(completions, ground_truth, strict=True)
        ]

    steps = t.mini_batches * t.ppo_epochs
    batch = cfg.data.prompts_per_iteration * g.n // t.mini_batches
    save_every = cfg.evaluate.every * steps
    gconf = GRPOConfig(
        output_dir=args.out,
        num_generations=g.n,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=t.mini_batches,
        num_iterations=t.ppo_epochs,
        shuffle_dataset=False,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        use_cpu=True,
        learning_rate=t.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=t.grad_clip,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        adam_epsilon=t.eps,
        weight_decay=0.0,
        max_completion_length=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        num_train_epochs=1,
        max_steps=cfg.run.iterations * steps,
        save_strategy="steps",
        save_steps=save_every,
        save_only_model=True,
        logging_steps=steps,
        report_to=[],
        seed=cfg.run.seed,
        bf16=False,
        disable_tqdm=False,
    )
    model = AutoModelForCausalLM.from_pretrained(cfg.model.base)
    tok = AutoTokenizer.from_pretrained(cfg.model.base)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=gconf,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )
    trainer.train()
    if (cfg.run.iterations * steps) % save_every:
        trainer.save_model(str(Path(args.out) / f"checkpoint-{cfg.run.iterations * steps}"))
    want = [c for c in eval_checkpoints(cfg) if c > 0]
    print(json.dumps({"checkpoints": want, "steps_per_iteration": steps}))


def evaluate_all(cfg, run_id: str, trl_dir: Path, steps: int) -> dict[str, dict[int, dict]]:
    """pass@1 and CI of every evaluated checkpoint of both sides, by rlvr's evaluator."""
    from components.core.warm import eval_checkpoints

    trl = {
        c: cfg.model.base if c == 0 else str(trl_dir / f"checkpoint-{c * steps}")
        for c in eval_checkpoints(cfg)
    }
    return {"rlvr": evaluate_run(cfg, run_id), "trl": evaluate_dirs(cfg, trl)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples/arithmetic/config.yaml"))
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], help="config override a.b=v")
    ap.add_argument("--trl-first", action="store_true")
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return 0

    from components.core.layout import RunLayout, store_for
    from components.report.timeline import load_timeline, summary

    bench, cfg = bench_setup("vs_trl", args.config, args.iterations, args.set)
    run_id = "rlvr"
    extra = [f"--set={s}" for s in args.set]
    iters = ["--iterations", str(cfg.run.iterations)]
    rlvr_cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "run",
        args.config,
        "--run-id",
        run_id,
        "--set",
        "data.eval=[]",
        "--set",
        "retention.enabled=false",  # every checkpoint is evaluated afterwards
        "--set",
        f"run.store={cfg.run.store}",
        *iters,
        *extra,
    ]
    trl_cmd = [
        sys.executable,
        __file__,
        "--trl-worker",
        "--config",
        args.config,
        "--out",
        str(bench / "trl"),
        *iters,
        *extra,
    ]
    walls = {}
    order = ["trl", "rlvr"] if args.trl_first else ["rlvr", "trl"]
    for side in order:
        cmd = rlvr_cmd if side == "rlvr" else trl_cmd
        print(f"running {side} ...", flush=True)
        walls[side] = timed(cmd, bench / f"{side}.log")
        print(f"  {side}: {walls[side]:.1f} s", flush=True)
    steps = cfg.train.mini_batches * cfg.train.ppo_epochs
    rcfg = cfg.model_copy(deep=True)
    rcfg.run.run_id = run_id
    tl = summary(load_timeline(store_for(rcfg), RunLayout.of(rcfg).root))
    print(
        "evaluating every checkpoint of both runs with rlvr's evaluator (untimed) ...", flush=True
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    scores = evaluate_all(cfg, run_id, bench / "trl", steps)

    all_within = compare_table(scores["rlvr"], scores["trl"], ("rlvr", "TRL"))
    ratio = walls["rlvr"] / walls["trl"]
    print(f"\nwall, whole process: rlvr {walls['rlvr']:.1f} s, TRL {walls['trl']:.1f} s")
    print(f"rlvr / TRL wall ratio: {ratio:.2f}   (goal <= 1.0)")
    print(
        f"rlvr fixed cost: {100 * tl['iteration_fixed_share']:.0f}% of an iteration "
        f"({tl['iteration_s']:.2f} s; goal < 20%); start-up {tl['startup_s']:.1f} s; over the "
        f"whole run {100 * tl['fixed_share']:.0f}% of the wall time is not stage work on the "
        "critical path"
    )
    print(f"learning within CI at every checkpoint: {'yes' if all_within else 'NO'}")
    print(f"outputs: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
