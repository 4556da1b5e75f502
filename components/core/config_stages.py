"""The stage sections of a run config: generate (and its environment), verify (rewards and
the overlong penalty), train and evaluate. Part of `components.core.config`, which re-exports
every name here; split out by family to keep each module short."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.core.config_base import Strict
from components.core.config_fields import ALWAYS, INLINE, NEVER, OWN, USER, setting, when


class EnvironmentSection(Strict):
    """`generate.environment`: an OpenEnv server (one session per trajectory)."""

    url: str
    """http(s)://HOST:PORT or ws(s)://HOST:PORT[/ws] of the environment server."""
    name: str = "env"
    """The tool name the policy calls it by; the call's arguments are the action's fields."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for one answer of the environment server."""


class TransformersGenerate(Strict):
    """`generate.transformers`: keys of the transformers backend only."""

    batch_size: int = setting(64, ge=1, lineage=OWN)
    """Most sequences decoded together."""
    batch_tokens: int | None = setting(None, ge=1, lineage=ALWAYS)
    """Token budget of one transformers batch: sequences x (longest prompt + max_new_tokens), so
    long prompts get smaller batches (None: batch_size alone). While decode steps run on CUDA
    graphs' static cache, the second factor is its width: that sum rounded up to a power of two
    (at least 64)."""
    cuda_graphs: bool = setting(True, lineage=NEVER)
    """Transformers backend on a GPU: decode steps on a static KV cache, each replayed as a CUDA
    graph (one per row bucket); a small model's step is launch-bound there. No effect on a CPU."""
    continuous_batching: bool = setting(False, lineage=NEVER)
    """Transformers backend: a finished row's room goes to the next prompt at once (whole prompts
    join the rows decoding), so a long sample holds only its own row, not its batch. Samples equal
    static batching's up to rounding; a prompt's samples arrive as they complete, so rollouts are
    written in another row order. Takes the growing KV cache (no CUDA graphs)."""


class VLLMGenerate(Strict):
    """`generate.vllm`: keys of the vLLM backend only."""

    tensor_parallel_size: int = setting(1, ge=1, lineage=ALWAYS)
    """vLLM: GPUs one generate worker shards the model over."""
    gpu_memory_utilization: float = setting(0.85, gt=0.0, le=1.0, lineage=ALWAYS)
    """vLLM: the share of GPU memory its engine may take."""
    max_model_len: int | None = setting(None, lineage=ALWAYS)
    """vLLM: the longest sequence (prompt + response); None: the model's own."""
    enable_prefix_caching: bool = setting(True, lineage=ALWAYS)
    """vLLM: reuse the KV cache of shared prompt prefixes (the n samples of a prompt)."""


#: Keys that moved from `generate` into its backend's sub-section, and where to.
MOVED_GENERATE_KEYS = {
    "batch_size": "transformers",
    "batch_tokens": "transformers",
    "cuda_graphs": "transformers",
    "continuous_batching": "transformers",
    "tensor_parallel_size": "vllm",
    "gpu_memory_utilization": "vllm",
    "max_model_len": "vllm",
    "enable_prefix_caching": "vllm",
}


