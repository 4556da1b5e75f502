"""Train stage: scored rollouts of iteration i + the policy after i updates -> checkpoint i+1.

    python -m components.train CONFIG --run-id ID --iteration I [--force]
    rlvr stage train CONFIG --run-id ID --iteration I

A step reads decide -> work -> commit -> after the commit (`TrainStage.step`):
- decide: iteration i's inputs (components/train/inputs.py, where the old logprobs' source is
  decided too) and the engine at the policy after i updates: kept warm from the previous step,
  or built from the newest full train state and brought forward by replaying the updates since
  (components/train/build.py); where the engine stands is one record, `Position`;
- work: one iteration's updates (components/train/update.py: old logprobs once, before any
  update, then `ppo_epochs` x `mini_batches` optimizer steps), and the run's health after them
  (components/train/health.py), judged before the commit: its stop record must precede the
  checkpoint, and its figures go in the checkpoint's manifest;
- commit: the handoff (the new weights in the sampler's dtype, streamed into checkpoint i+1,
  whose `_SUCCESS` commits the iteration and lets generate start the next;
  components/train/handoff.py), first over the weight channel where the run broadcasts;
- after the commit: the engine holds checkpoint i+1; the full train state every
  `train.state_every` iterations, in the background, and when the worker stops
  (components/train/state.py); retention (components/core/retention.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from components.core import lineages
from components.core.commit import (
    Lineage,
    NotCommittedError,
    OutputDir,
    RetiredError,
    content_digest,
    is_retired,
    read_manifest,
)
from components.core.config import RunConfig, TrainSection
from components.core.errors import StageError, UserError
from components.core.layout import RunLayout, committed_indices, store_for
from components.core.store import StoreError
from components.core.timing import Timeline
from components.core.warm import Stage
from components.model import device_turn
from components.model.backends import LOGPROB_DEFINITION
from components.model.channel import Sender, Settings, ranks_per_worker
from components.model.checkpoint import device_and_dtype, sampler_dtype_name
from components.model.vision import resolve_images
from components.train import algorithms as algos
from components.train import state as train_state
from components.train.build import Built, build, release
from components.train.distributed import barrier, init_distributed
from components.train.handoff import WeightPlan, dtype_name, write_handoff
from components.train.inputs import IterationInputs
from components.train.policy import adapter_state_dict, write_adapter_checkpoint
from components.train.update import (
    IterationWork,
    Trainer,
    steps_per_iteration,
    train_iteration,
)

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


def handoff_dtype(cfg: RunConfig) -> torch.dtype:
    """The dtype checkpoints 1.. are written in (`train.handoff.dtype`; auto: generate's)."""
    name = cfg.train.handoff.dtype
    if name == "auto":
        name = sampler_dtype_name(cfg.generate.backend, cfg.generate.dtype)
    return getattr(torch, name)


class Arrival(Enum):
    """How the engine came to hold the iteration a step trains (the metrics' `train/engine`)."""

    REUSE = "reuse"
    """It held it already: warm from the previous step."""
    LOAD = "load"
    """Built: the worker had no engine."""
    RELOAD = "reload"
    """Rebuilt: it held another position (an iteration redone out of band)."""


@dataclass(frozen=True)
class Replay:
    """How the engine came to hold its position, until a step reports it: built (load or
    reload) from a full state and `updates` replayed from it, `mismatches` of which did not
    reproduce the committed checkpoint bit for bit; or reused, with nothing replayed."""

    arrival: Arrival = Arrival.REUSE
    updates: int = 0
    mismatches: int = 0


@dataclass(frozen=True)
class Position:
    """Where the engine stands, replaced whole at each move."""

    hold: tuple[int, str] | None = None
    """Hold: the committed position (iteration, checkpoint digest) the engine is at."""
    clean: bool = False
    """The engine is at `hold`, not inside an update: its state can be written."""
    replay: Replay = field(default_factory=Replay)
    """Replay: how it came to hold it (reported once, by the next step)."""
    state_at: int = 0
    """The newest full state covering the held position's past (0: the base)."""


@dataclass(frozen=True)
class Verdict:
    """The run's health after one iteration, as the step uses it (rank 0; judged nowhere
    else)."""

    figures: dict[str, Any] = field(default_factory=dict)
    """For the checkpoint's manifest: the health record and its figures."""
    runs_on: bool = True
    """Run on: the run goes on past this iteration. False: its stop record is written, and
    this iteration's policy is not broadcast."""


class NoChannel(Enum):
    """Rank 0's weight channel where it has no sending end (else a `Sender`)."""

    UNOPENED = "unopened"
    """No policy has gone over it yet: it opens on first use."""
    REFUSED = "refused"
    """Its port could not listen: every policy goes by the store."""


class TrainStage(Stage):
    """Warm train worker (components/core/warm.py). The DeepSpeed engine, its optimizer state and
    the reference model stay in memory across iterations: step i trains the policy after i
    updates and commits checkpoint i+1 (the handoff). The full train state is written every
    `train.state_every` iterations and when the worker stops. The engine is rebuilt only when it
    does not hold exactly the committed checkpoint i (a worker's first step, an iteration redone
    out of band): from the newest full state at or before i, replaying the updates since from
    their committed scored rollouts, each checked against the checkpoint the run committed. So
    a warm run, N cold invocations and a run killed anywhere and resumed train identically
    (tested)."""

    name = "train"
    prewarms = True

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        if num_shards != 1:
            raise ValueError("train is not sharded: its ranks split the work (train.gpus)")
        super().__init__(cfg)
        self.t = cfg.train
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.built: Built | None = None
        self.weights: WeightPlan | None = None
        """The handoff's files and sources, for this engine (full fine-tuning)."""
        self._image_tables: dict[str, Any] = {}
        """The `images` columns of the run's datasets, read once per worker."""
        self.position = Position()
        """Where the engine stands: hold, replay, and the full state covering its past."""
        self.states = train_state.Background()
        self.channel: Sender | NoChannel = NoChannel.UNOPENED
        """The weight channel's sending end (rank 0, train.handoff.channel: broadcast)."""

    @property
    def engine(self):
        return self.built.engine if self.built is not None else None

    @property
    def rank(self) -> int:
        return self.built.rank if self.built is not None else 0

    def check(self) -> None:
        """Names, option keys and the objective on a test batch (components/train/checks.py)."""
        from components.core.errors import Problems
        from components.train.checks import check_train

        problems = Problems()
        check_train(self.cfg, problems)
        problems.raise_if_any("train config")

    def needs(self, iteration: int) -> list[str]:
        return [self.layout.scored(iteration), *self.warm_needs(iteration)]

    def warm_needs(self, iteration: int) -> list[str]:
        return [self.layout.checkpoint(iteration)]

    def warm(self, iteration: int) -> None:
        """Bring the engine to checkpoint i before iteration i's rollouts are scored (a worker's
        first iteration, or after an out-of-band rerun); a no-op when it holds i."""
        if not self.up_to_date(iteration):
            self.hold(iteration)

    def _position(self, iteration: int) -> tuple[int, str]:
        return (iteration, content_digest(self.store, self.layout.checkpoint(iteration)))

    # --- hold: the engine at the policy after `iteration` updates ---

    def hold(self, iteration: int) -> None:
        """Make the engine hold checkpoint `iteration`: as it is, or built from the newest full
        state at or before it and replayed forward."""
        position = self._position(iteration)
        if self.engine is not None and self.position.hold == position:
            return
        arrival = Arrival.LOAD if self.engine is None else Arrival.RELOAD
        s = self._build_newest(iteration)
        mismatches = sum(not self._replay(j) for j in range(s, iteration))
        self.position = Position(
            hold=position,
            clean=True,
            replay=Replay(arrival, updates=iteration - s, mismatches=mismatches),
            state_at=s,
        )

    def _build_newest(self, iteration: int) -> int:
        """A fresh engine at the newest full state at or before `iteration` that every rank
        agrees on, chosen again where it was retired since it was chosen (a previous worker's
        sweep); returns that state."""
        for _ in range(2):
            s = self._agreed_state(iteration)
            try:
                self._build(s)
                return s
            except RetiredError:
                log.info("train state %05d was retired meanwhile; choosing again", s)
        s = self._agreed_state(iteration)
        self._build(s)
        return s

    def _agreed_state(self, iteration: int) -> int:
        """The state every rank builds from: rank 0's choice, broadcast (ranks looking at the
        store on their own could see different newest states while one is being committed)."""
        import torch.distributed as dist

        device, _ = device_and_dtype(self.t.dtype)
        rank, world = init_distributed(device)
        choice = [self._newest_state(iteration) if rank == 0 else 0]
        if world > 1:
            dist.broadcast_object_list(choice, src=0)
        return int(choice[0])

    def _newest_state(self, iteration: int) -> int:
        """The newest committed full state at or before `iteration` that belongs to the
        checkpoint the run has committed at its index (a checkpoint redone since makes its
        state another run's); 0, the base, when there is none."""
        store, layout = self.store, self.layout
        for s in reversed(committed_indices(store, layout.train_state_dir)):
            if s > iteration or s == 0:
                continue
            try:
                manifest = read_manifest(store, layout.train_state(s))
                if is_retired(manifest):
                    continue
                digest = manifest.get("stats", {}).get("checkpoint_digest")
                if digest == content_digest(store, layout.checkpoint(s)):
                    return s
            except StoreError:
                continue
            log.warning(
                "train state %05d %s; not resuming from it",
                s,
                "was written by an older rlvr"
                if digest is None
                else f"belongs to another checkpoint {s:05d} than the one committed (redone since)",
            )
        return 0

    def _build(self, state: int) -> None:
        """A fresh engine at full state `state`."""
        ref = self.built.ref_model if self.built is not None else None
        self._release()
        self.built = build(self.cfg, self.store, self.layout, state, ref)
        self.weights = None
        if self.cfg.model.lora is None:
            self.weights = WeightPlan(self.engine, handoff_dtype(self.cfg))
        self.position = replace(self.position, state_at=state)

    def _replay(self, j: int) -> bool:
        """Update j again, from its committed inputs, and check the weights it gives against
        checkpoint j+1 as the run committed it: equal bit for bit where the update is
        deterministic (a CPU); elsewhere the difference is reported and training goes on
        from the replayed weights, which differ from the lost ones by nondeterminism alone.
        False where they differ (rank 0; the other ranks do not compare)."""
        out, lineage_in = self._plan(j)
        if not out.up_to_date(lineage_in):
            raise StageError(
                f"train cannot replay update {j}: checkpoint {j + 1:05d} was computed from other "
                "inputs or settings than this config's (logged above), so the train state it "
                "came from is not this run's; rerun the run (`rlvr run` recomputes what is "
                "stale) or start a new one"
            )
        inputs = IterationInputs.read(self.cfg, self.store, self.layout, j)
        self._update(inputs, Timeline(self.task, j))
        got = self._handoff_digests()
        if self.rank != 0:
            return True
        files = read_manifest(self.store, self.layout.checkpoint(j + 1))["files"]
        expected = {f["path"]: f["sha256"] for f in files if f["path"] in got}
        if expected != got:
            log.warning(
                "train: replayed update %d does not reproduce checkpoint %05d bit for bit "
                "(a nondeterministic update, or another machine); training goes on from the "
                "replayed weights",
                j,
                j + 1,
            )
        return expected == got

    def _handoff_digests(self) -> dict[str, str]:
        """{file: sha256} of the handoff the engine would write now, written nowhere (rank 0;
        the other ranks take part in the gathers)."""
        keep = self.rank == 0
        if self.weights is not None:
            return {k: v.sha256 for k, v in self.weights.write(None, keep=keep).items()}
        return self._adapter_digests(keep)

    def _adapter_digests(self, keep: bool) -> dict[str, str]:
        """{adapter file: sha256} of a LoRA run's handoff, written to a scratch directory."""
        import tempfile

        from components.core.commit import sha256_file
        from components.model.adapter import ADAPTER_WEIGHTS, write_adapter

        weights = adapter_state_dict(self.engine)  # gathered on every rank (ZeRO-3)
        if not keep:
            return {}
        with tempfile.TemporaryDirectory(prefix="rlvr-replay-") as tmp:
            write_adapter(self.engine.module, weights, Path(tmp), self.built.base_digest, "")
            return {ADAPTER_WEIGHTS: sha256_file(Path(tmp) / ADAPTER_WEIGHTS)}

    # --- one iteration ---

    def _plan(self, iteration: int) -> tuple[OutputDir, Lineage]:
        o = lineages.train(self.cfg, self.layout, iteration)
        return o.dir(self.store), o.lineage(self.store, self.layout.root)

    def up_to_date(self, iteration: int) -> bool:
        try:
            ckpt_out, inputs = self._plan(iteration)
        except NotCommittedError:  # an input is not there yet: the step is still to do
            return False
        return ckpt_out.up_to_date(inputs)

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        """Take one iteration's policy update; returns the checkpoint manifest stats (or skip)."""
        check_algorithm_names(self.t)
        ckpt_out, lineage_in = self._plan(iteration)
        if ckpt_out.up_to_date(lineage_in) and not force:
            log.info("checkpoint %05d already committed; skipping", iteration + 1)
            return {"skipped": True, "uri": ckpt_out.uri}

        # --- decide: every input is checked before anything is written; the engine at i ---
        with timeline.span("read"):
            inputs = IterationInputs.read(self.cfg, self.store, self.layout, iteration)
            position = self._position(iteration)
        replay = self._reach(iteration, position, timeline)

        # --- work: the updates, then the run's health (before the commit: see the module) ---
        metrics = self._work(inputs, replay, timeline)
        verdict = self._health(iteration, metrics)
        metrics.update(verdict.figures)

        # --- commit: checkpoint i+1, whose _SUCCESS lets generate start ---
        broadcast = self._broadcasts(iteration + 1, verdict)
        metrics.update(self._commit(ckpt_out, metrics, lineage_in, timeline, broadcast))

        # --- after the commit: the engine holds i+1; the full state; retention ---
        self._after_commit(iteration)
        log.info(
            "train %05d: loss %.4f reward %.3f grad_norm %.3f tokens/s %.0f (%s engine)",
            iteration,
            metrics.get("train/loss", 0.0),
            metrics["train/reward_mean"],
            metrics["train/grad_norm"],
            metrics["train/tokens_per_s"],
            replay.arrival.value,
        )
        return {"skipped": False, "uri": ckpt_out.uri, "stats": metrics}

    def _reach(self, iteration: int, position: tuple[int, str], timeline: Timeline) -> Replay:
        """Make the engine hold iteration i's checkpoint (`position`), building it only where it
        does not; returns how it came to (what warm() did, if anything), reported once."""
        if self.engine is None or self.position.hold != position:
            with timeline.span("load"):
                self.hold(iteration)
        replay = self.position.replay
        self.position = replace(self.position, replay=Replay())
        return replay

    def _work(self, inputs: IterationInputs, replay: Replay, timeline: Timeline) -> dict[str, Any]:
        """Iteration i's updates on the held engine; returns their metrics, with the inputs'
        staleness and how the engine came to hold i."""
        self.position = replace(self.position, clean=False)
        _, metrics = self._update(inputs, timeline)
        metrics.update(inputs.staleness)
        metrics["iteration"] = inputs.iteration
        metrics["train/engine"] = replay.arrival.value
        metrics["train/replayed"] = float(replay.updates)
        metrics["train/replay_mismatches"] = float(replay.mismatches)
        metrics["train/seconds"] = timeline.seconds("work")
        return metrics

    def _after_commit(self, iteration: int) -> None:
        """Once checkpoint i+1 is committed: the engine holds it; its full state every
        `train.state_every` iterations (in the background: generate already has the new
        weights); the retention policy."""
        barrier()  # every rank sees the commit before it records what it holds
        self.position = replace(self.position, hold=self._position(iteration + 1), clean=True)
        if (iteration + 1) % self.t.state_every == 0:
            self._save_state(background=True)
        self._sweep()

    def _health(self, iteration: int, metrics: dict) -> Verdict:
        """Run health after this iteration (components/train/health.py), for the checkpoint's
        manifest: the record, its figures, a warning per new symptom; and, when the run is to
        stop, the stop record, written before the checkpoint commits (rank 0). Judging never
        fails the step."""
        from components.core import run_control
        from components.train import health

        if self.rank != 0:
            return Verdict()
        try:
            h = health.judge(self.cfg, self.store, self.layout, iteration, metrics)
        except Exception:  # noqa: BLE001 - see the docstring
            log.warning("train: could not judge the run's health", exc_info=True)
            return Verdict()
        runs_on = True
        if h.stop:
            try:
                run_control.write_stop(self.cfg, h)
                runs_on = False
            except (StoreError, OSError):
                log.warning("train: could not record the run's stop", exc_info=True)
        for event in h.events:
            if event.iteration == iteration:
                level = logging.INFO if event.level == "note" else logging.WARNING
                log.log(level, "health: %s", event.message)
        if h.stop:
            log.warning("health: the run stops after iteration %d: %s", iteration, h.summary)
        figures = {"health": h.model_dump(mode="json"), **run_control.figures(h)}
        return Verdict(figures, runs_on)

    def _update(self, inputs: IterationInputs, timeline: Timeline) -> tuple[int, dict]:
        """Iteration `inputs.iteration`'s optimizer steps on the held engine."""
        cfg, t, b = self.cfg, self.t, self.built
        i, ro = inputs.iteration, inputs.rollouts
        if ro.images_ref is not None:  # image prompts: their pixel values, once per prompt
            with timeline.span("images"):
                ro.vision = resolve_images(
                    self.store, self.layout.root, ro.images_ref, b.vision, self._image_tables
                )
        torch.manual_seed(cfg.run.seed + i)
        pad_id = b.tokenizer.pad_token_id if b.tokenizer.pad_token_id is not None else 0
        trainer = Trainer(b.engine, b.device, pad_id, b.rank, b.world, b.ref_model)
        work = IterationWork(
            ro,
            i,
            inputs.temperature,
            horizon=t.loss_agg_horizon or cfg.generate.max_new_tokens,
            start_step=i * steps_per_iteration(t),
            total_steps=cfg.run.iterations * steps_per_iteration(t),
            seed=cfg.run.seed,
            old_logprobs=inputs.old_logprobs,
            compare_rollout=inputs.definition == LOGPROB_DEFINITION,
        )
        with timeline.span("work"), device_turn.holding():
            return train_iteration(trainer, work, t)

    def _commit(
        self, out: OutputDir, metrics: dict, inputs: dict, timeline: Timeline, broadcast: bool
    ) -> dict[str, Any]:
        """Write and commit checkpoint i+1 (rank 0; the others take part in the gathers): the
        whole policy, first over the weight channel where `broadcast`; or a LoRA run's
        adapter."""
        t0 = time.time()

        def finish(figures: dict[str, float]) -> dict[str, Any]:
            timeline.add("commit", t0, time.time())
            return {**metrics, **figures, "timeline": timeline.record()}

        if self.weights is not None:
            version = int(metrics["iteration"]) + 1
            return self._commit_policy(out, inputs, timeline, finish, broadcast, version)
        return self._commit_adapter(out, metrics, inputs, timeline, t0)

    def _commit_policy(
        self,
        out: OutputDir,
        inputs: dict,
        timeline: Timeline,
        finish: Callable[[dict[str, float]], dict[str, Any]],
        broadcast: bool,
        version: int,
    ) -> dict[str, Any]:
        """The whole policy's handoff, streamed into checkpoint i+1
        (components/train/handoff.py)."""
        writer = self.rank == 0
        figures = write_handoff(
            self.weights,
            self.engine.module,
            self.built.tokenizer_files,
            out,
            keep=writer,
            finish=finish,
            inputs=inputs,
            channel=broadcast,
            sender=self._sender() if writer and broadcast else None,
            version=version,
            timeline=timeline,
        )
        return {**figures, "handoff_dtype": dtype_name(self.weights.dtype)} if writer else {}

    def _commit_adapter(
        self, out: OutputDir, metrics: dict, inputs: dict, timeline: Timeline, t0: float
    ) -> dict[str, Any]:
        """A LoRA run's handoff: the adapter alone (kilobytes to megabytes, fp32)."""
        module = self.engine.module
        weights = adapter_state_dict(self.engine)
        barrier()  # every rank has taken part in the gathers
        if self.rank != 0:
            return {}
        out.begin(force=True)
        module.config.use_cache = True
        try:
            return write_adapter_checkpoint(
                module,
                self.built.tokenizer_files,
                weights,
                out,
                metrics,
                inputs,
                timeline,
                t0,
                base_digest=self.built.base_digest,
                base_uri=self.layout.checkpoint(0),
            )
        finally:
            module.config.use_cache = False

    def _broadcasts(self, version: int, verdict: Verdict) -> bool:
        """Whether policy `version` goes over the weight channel (train.handoff.channel:
        broadcast): while this worker serves a run, to the generate workers of its segment
        (on-policy, generate of iteration v samples with v; none samples with the segment's
        last checkpoint), unless the run stops after this iteration (rank 0 decides: the other
        ranks only take part in the gathers)."""
        return (
            self.t.handoff.channel == "broadcast"
            and self.serving
            and self.cfg.model.lora is None
            and version in self.served
            and verdict.runs_on
        )

    def _sender(self) -> Sender | None:
        """Rank 0's sending end of the weight channel, opened on first use. A port it cannot
        listen on leaves every policy to the store path."""
        if self.channel is NoChannel.UNOPENED:
            self.channel = self._open_channel()
        return self.channel if isinstance(self.channel, Sender) else None

    def _open_channel(self) -> Sender | NoChannel:
        h, g = self.t.handoff, self.cfg.generate
        settings = Settings(
            self.store,
            self.layout.root,
            receivers=g.num_shards * ranks_per_worker(g.backend, g.vllm.tensor_parallel_size),
            port=h.port,
            bucket_mb=h.bucket_mb,
            timeout_s=h.timeout_s,
            device=self.built.device,
        )
        try:
            return Sender(settings)
        except (OSError, RuntimeError) as e:
            log.warning(
                "weight channel: cannot listen on port %d (%s); every policy goes by the store",
                h.port,
                e,
            )
            return NoChannel.REFUSED

    # --- the full train state ---

    def _save_state(self, *, background: bool) -> None:
        """The full state at the held position, written by every rank (in the background:
        generate already has the new weights), once the previous write is done (one snapshot
        in memory at a time)."""
        self._await_state()
        s = self.position.hold[0]
        self.position = replace(self.position, state_at=s)
        train_state.save(
            self.engine,
            self.store,
            self.layout.train_state(s),
            iteration=s,
            step=s * steps_per_iteration(self.t),
            checkpoint_uri=self.layout.checkpoint(s),
            rank=self.rank,
            world=self.built.world,
            barrier=barrier,
            background=self.states if background else None,
            wait_s=self.cfg.run.wait_timeout_s,
        )

    def _sweep(self) -> None:
        """Apply the retention policy (rank 0, while serving a run: a one-iteration rerun, the
        fix a RetiredError names, keeps what it rebuilt); it never fails the step."""
        if self.rank != 0 or not self.serving:
            return
        from components.core.retention import sweep

        try:
            sweep(self.cfg, self.task)
        except (StoreError, OSError) as e:
            log.warning("retention sweep failed (%s); nothing was deleted that a stage needs", e)

    def close(self) -> None:
        """Finish the pending state write; write the full state of the held position when no
        state covers it yet (the end of a segment, a one-iteration rerun, a peer's failure
        while this worker waited), unless the engine stopped inside an update; drop the
        engine. A state that cannot be written costs a longer replay at the next resume, not
        the run, so that is logged, not raised."""
        self._await_state()
        p = self.position
        if self.engine is not None and p.clean and p.hold[0] > p.state_at:
            try:
                self._save_state(background=False)
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("train: writing the train state at close failed")
        if self.engine is not None:
            self._sweep()  # the state just committed retires the one before
        if isinstance(self.channel, Sender):
            self.channel.close()
        self.channel = NoChannel.UNOPENED
        self._release()

    def _await_state(self) -> None:
        """Wait for the background state write; its failure costs a longer replay at the next
        resume (an older state is there), not the run: logged, not raised."""
        try:
            self.states.wait()
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("train: the background write of a train state failed")

    def _release(self) -> None:
        if self.built is not None:
            release(self.built.engine)
            self.built = None
            self.weights = None
            self.position = replace(self.position, hold=None, clean=False)


#: `rlvr stage train` (one policy update, cold) and the worker task; components/train/launch.py
#: wraps them in torchrun for several ranks.
run, serve = TrainStage.run, TrainStage.serve
