"""Generate stage: prompts + policy checkpoint i -> rollouts of iteration i.

    python -m components.generate CONFIG --run-id ID --iteration I [--force]
    rlvr stage generate CONFIG --run-id ID --iteration I

Reads `checkpoints/<i>` and the run's train set, samples `generate.n` responses for each of the
iteration's `data.prompts_per_iteration` prompts, and streams them as Parquet parts into
`iterations/<i>/rollouts/`, committed by `_SUCCESS` (docs/contracts.md). The evaluate stage reuses
`generate_rollouts` with its own sampling settings.
"""

from __future__ import annotations

import logging
from typing import Any

from components.core import lineages
from components.core.commit import (
    NotCommittedError,
    OutputDir,
    clear_other_layouts,
    content_digest,
    read_manifest,
    shard_dir,
    shard_of,
)
from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout, store_for
from components.core.lineages import policy_version
from components.core.schemas import read_dataset
from components.core.timing import Timeline
from components.core.warm import Stage, is_committed
from components.generate.prompt_sampler import PromptSampler
from components.generate.rollouts import (
    LoadedPolicy,
    RolloutSettings,
    dataset_uri,
    generate_rollouts,
    prompts_from,
    spec_from,
)
from components.model import device_turn
from components.model.engine import PolicyEngine
from components.model.profiling import profiled

__all__ = ["GenerateStage", "run", "serve"]

log = logging.getLogger("rlvr.generate")