class GenerateSection(Strict):
    backend: Literal["transformers", "vllm"] = setting("transformers", lineage=ALWAYS, tier=USER)
    """`transformers` (any machine) or `vllm` (CUDA GPUs, the `vllm` extra)."""
    n: int = setting(8, ge=1, lineage=ALWAYS, tier=USER)
    """Samples per prompt (the GRPO group size)."""
    temperature: float = setting(1.0, ge=0.0, lineage=ALWAYS, tier=USER)
    """0 means greedy."""
    top_p: float = setting(1.0, gt=0.0, le=1.0, lineage=ALWAYS)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = setting(0, ge=0, lineage=ALWAYS)
    """0 disables top-k."""
    max_new_tokens: int = setting(32, ge=1, lineage=ALWAYS, tier=USER)
    """The longest response, in tokens (a longer one is cut and marked truncated)."""
    max_prompt_tokens: int = setting(512, ge=1, lineage=ALWAYS)
    """Prompts longer than this are refused by `rlvr check`, naming the row."""
    stop: list[str] = setting(default_factory=list, lineage=ALWAYS)
    """Stop strings; the response ends with the stop string included (one rule for all backends)."""
    stop_token_ids: list[int] = setting(default_factory=list, lineage=ALWAYS)
    """Token ids that end a response like EOS (e.g. <|im_end|>)."""
    transformers: TransformersGenerate = setting(
        default_factory=lambda: TransformersGenerate(), lineage=INLINE
    )
    """Keys of the transformers backend only."""
    tools: list[str] = setting(default_factory=list, lineage=when("multi_turn"), tier=USER)
    """Tools the policy may call (multi-turn rollouts): `python` (built in:
    the code runs in the code verifier's sandbox) or `module:function` / `file.py:function` (a
    typed, documented callable). Empty: single-turn sampling."""
    max_turns: int = setting(4, ge=1, lineage=when("multi_turn"))
    """With tools: the most policy turns per trajectory."""
    max_response_tokens: int | None = setting(None, ge=1, lineage=when("multi_turn"))
    """With tools: the token budget of a whole trajectory, observations included (None:
    max_new_tokens x max_turns)."""
    environment: EnvironmentSection | None = setting(None, lineage=when("multi_turn"))
    """A stateful environment over OpenEnv's WebSocket protocol that the policy acts in through
    tool calls named `environment.name` (docs/tools.md)."""
    rows_per_part: int = setting(4096, ge=1, lineage=ALWAYS)
    """Rows per Parquet row group / flush, which bounds memory."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting("auto", lineage=ALWAYS)
    """auto: float32 on CPU, bfloat16 on GPU."""
    num_shards: int = setting(1, ge=1, lineage=OWN)
    """The pipeline fans generation out over this many shards (dsl.ParallelFor)."""
    # vLLM-only knobs (ignored by the transformers backend).
    vllm: VLLMGenerate = setting(default_factory=lambda: VLLMGenerate(), lineage=INLINE)
    """Keys of the vLLM backend only."""
    max_images_per_prompt: int = setting(4, ge=1, lineage=NEVER)
    """Image prompts: the most images one prompt may carry (`rlvr check` refuses rows with more;
    vLLM reserves memory for this many, its `limit_mm_per_prompt`)."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """A key of one backend at the top of `generate` (where it was before) names its new
        place."""
        if isinstance(data, dict):
            for key in data:
                if key in MOVED_GENERATE_KEYS:
                    new = f"generate.{MOVED_GENERATE_KEYS[key]}.{key}"
                    raise ValueError(
                        f"generate.{key} is now {new}: move it under "
                        f"generate.{MOVED_GENERATE_KEYS[key]}: (`{new}=...` on the command line)"
                    )
        return data


class RewardComponent(Strict):
    verifier: str
    """A built-in verifier (math, exact, code, format) or a plugin 'module:fn' / 'file.py:fn'."""
    weight: float = 1.0
    """The component's weight in the sum."""
    name: str | None = None
    """Key in the reward_components column (default: the verifier spec)."""

    @property
    def key(self) -> str:
        return self.name or self.verifier


class RewardSpec(Strict):
    """A weighted sum of named reward components for one data_source."""

    components: list[RewardComponent] = Field(min_length=1)
    """The verifiers whose weighted scores add up to the reward."""

    @model_validator(mode="after")
    def _unique_keys(self) -> RewardSpec:
        keys = [c.key for c in self.components]
        if len(set(keys)) != len(keys):
            raise ValueError(f"reward component names must be unique, got {keys}; set `name`")
        return self


class OverlongPenalty(Strict):
    """DAPO's soft overlong penalty, added as the reward component 'overlong'."""

    max_length: int = Field(ge=1)
    """Response tokens at which the penalty reaches -penalty (usually generate.max_new_tokens)."""
    buffer: int = Field(ge=1)
    """The penalty ramps linearly over the last `buffer` tokens before max_length."""
    penalty: float = Field(1.0, ge=0.0)
    """The penalty at `max_length` (it grows linearly over the buffer before it)."""

    @field_validator("buffer")
    @classmethod
    def _buffer_within_max_length(cls, v: int, info: ValidationInfo) -> int:
        max_length = info.data.get("max_length")
        if max_length is not None and v > max_length:
            raise ValueError(
                f"must be at most max_length ({max_length}): the penalty ramps "
                "over the last `buffer` tokens before max_length"
            )
        return v


