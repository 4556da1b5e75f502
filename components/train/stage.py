"""Train stage: scored rollouts of iteration i + checkpoint i -> checkpoint i+1 (DeepSpeed).

    python -m components.train CONFIG --run-id ID --iteration I [--force]
    rlvr stage train CONFIG --run-id ID --iteration I

Read in this order: setup (inputs validated, DeepSpeed engine, train state restored) -> one
iteration's updates (components/train/update.py: old logprobs once, before any update, then
`ppo_epochs` x `mini_batches` optimizer steps, with their exactness guarantees) -> save (train
state first, checkpoint last: the checkpoint's `_SUCCESS` commits the iteration).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from components.core.checkpoint import load_policy, local_checkpoint
from components.core.commit import (
    NotCommittedError,
    OutputDir,
    committed_files,
    content_digest,
    lineage,
    materialize,
    read_manifest,
)
from components.core.config import RunConfig, TrainSection, unused_keys
from components.core.errors import StageError, UserError
from components.core.layout import RunLayout, store_for
from components.core.schemas import read_records
from components.core.timing import Timeline
from components.core.vision import VisionProcessor, resolve_images, vision_tower
from components.core.warm import Stage
from components.generate.backends import LOGPROB_DEFINITION
from components.train import algorithms as algos
from components.train import state as train_state
from components.train.batching import (
    Rollouts,
)
from components.train.distributed import (
    barrier,
    deepspeed_config,
    import_deepspeed,
    init_distributed,
)
from components.train.policy import (
    AdapterOff,
    TokenizerFiles,
    adapter_state_dict,
    enable_checkpointing,
    full_state_dict,
    set_train_modes,
    write_hf,
)
from components.train.update import steps_per_iteration, train_iteration

log = logging.getLogger("rlvr.train")


def check_algorithm_names(t: TrainSection) -> None:
    """Resolve every configured algorithm name up front (bad names list the valid ones)."""
    try:
        algos.get_advantage_fn(t.advantage)
        algos.get_policy_loss_fn(t.policy_loss)
        algos.LOSS_AGGREGATIONS.get(t.loss_agg)
        if t.kl_coef > 0 or t.kl_metric:
            algos.get_kl_fn(t.kl_estimator)
    except UserError as e:  # UnknownNameError lists the valid names
        raise StageError(f"train config: {e.args[0] if e.args else e}") from None


def generation_stats(store, rollouts_uri: str) -> dict[str, Any]:
    """The generate manifest stats (of the first shard when sharded: settings are shared)."""
    from components.core.commit import committed_parts

    return read_manifest(store, committed_parts(store, rollouts_uri)[0])["stats"]


def check_staleness(table, iteration: int, max_staleness: int, source: str) -> dict[str, float]:
    """Refuse rollouts sampled by a policy more than `max_staleness` checkpoints behind; return
    the staleness metrics."""
    versions = np.asarray(table.column("policy_version").to_numpy(zero_copy_only=False), np.int64)
    lag = iteration - versions
    if lag.size and (lag.max() > max_staleness or lag.min() < 0):
        worst = int(versions[np.argmax(np.abs(lag - max_staleness / 2))])
        raise StageError(
            f"{source}: rollouts were sampled by checkpoint {worst:05d}, but iteration {iteration} "
            f"trains checkpoint {iteration:05d} and train.max_staleness={max_staleness} allows "
            f"checkpoints {max(0, iteration - max_staleness):05d}..{iteration:05d}; regenerate "
            "them (rlvr stage generate --force) or raise train.max_staleness"
        )
    return {
        "train/staleness_mean": float(lag.mean()) if lag.size else 0.0,
        "train/staleness_max": float(lag.max()) if lag.size else 0.0,
    }


def require_trainer_logprobs(definition: str | None, setting: str, fix: str) -> None:
    """A StageError unless the rollouts' logprobs are defined as the trainer computes them,
    which `train.<setting>` needs."""
    if definition != LOGPROB_DEFINITION:
        raise StageError(
            f"train.{setting} needs rollout logprobs defined as the trainer computes them "
            f"({LOGPROB_DEFINITION!r}); the rollouts record {definition!r}. {fix}"
        )


def old_logprobs_from_rollout(
    cfg: RunConfig, sampled: dict[str, Any], staleness_max: float
) -> bool:
    """Whether this iteration's old logprobs are the sampler's (train.old_logprobs). `auto`
    takes them only where they are the trainer's to float precision: rollouts of this very
    checkpoint whose logprobs the transformers sampler computed (as its manifest records,
    `sampled`: the generate stats) in float32 on the trainer's own kind of device, a float32
    trainer, and nothing that changes the forward (LoRA, tools) or needs the trainer's own pass
    (rollout correction compares the two; forking tokens need its entropy)."""
    from components.core.checkpoint import device_and_dtype

    t, g = cfg.train, cfg.generate
    definition = sampled.get("logprob_definition")
    if t.old_logprobs == "recompute":
        return False
    if definition != LOGPROB_DEFINITION:
        if t.old_logprobs == "rollout":
            require_trainer_logprobs(
                definition, "old_logprobs: rollout", "Set train.old_logprobs: recompute (or auto)"
            )
        return False
    if t.old_logprobs == "rollout":
        return True
    device, dtype = device_and_dtype(t.dtype)
    return (
        staleness_max == 0
        and sampled.get("backend") == "transformers"
        and sampled.get("dtype") == "float32"
        and sampled.get("device") == device
        and dtype == torch.float32
        and cfg.model.lora is None
        and not (g.tools or g.environment)
        and t.rollout_correction is None
        and t.forking_top_rho is None
    )


class TrainStage(Stage):
    """Warm train worker (components/core/warm.py). The DeepSpeed engine, its optimizer state and
    the reference model stay in memory across iterations: step i trains checkpoint i into i+1 and
    commits both the checkpoint and the train state (so any iteration can be resumed or rerun
    cold). The engine is rebuilt from the store only when it does not hold exactly the committed
    checkpoint and state of iteration i (first step, or an iteration redone out of band), so a
    warm run and N cold invocations train identically (tested)."""

    name = "train"
    prewarms = True

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        if num_shards != 1:
            raise ValueError("train is not sharded: its ranks split the work (train.gpus)")
        super().__init__(cfg)
        self.t = cfg.train
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.engine: Any = None
        self.tokenizer: Any = None
        self.vision: Any = None
        """A vision-language policy's VisionProcessor (image prompts), else None."""
        self._image_tables: dict[str, Any] = {}
        """The `images` columns of the run's datasets, read once per worker."""
        self.ref_model: Any = None
        self.base_digest: str | None = None  # model.lora: the base the adapters belong to
        self.rank, self.world = 0, 1
        self.device = "cpu"
        self.holds: tuple | None = None
        """(iteration, checkpoint digest, train state digest) the engine holds."""
        self.built = "reuse"
        """How the engine came to hold the current iteration: reuse, load or reload."""

    def check(self) -> None:
        """Names, option keys and the objective on a test batch (components/train/checks.py)."""
        from components.core.errors import Problems
        from components.train.checks import check_train

        problems = Problems()
        check_train(self.cfg, problems)
        problems.raise_if_any("train config")

    def needs(self, iteration: int) -> list[str]:
        layout = self.layout
        extra = [layout.train_state(iteration)] if iteration > 0 else []
        return [layout.scored(iteration), layout.checkpoint(iteration), *extra]

    def warm_needs(self, iteration: int) -> list[str]:
        extra = [self.layout.train_state(iteration)] if iteration > 0 else []
        return [self.layout.checkpoint(iteration), *extra]

    def warm(self, iteration: int) -> None:
        """Build the engine from checkpoint i before iteration i's rollouts are scored (a
        worker's first iteration, or after an out-of-band rerun); a no-op when it holds i."""
        if self.up_to_date(iteration):
            return  # nothing to train: do not build an engine for a skipped step
        position = self._position(iteration)
        if self.engine is None or self.holds != position:
            self.built = "load" if self.engine is None else "reload"
            self._build(iteration)
            self.holds = position

    def _position(self, iteration: int) -> tuple:
        state = (
            content_digest(self.store, self.layout.train_state(iteration)) if iteration else None
        )
        return (iteration, content_digest(self.store, self.layout.checkpoint(iteration)), state)

    def _build(self, iteration: int) -> None:
        """(Re)build the engine from checkpoint `iteration` and its train state."""
        deepspeed = import_deepspeed()

        cfg, t, store, layout = self.cfg, self.t, self.store, self.layout
        ckpt_dir = local_checkpoint(store, layout.checkpoint(iteration))
        prev_state = None
        if iteration > 0:
            sdir = materialize(store, layout.train_state(iteration))
            prev_state = (
                *train_state.read(sdir, layout.train_state(iteration)),
                layout.train_state(iteration),
            )
        if self.engine is not None:  # a rebuild: free the old engine before making another
            import gc

            self.close()
            gc.collect()
        from components.core.checkpoint import device_and_dtype

        device, dtype = device_and_dtype(t.dtype)
        self.rank, self.world = init_distributed(device)
        if device == "cuda":  # one GPU per rank
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            device = f"cuda:{torch.cuda.current_device()}"
        self.device = device
        torch.manual_seed(cfg.run.seed + iteration)
        # Loaded in fp32: under bf16 DeepSpeed casts the module and keeps fp32 master copies,
        # which are then set from these exact weights (checkpoints hold the fp32 masters).
        if cfg.model.lora is None:
            model, self.tokenizer = load_policy(ckpt_dir, dtype=torch.float32, device=device)
        else:
            model = self._adapted(ckpt_dir, iteration, device)
        self.tokenizer_files = TokenizerFiles(ckpt_dir)
        self.vision = VisionProcessor.of_checkpoint(
            ckpt_dir if cfg.model.lora is None else local_checkpoint(store, layout.checkpoint(0)),
            self.tokenizer,
            model.config,
        )
        if self.vision is not None and t.freeze_vision and cfg.model.lora is None:
            # the tower and its merger stay as they are; only the language model trains
            tower = vision_tower(model)
            if tower is not None:
                tower.requires_grad_(False)
        masters = (
            {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            if dtype != torch.float32
            else None
        )
        lora_ref = cfg.model.lora is not None and (t.kl_coef > 0 or t.kl_metric)
        if (t.kl_coef > 0 or t.kl_metric) and self.ref_model is None and not lora_ref:
            self.ref_model, _ = load_policy(
                local_checkpoint(store, layout.checkpoint(0)), dtype=dtype, device=device
            )
            self.ref_model.eval().requires_grad_(False)
        model.config.use_cache = False
        if t.gradient_checkpointing:
            from components.core.errors import Problems
            from components.train.checks import check_checkpointing

            problems = Problems()
            check_checkpointing(cfg, problems, model.config)
            if problems.errors:
                raise StageError(str(problems.errors[0]))
            enable_checkpointing(model)
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(t, self.world, dtype),
        )
        set_train_modes(
            self.engine.module,
            checkpointing=t.gradient_checkpointing,
            lora_dropout=cfg.model.lora.dropout if cfg.model.lora else 0.0,
        )
        if lora_ref:  # the reference is the base itself, adapter off: no second model
            self.ref_model = AdapterOff(self.engine.module)
        if masters is not None:
            from deepspeed.utils import safe_set_full_fp32_param

            for name, p in self.engine.module.named_parameters():
                if name in masters:
                    safe_set_full_fp32_param(p, masters[name])
            del masters
        start_step = 0
        if prev_state is not None:
            start_step = train_state.restore(self.engine, *prev_state)
        expected = iteration * steps_per_iteration(t)
        if start_step != expected:
            raise StageError(
                f"train state of iteration {iteration} is at step {start_step}, expected "
                f"{expected} (train.ppo_epochs x train.mini_batches changed mid-run?); start a "
                "new run"
            )

    def _adapted(self, ckpt_dir: Path, iteration: int, device: str):
        """`model.lora`: the base (checkpoint 0) with the adapter of checkpoint `iteration` (a
        fresh one, B = 0, at iteration 0); only the adapter's parameters train."""
        from safetensors.torch import load_file

        from components.core import adapter

        base_uri = self.layout.checkpoint(0)
        base_dir = local_checkpoint(self.store, base_uri)
        model, self.tokenizer = load_policy(base_dir, dtype=torch.float32, device=device)
        self.base_digest = adapter.base_digest(base_dir, read_manifest(self.store, base_uri))
        model = adapter.attach(model, self.cfg.model.lora)
        if iteration > 0:
            adapter.check_base(ckpt_dir, self.base_digest)
            path = Path(ckpt_dir) / adapter.ADAPTER_WEIGHTS
            adapter.set_adapter_weights(model, load_file(str(path), device=device), str(path))
        return model

    def _plan(self, iteration: int) -> tuple[OutputDir, OutputDir, dict[str, str]]:
        cfg, t, store, layout = self.cfg, self.t, self.store, self.layout
        ckpt_out = OutputDir(store, layout.checkpoint(iteration + 1), "train")
        state_out = OutputDir(store, layout.train_state(iteration + 1), "train")
        sources = [layout.scored(iteration), layout.checkpoint(iteration)]
        if iteration > 0:
            sources.append(layout.train_state(iteration))
        settings = {
            # kl_metric only adds a figure and gradient checkpointing changes memory, not
            # gradients: turning either on must not retrain the run
            "train": t.model_dump(
                mode="json",
                exclude={"kl_metric", "gradient_checkpointing"} | unused_keys(cfg)["train"],
            ),
            "iterations": cfg.run.iterations,
            "seed": cfg.run.seed,
        }
        if cfg.model.lora is not None:  # absent for full fine-tuning: its lineage is unchanged
            # vision_tower only where set: LoRA runs keep the lineage they had before it
            lora = cfg.model.lora
            settings["lora"] = lora.model_dump(
                mode="json", exclude=set() if lora.vision_tower else {"vision_tower"}
            )
        inputs = lineage(store, sources, settings, root=layout.root)
        return ckpt_out, state_out, inputs

    def up_to_date(self, iteration: int) -> bool:
        try:
            ckpt_out, state_out, inputs = self._plan(iteration)
        except NotCommittedError:  # an input is not there yet: the step is still to do
            return False
        return ckpt_out.up_to_date(inputs) and state_out.up_to_date(inputs)

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        """Take one iteration's policy update; returns the checkpoint manifest stats (or skip)."""
        cfg, t, store, layout = self.cfg, self.t, self.store, self.layout
        check_algorithm_names(t)
        ckpt_out, state_out, inputs = self._plan(iteration)
        if ckpt_out.up_to_date(inputs) and state_out.up_to_date(inputs) and not force:
            log.info("checkpoint %05d already committed; skipping", iteration + 1)
            return {"skipped": True, "uri": ckpt_out.uri}

        # --- read: every input is checked before anything is written ---
        with timeline.span("read"):
            scored_parts = committed_files(store, layout.scored(iteration), ".parquet")
            table = read_records(store, scored_parts, "scored")
            if table.num_rows == 0:
                raise StageError(f"{layout.scored(iteration)} holds no scored rollouts")
            staleness = check_staleness(table, iteration, t.max_staleness, layout.scored(iteration))
            ro = Rollouts.from_table(table, layout.scored(iteration))
            gen_stats = generation_stats(store, layout.rollouts(iteration))
            temperature = float(
                gen_stats.get("sampling", {}).get("temperature", cfg.generate.temperature)
            )
            definition = gen_stats.get("logprob_definition")
            if t.rollout_correction is not None:
                require_trainer_logprobs(
                    definition,
                    "rollout_correction",
                    "Regenerate with a matching backend, or turn rollout_correction off",
                )
            old_from_rollout = old_logprobs_from_rollout(
                cfg, gen_stats, staleness["train/staleness_max"]
            )
            position = self._position(iteration)

        # --- setup: only when the engine does not hold exactly iteration i's inputs ---
        load, self.built = self.built, "reuse"  # what warm() did, if anything
        if self.engine is None or self.holds != position:
            load = "load" if self.engine is None else "reload"
            with timeline.span("load"):
                self._build(iteration)
            self.holds = position
        start_step = iteration * steps_per_iteration(t)
        if ro.images_ref is not None:  # image prompts: their pixel values, once per prompt
            with timeline.span("images"):
                ro.vision = resolve_images(
                    store, layout.root, ro.images_ref, self.vision, self._image_tables
                )

        # --- train ---
        torch.manual_seed(cfg.run.seed + iteration)
        total_steps = cfg.run.iterations * steps_per_iteration(t)
        horizon = t.loss_agg_horizon or cfg.generate.max_new_tokens
        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        with timeline.span("work"):
            step, metrics = train_iteration(
                self.engine,
                ro,
                t,
                temperature=temperature,
                horizon=horizon,
                start_step=start_step,
                total_steps=total_steps,
                seed=cfg.run.seed,
                iteration=iteration,
                pad_id=pad_id,
                device=self.device,
                rank=self.rank,
                world=self.world,
                ref_model=self.ref_model,
                compare_rollout=definition == LOGPROB_DEFINITION,
                old_from_rollout=old_from_rollout,
                check_rollout=t.old_logprobs == "auto",
            )
        metrics.update(staleness)
        metrics["iteration"] = iteration
        metrics["train/engine"] = load
        metrics["train/seconds"] = timeline.seconds("work")

        # --- save: train state first, the checkpoint's _SUCCESS last ---
        t0 = time.time()
        # every rank takes part in the gathers; rank 0 alone keeps the result and writes it
        writer = self.rank == 0
        tensors, meta = train_state.collect(
            self.engine, step, {"iteration": iteration + 1}, keep=writer
        )
        lora = cfg.model.lora is not None
        weights = (
            adapter_state_dict(self.engine) if lora else full_state_dict(self.engine, keep=writer)
        )
        barrier()  # every rank has finished its update and its part of the gathers
        if writer:
            state_out.begin(force=True)
            ckpt_out.begin(force=True)
            tmp = Path(tempfile.mkdtemp(prefix="rlvr-state-"))
            try:
                save_file(tensors, str(tmp / "optimizer.safetensors"))
                state_out.put_file(tmp / "optimizer.safetensors", "optimizer.safetensors")
                state_out.put_bytes(train_state.dumps(meta), "state.json")
                state_out.put_bytes(json.dumps(metrics, indent=2).encode(), "metrics.json")
                state_out.commit(metrics, inputs)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            module = self.engine.module
            module.config.use_cache = True
            saved = write_hf(
                module,
                self.tokenizer_files,
                weights,
                ckpt_out,
                metrics,
                inputs,
                timeline,
                t0,
                base_digest=self.base_digest if lora else None,
                base_uri=self.layout.checkpoint(0) if lora else None,
            )
            module.config.use_cache = False
            metrics.update(saved)
        barrier()  # every rank sees the commit before it records what it holds
        self.holds = self._position(iteration + 1)
        log.info(
            "train %05d: loss %.4f reward %.3f grad_norm %.3f tokens/s %.0f (%s engine)",
            iteration,
            metrics.get("train/loss", 0.0),
            metrics["train/reward_mean"],
            metrics["train/grad_norm"],
            metrics["train/tokens_per_s"],
            load,
        )
        return {"skipped": False, "uri": ckpt_out.uri, "stats": metrics}

    def close(self) -> None:
        """Drop the engine (the process group stays: it is per process)."""
        if self.engine is not None:
            self.engine.destroy()
            self.engine = None
            self.holds = None


#: `rlvr stage train` (one policy update, cold) and the worker task; components/train/launch.py
#: wraps them in torchrun for several ranks.
run, serve = TrainStage.run, TrainStage.serve