class GenerateStage(Stage):
    """Warm generate worker (components/core/warm.py): the policy stays loaded; each step takes
    checkpoint max(0, i - train.max_staleness) in place and samples iteration i's prompts.

    With `num_shards` S > 1, prompts go to shards by a stable hash of their prompt_id and shard s
    commits `rollouts/shard-s-of-S/`; the union of the S shards has exactly the rows of an
    unsharded run, with the same samples up to float rounding of another batch layout (seeds never
    depend on batch or shard; docs/contracts.md, "Batch and shard invariance").
    """

    name = "generate"

    def __init__(self, cfg: RunConfig, *, shard: int = 0, num_shards: int = 1) -> None:
        super().__init__(cfg, shard=shard, num_shards=num_shards)
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.engine = PolicyEngine(cfg.generate, cfg.run.seed)
        self.sampler = PromptSampler(cfg, self.store, self.layout)
        self._train: tuple[str, str, Any] | None = None
        self._receiver = None
        self.tools = None
        if cfg.generate.tools or cfg.generate.environment:  # multi-turn: loaded once per worker
            from components.generate.tools import load_tools

            self.tools = load_tools(cfg.generate.tools)

    def needs(self, iteration: int) -> list[str]:
        return [self.layout.checkpoint(policy_version(self.cfg, iteration)), *self._data(iteration)]

    def _data(self, iteration: int) -> list[str]:
        """The inputs besides the policy: the train set and what the prompt sampler reads."""
        return [self.layout.train_data, *self.sampler.needs(iteration)]

    def early(self, iteration: int) -> bool:
        """With the weight channel: the policy is already on its way, and the rest is in."""
        version = policy_version(self.cfg, iteration)
        channel = self._channel()
        return (
            channel is not None
            and version > 0
            and all(is_committed(self.store, u) for u in self._data(iteration))
            and channel.offered(version)
        )

    def _channel(self):
        """The weight channel's receiving end (train.handoff.channel: broadcast), only while
        this worker serves a run (a one-iteration rerun reads the store)."""
        if self.cfg.train.handoff.channel != "broadcast" or not self.serving:
            return None
        if self._receiver is None:
            from components.model.channel import Receiver, Settings, ranks_per_worker
            from components.model.checkpoint import device_and_dtype

            h, g = self.cfg.train.handoff, self.cfg.generate
            per = ranks_per_worker(g.backend, g.vllm.tensor_parallel_size)
            settings = Settings(
                self.store,
                self.layout.root,
                receivers=g.num_shards * per,
                port=h.port,
                bucket_mb=h.bucket_mb,
                timeout_s=h.timeout_s,
                device=device_and_dtype(self.cfg.generate.dtype)[0],
            )
            self._receiver = Receiver(settings, rank=1 + self.shard * per)
        return self._receiver

    def _out(self, iteration: int) -> OutputDir:
        return OutputDir(
            self.store,
            shard_dir(self.layout.rollouts(iteration), self.shard, self.num_shards),
            "generate",
        )

    def _plan(self, iteration: int) -> tuple[OutputDir, dict[str, str]]:
        """The output directory and the lineage it must carry to count as up to date."""
        o = lineages.generate(self.cfg, self.layout, iteration, self.shard, self.num_shards)
        return o.dir(self.store), o.lineage(self.store, self.layout.root)

    def up_to_date(self, iteration: int) -> bool:
        out, inputs = self._plan(iteration)
        return out.up_to_date(inputs)

    def step(self, iteration: int, *, force: bool = False, timeline: Timeline) -> dict[str, Any]:
        cfg, store, layout = self.cfg, self.store, self.layout
        version = policy_version(cfg, iteration)
        ckpt_uri = layout.checkpoint(version)
        try:
            out, inputs = self._plan(iteration)
        except NotCommittedError:  # the policy is coming over the weight channel, not yet
            out, inputs = self._out(iteration), None  # committed: nothing can be up to date
        if inputs is not None and out.up_to_date(inputs) and not force:
            log.info(
                "rollouts of iteration %d (%s) already committed; skipping", iteration, out.uri
            )
            return {"skipped": True, "uri": out.uri}
        # The policy first: over the weight channel the sender waits for every receiver.
        backend, tokenizer, load, received = self._policy(version)
        timeline.add("load", load.start, load.end)
        # Every input is checked before the output directory is touched.
        with timeline.span("read"):
            spec = spec_from(cfg.generate, cfg.run.seed)
            train_uri, table = self._train_set()
            indices, sampler_figures = self.sampler.indices(table, iteration)
            prompts = prompts_from(table, train_uri, "train", indices)
            prompts = [p for p in prompts if shard_of(p.prompt_id, self.num_shards) == self.shard]
        clear_other_layouts(store, layout.rollouts(iteration), self.num_shards)
        shard_desc = f" shard {self.shard}/{self.num_shards}" if self.num_shards > 1 else ""
        with timeline.span("work"), device_turn.holding(), profiled(self.task, iteration) as prof:
            stats = generate_rollouts(
                out,
                LoadedPolicy(backend, tokenizer, ckpt_uri, version),
                prompts,
                spec,
                RolloutSettings.of(cfg.generate, self.tools),
                iteration=iteration,
                desc=f"generate {iteration:05d}{shard_desc}",
                allow_empty=self.num_shards > 1,
                run_root=layout.root,
            )
            prof.steps = stats.get("phases", {}).get("decode_steps", 0)
        if received is not None:  # the store's commit stays the record
            self._check_received(version, received)
        if inputs is None:
            _, inputs = self._plan(iteration)
        stats.update(load.stats())
        if sampler_figures:
            stats["sampler"] = sampler_figures
        stats.update(
            iteration=iteration,
            shard=self.shard,
            num_shards=self.num_shards,
            policy_version=version,
            timeline=timeline.record(),
        )
        manifest = out.commit(stats, inputs)
        log.info(
            "generate %05d%s: %d samples from checkpoint %05d, %.0f tokens/s, %.2f s",
            iteration,
            shard_desc,
            stats["samples"],
            version,
            stats["tokens_per_s"],
            stats["seconds"],
        )
        return {"skipped": False, "uri": out.uri, "stats": manifest["stats"]}

    def _policy(self, version: int):
        """The backend holding policy `version`: over the weight channel when it is coming
        that way, else from the store (once committed). Also returns, for the channel, what
        gives the received bytes' sha256s (None from the store)."""
        ckpt_uri = self.layout.checkpoint(version)
        channel = self._channel()
        if channel is not None and version > 0 and channel.offered(version):
            from components.model.channel import ChannelError

            try:
                return self.engine.receive(
                    self.store, self.layout.checkpoint(0), channel, version, self.task
                )
            except ChannelError as e:
                log.warning("%s; loading checkpoint %05d from the store", e, version)
        if self.serving:
            self.wait_for(self.store, [ckpt_uri])
        return (*self.engine.ensure(self.store, ckpt_uri, self.task), None)

    def _check_received(self, version: int, received) -> None:
        """Wait for checkpoint `version`'s commit, and refuse to commit rollouts sampled from
        weights that are not its files' (a channel that corrupted them, a sender that wrote
        other weights than it sent)."""
        from components.model.channel import ChannelError

        uri = self.layout.checkpoint(version)
        try:
            received = received.digests()
        except ChannelError as e:
            raise StageError(f"{e}; rerun: generate then loads {uri} from the store") from None
        self.wait_for(self.store, [uri])
        files = {f["path"]: f["sha256"] for f in read_manifest(self.store, uri)["files"]}
        wrong = sorted(k for k, v in received.items() if files.get(k) != v)
        if wrong:
            raise StageError(
                f"the weights received over the weight channel differ from {uri} as committed "
                f"({', '.join(wrong)}); rerun: generate then loads the checkpoint from the store"
            )
        self.engine.received(content_digest(self.store, uri))

    def _train_set(self):
        """The run's train set, read once per worker (again only if its content changed)."""
        digest = content_digest(self.store, self.layout.train_data)
        if self._train is None or self._train[0] != digest:
            from components.core.errors import Problems
            from components.core.preflight import scan_dataset

            uri = dataset_uri(self.store, self.layout.train_data)
            table = read_dataset(self.store, uri)
            problems = Problems()
            scan_dataset(table, uri, problems)  # every row, before any is sampled
            problems.raise_if_any("train set")
            self._train = (digest, uri, table)
        return self._train[1], self._train[2]

    def close(self) -> None:
        self.engine.close()
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        self._train = None
        if self.tools is not None:
            self.tools.close()


#: `rlvr stage generate` (one iteration, or one shard of its prompts, cold) and the worker task.
run, serve = GenerateStage.run, GenerateStage.serve