class VerifySection(Strict):
    rewards: dict[str, str | RewardSpec] = setting(default_factory=dict, lineage=ALWAYS, tier=USER)
    """data_source -> a verifier spec (built-in name or plugin 'package.module:function' /
    'path/to/file.py:function', verl or TRL signature), or {components: [{verifier, weight,
    name}, ...]} for a weighted sum."""
    overlong_penalty: OverlongPenalty | None = setting(None, lineage=ALWAYS)
    """DAPO's soft penalty on responses near max_new_tokens (null: none)."""
    env_reward_weight: float = setting(1.0, lineage=when("environment"))
    """With generate.environment: the environment's reward (its step rewards summed over the
    trajectory, rollout column `env_reward`) enters the reward with this weight, as the
    component 'env'; 0 leaves it out."""
    timeout_s: float = setting(5.0, gt=0, lineage=ALWAYS)
    """Per-sample time limit; a sample over it scores 0 and records the error."""
    num_workers: int = setting(1, ge=0, lineage=OWN)
    """Verifier worker processes (0: inline, no timeout enforcement; for debugging)."""
    max_error_fraction: float = setting(0.05, ge=0.0, le=1.0, lineage=ALWAYS)
    """The stage fails when more than this share of samples errored or timed out."""
    num_shards: int = setting(1, ge=1, lineage=OWN)
    """The pipeline fans verification out over this many shards (dsl.ParallelFor)."""


class HandoffSection(Strict):
    """`train.handoff`: how each new policy reaches generate and evaluate (docs/design.md,
    "The policy handoff")."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype of the weights handed over: auto, the dtype generate samples in (bfloat16
    where `generate.dtype` is bfloat16, and for vLLM; float32 on a CPU by default), which is
    all a sampler reads. The fp32 masters live in the full train state only."""
    channel: Literal["store", "broadcast"] = "store"
    """store: generate loads each checkpoint from the store. broadcast: train's rank 0 also
    sends the weights straight to the generate workers over torch.distributed (gloo on CPU,
    NCCL on GPU) in buckets, the checkpoint still landing in the store as the durable record;
    any peer missing or failing falls back to the store path within `timeout_s`."""
    port: int = Field(29650, ge=0, le=65535)
    """broadcast: the port train's rank 0 listens on (0: any free port); on a cluster the
    generate pods reach it at the train pod's IP, which train publishes in the store."""
    bucket_mb: int = Field(256, ge=1)
    """broadcast: weights go in buckets of about this many MB (bounded memory on both ends)."""
    timeout_s: float = Field(60.0, gt=0)
    """broadcast: the longest any side waits for its peer before it falls back to the store."""


class TrainSection(Strict):
    zero_stage: int = setting(0, ge=0, le=3, lineage=ALWAYS)
    """DeepSpeed ZeRO stage 0-3: how optimizer state, gradients and weights are partitioned over the ranks."""
    lr: float = setting(1e-5, gt=0, lineage=ALWAYS, tier=USER)
    """Adam's learning rate (its peak, under a schedule)."""
    betas: tuple[float, float] = setting((0.9, 0.999), lineage=ALWAYS)
    """Adam's beta1 and beta2."""
    eps: float = setting(1e-8, gt=0, lineage=ALWAYS)
    """Adam's epsilon."""
    weight_decay: float = setting(0.0, ge=0, lineage=ALWAYS)
    """Decoupled weight decay (AdamW)."""
    grad_clip: float = setting(1.0, gt=0, lineage=ALWAYS)
    """Clip the gradient's global norm to this before each step."""
    warmup_steps: int = setting(0, ge=0, lineage=ALWAYS)
    """Optimizer steps of linear learning-rate warm-up."""
    lr_schedule: Literal["constant", "cosine"] = setting("constant", lineage=ALWAYS)
    """`constant`, or `cosine` decay to `min_lr_ratio` over the run's optimizer steps."""
    min_lr_ratio: float = setting(0.0, ge=0.0, le=1.0, lineage=ALWAYS)
    """Cosine floor as a fraction of lr."""
    advantage: str = setting("grpo", lineage=ALWAYS, tier=USER)
    """Advantage estimator, by registry name (components.train.algorithms)."""
    advantage_options: dict[str, Any] = setting(default_factory=dict, lineage=ALWAYS)
    """Keyword arguments of the advantage estimator."""
    policy_loss: str = setting("ppo_clip", lineage=ALWAYS, tier=USER)
    """Policy loss, by registry name (ppo_clip, gspo, cispo, ...)."""
    policy_loss_options: dict[str, Any] = setting(default_factory=dict, lineage=ALWAYS)
    """Keyword arguments of the policy loss (clip ranges, ...)."""
    loss_agg: str = setting("token-mean", lineage=ALWAYS)
    """How token losses aggregate into the loss, by registry name (token-mean, seq-mean-token-mean, ...)."""
    loss_agg_horizon: int | None = setting(None, lineage=ALWAYS)
    """Constant horizon for 'seq-mean-token-sum-norm' (default: generate.max_new_tokens)."""
    mini_batches: int = setting(1, ge=1, lineage=ALWAYS)
    """Optimizer steps per PPO epoch: the iteration's rollouts are split into this many."""
    ppo_epochs: int = setting(1, ge=1, lineage=ALWAYS)
    """Passes over an iteration's rollouts."""
    micro_batch_tokens: int = setting(4096, ge=1, lineage=ALWAYS)
    """Token budget (prompt + response, padded) of one forward/backward micro-batch."""
    dtype: Literal["auto", "float32", "bfloat16"] = setting("auto", lineage=ALWAYS)
    """auto: float32 on CPU, bfloat16 on GPU. bf16 runs at ZeRO >= 1 (fp32 masters and Adam
    moments are then saved per parameter; checkpoints hold the fp32 masters)."""
    processes: int | None = setting(None, ge=1, lineage=ALWAYS)
    """Data-parallel processes per train node (None: one per visible GPU, one on CPU; on a
    cluster with nodes > 1, cluster.stages.train.accelerator_count)."""
    nodes: int = setting(1, ge=1, lineage=when("multi_node"))
    """Nodes the train step spans. 1: one pod (DeepSpeed over its GPUs). More: the train task
    submits a Kubeflow Trainer TrainJob (or a Training Operator PyTorchJob:
    cluster.train_job.api) of `nodes` pods x `processes` ranks under torchrun, waits for it and
    deletes it (docs/deploy.md); without a cluster, `nodes` torchrun agents on this machine meet
    over a loopback rendezvous."""
    max_staleness: int = setting(0, ge=0, lineage=ALWAYS)
    """Bounded staleness k: generate of iteration i samples with checkpoint max(0, i - k), so
    it overlaps train of the k iterations before. 0 is on-policy. Train refuses rollouts staler
    than k; set rollout_correction (tis) to correct for the lag (docs/algorithms.md)."""
    kl_coef: float = setting(0.0, ge=0.0, lineage=ALWAYS, tier=USER)
    """KL penalty against the frozen base policy (checkpoint 00000); 0 disables it and the
    reference model is not loaded."""
    kl_estimator: str = setting("low_var_kl", lineage=ALWAYS)
    """KL estimator by registry name: k1, k2, k3 / low_var_kl, ..."""
    kl_in_reward: bool = setting(False, lineage=ALWAYS)
    """Fold coef x KL into the token-level reward instead of adding it to the loss."""
    kl_metric: bool = setting(False, lineage=NEVER)
    """Record `train/kl_ref`, the KL of the policy to the base (kl_estimator, token mean over the
    iteration's rollouts, before the update), even with kl_coef 0. It loads the reference model
    (one more no-grad forward per iteration); with kl_coef > 0 it is always recorded."""
    freeze_vision: bool = setting(True, lineage=when("vision_trained"))
    """Vision-language policies: keep the vision tower (and its merger) fixed and train the
    language model only, as verl's and EasyR1's recipes do by default; false trains it too.
    With `model.lora` the base stays frozen and `model.lora.vision_tower` decides whether the
    tower gets adapters. Under bf16 training a frozen tower is saved from DeepSpeed's bf16
    copy: an fp32 base's tower is rounded to bf16 once, at the first checkpoint."""
    gradient_checkpointing: bool = setting(False, lineage=NEVER)
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (transformers' non-reentrant checkpointing): about a third more compute for activation memory
    that no longer grows with the layer count. The same gradients, so it is kept out of train's
    lineage: turning it on or off retrains nothing. Refused on a base whose config sets any
    dropout (some architectures apply it in the layers it puts in training mode)."""
    entropy_coef: float = setting(0.0, ge=0.0, lineage=ALWAYS)
    """Entropy bonus: loss -= entropy_coef x entropy (same aggregation as the policy loss)."""
    skip_no_signal_steps: bool = setting(False, lineage=when("skip_no_signal_steps"))
    """Take no optimizer step on a mini-batch that carries no signal (every advantage zero, no
    KL or entropy term): Adam's momentum would otherwise move the policy with no evidence. The
    step runs at learning rate 0, so the moments decay and the schedule keeps its place
    (docs/health.md has the measurements behind the default)."""
    old_logprobs: Literal["auto", "recompute", "rollout"] = setting(
        "auto", lineage=when("old_logprobs_rollout")
    )
    """Where PPO's old logprobs (pi_old, the policy that sampled) come from. recompute: a no-grad
    forward of the trainer over every rollout before the first update (verl's default).
    rollout: the sampler's recorded logprobs (verl's bypass mode; they must be defined as the
    trainer's). auto: rollout where they are the trainer's to float precision (2.8e-5 at
    most on the demo, 1e-4 asserted): on-policy rollouts of this very checkpoint, computed by the transformers
    sampler in float32 on the trainer's kind of device (as their manifest records), a float32
    trainer, no LoRA, tools, rollout correction or forking tokens; recompute otherwise. auto
    checks them every iteration against the trainer's own pass over one micro-batch and
    recomputes them all past 1e-4 (docs/algorithms.md)."""
    rollout_correction: Literal["tis", "mis"] | None = setting(None, lineage=ALWAYS)
    """Truncated (tis) or masked (mis) importance sampling from the rollout engine's recorded
    logprobs to the trainer's recomputed old logprobs."""
    rollout_correction_cap: float = setting(2.0, gt=0.0, lineage=ALWAYS)
    """The importance ratio's cap (tis) or the mask's threshold (mis)."""
    rollout_correction_level: Literal["token", "sequence"] = setting("token", lineage=ALWAYS)
    """Per token, or one ratio per sequence."""
    dynamic_sampling: bool = setting(False, lineage=ALWAYS)
    """DAPO: drop groups whose rewards all agree (they carry no GRPO signal); counted in metrics."""
    overlong_filter: bool = setting(False, lineage=ALWAYS)
    """DAPO: mask responses truncated at max_new_tokens out of the loss."""
    void_turn_filter: bool = setting(False, lineage=when("void_turn_filter"))
    """SimpleTIR (multi-turn): mask trajectories out of the loss that hold a void turn, a policy
    turn with neither a tool call nor an answer (`answer_pattern`); they still count in their
    group's advantages. Needs generate.tools or generate.environment."""
    answer_pattern: str = setting(r"\\boxed\{", lineage=when("void_turn_filter"))
    """With void_turn_filter: a regular expression that finds an answer in a policy turn."""
    forking_top_rho: float | None = setting(None, gt=0.0, le=1.0, lineage=ALWAYS)
    """Train only on the top-rho fraction of response tokens by entropy ("Beyond the 80/20 Rule")."""
    noisy_reward: Literal["backward", "forward"] | None = setting(None, lineage=ALWAYS)
    """Correct binary rewards for a noisy verifier with known error rates (arXiv 2510.00915)."""
    noisy_fp_rate: float = setting(0.0, ge=0.0, lt=1.0, lineage=ALWAYS)
    """The verifier's false-positive rate (noisy_reward)."""
    noisy_fn_rate: float = setting(0.0, ge=0.0, lt=1.0, lineage=ALWAYS)
    """The verifier's false-negative rate (noisy_reward)."""
    state_every: int = setting(10, ge=1, lineage=NEVER)
    """Write the full train state (fp32 masters, Adam moments, step, RNG), sharded by rank and
    in the background, every this many iterations, at the end of every segment and on a clean
    stop; not every iteration. A resume loads the newest and replays the updates since from
    the committed scored rollouts: the result is the same, bit for bit where the update is
    deterministic (docs/design.md, "Resume by replay"). It never changes what is trained, so it
    is kept out of train's lineage, like `handoff`."""
    handoff: HandoffSection = setting(default_factory=HandoffSection, lineage=NEVER)
    """How each new policy reaches generate and evaluate: its dtype and channel."""


class EvaluateSection(Strict):
    ks: list[int] = setting(default_factory=list, lineage=ALWAYS)
    """Extra k values for pass@k, beyond every power of two up to n."""
    bootstrap_resamples: int = setting(1000, ge=1, lineage=ALWAYS)
    """Resamples of the bootstrap behind pass@1's 95% CI."""
    seed: int = setting(1234, lineage=ALWAYS)
    """The evaluation's sampling seed: the same for every checkpoint."""
    every: int = setting(1, ge=1, lineage=NEVER, tier=USER)
    """Evaluate every `every`-th checkpoint (the base and the last are always evaluated)."""
    num_shards: int = setting(1, ge=1, lineage=OWN)
    """The pipeline fans evaluation sampling out over this many shards, then gathers metrics."""
