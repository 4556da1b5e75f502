"""Run configuration: one YAML per run, validated by pydantic.

Every stage takes the same resolved `RunConfig`. Unknown keys and bad values are errors that name
the key, the value and the expected form (`ConfigError`). `--set a.b=c` overrides are applied to
the raw mapping before validation, so they are validated exactly like the file.

Paths in `model` and `data` that are relative are resolved against the config file's directory;
`run.store` that is relative is resolved against the current directory (runs land in
`./rlvr-runs/` by default).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from components.core.errors import UserError


class ConfigError(UserError):
    """A config file or override that cannot be used; the message says what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Strict):
    store: str = "./rlvr-runs"
    """Where runs live: a local path, file:// URI, or s3://bucket/prefix."""
    run_id: str | None = None
    """Run id; defaults to the config file's parent directory name."""
    iterations: int = Field(2, ge=1)
    """RL iterations (generate -> verify -> train). Any number: the pipeline runs them in
    segments of `segment_iterations`, so its size does not grow with them."""
    segment_iterations: int = Field(50, ge=1)
    """Iterations served by one set of warm workers (one pipeline run on a cluster; the next
    segment is submitted by the last task of this one). Bounds a worker pod's lifetime."""
    wait_timeout_s: float = Field(3600.0, gt=0)
    """How long a worker waits for an input (another stage's commit) before it gives up."""
    local_threads: int | None = Field(None, ge=1)
    """CPU threads of every worker under `rlvr run` (OMP_NUM_THREADS). None: by stage, so that
    workers computing at the same time do not oversubscribe the cores (pipelines/cli.py)."""
    poll_max_s: float | None = Field(None, gt=0)
    """Longest pause between two looks at the store while a worker waits (backoff from 20 ms).
    None: 0.01 s on a local store (a few stats per look), 1 s on S3 (a LIST request per look)."""
    seed: int = 0
    """Root seed: prompt selection and sampling derive from it."""
    s3_endpoint_url: str | None = None
    """S3 endpoint (MinIO, moto). Unset: the standard AWS environment (AWS_ENDPOINT_URL)."""

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v or v.startswith(".")):
            raise ValueError("must be a plain name: no '/', not empty, not starting with '.'")
        return v


class PrepareSection(_Strict):
    module: str | None = None
    """Python module run as `python -m MODULE --out DIR` when an input is missing."""
    out: str | None = None
    """The directory the prepare module writes (relative to the config file)."""


class LoraSection(_Strict):
    """`model.lora`: train a LoRA adapter on the frozen base instead of every weight
    (components/core/adapter.py; docs/algorithms.md, "LoRA")."""

    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    """Scale alpha / rank on the adapter's update."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input in the gradient passes only (the no-grad passes that give
    the old and reference logprobs run without it); the base's own dropout stays off."""
    target_modules: str | list[str] = "all-linear"
    """`all-linear` (every linear layer but the output head, MLP included, as "LoRA Without
    Regret" recommends) or a list of module names (`q_proj`, `v_proj`, ...)."""
    output_head: bool = False
    """Adapt the output head (`lm_head`) too. Worth it on small models, whose head is a large
    share of what RL changes (the demo: pass@1 0.58 with it against 0.48 without); the merge
    unties a head tied to the input embeddings first, so only the head changes."""

    @model_validator(mode="after")
    def _head_with_named_targets(self) -> LoraSection:
        if (self.output_head and isinstance(self.target_modules, str)
                and self.target_modules != "all-linear"):  # fmt: skip
            raise ValueError(
                f"output_head with target_modules {self.target_modules!r}: a pattern cannot be "
                "extended by the head; give the modules as a list or use all-linear"
            )
        return self


class ModelSection(_Strict):
    base: str
    """The base policy: an HF checkpoint directory (path or URI) or a Hugging Face Hub id
    (``Qwen/Qwen2.5-0.5B-Instruct``, ``hf://OWNER/NAME@REVISION``), copied into the run."""
    lora: LoraSection | None = None
    """Train a LoRA adapter instead of the full weights (null: full fine-tuning)."""


class EvalSetConfig(_Strict):
    name: str = "heldout"
    path: str
    """Eval dataset (verl format Parquet), path or URI."""
    n: int = Field(4, ge=1)
    """Samples per prompt."""
    max_prompts: int | None = Field(None, ge=1)
    """Evaluate only the first max_prompts prompts (None: all)."""
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int | None = Field(None, ge=1)
    """None: the generate section's max_new_tokens."""
    greedy: bool = False
    """Also decode one greedy response per prompt and report greedy_pass@1."""
    ks: list[int] = Field(default_factory=list)
    """Extra k values for this set's pass@k / maj@k (besides powers of two and evaluate.ks)."""
    data_sources: list[str] | None = None
    """Evaluate only prompts of these data sources (None: all)."""


class CurriculumSection(_Strict):
    """`data.sampler: curriculum`: draw prompts by their estimated pass rate (docs/algorithms.md,
    "Curriculum from pass rates")."""

    group_by: str | None = "data_source"
    """Column (or `extra_info.<field>`) whose pooled pass rate is the prior of a prompt not yet
    seen; null: a flat Beta(1, 1) prior."""
    prior_strength: float = Field(4.0, gt=0)
    """Pseudo-samples the group's pass rate counts for in a prompt's Beta prior."""
    success_threshold: float = 0.5
    """A sample succeeds when its reward is above this (evaluate's correctness rule)."""
    explore_share: float = Field(0.25, ge=0, le=1)
    """Share of each iteration's prompts drawn uniformly from prompts never sampled (while any)."""
    sharpness: float = Field(2.0, gt=0)
    """Weights are E[p(1-p)] ** sharpness under the prompt's Beta posterior."""
    retire_after: int = Field(2, ge=1)
    """Retire a prompt after this many consecutive draws of it in which every sample succeeded."""
    return_after: int = Field(10, ge=1)
    """A retired prompt may be drawn again this many iterations after it was retired."""


class DataSection(_Strict):
    train: str
    """Train dataset (verl format Parquet), path or URI."""
    eval: list[EvalSetConfig] = Field(default_factory=list)
    prompts_per_iteration: int = Field(64, ge=1)
    """Prompts drawn per iteration, walking a seeded permutation of the train set epoch by epoch."""
    sampler: Literal["uniform", "curriculum"] = "uniform"
    """`uniform`: the seeded permutation above; `curriculum`: by estimated pass rate."""
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)


class EnvironmentSection(_Strict):
    """`generate.environment`: an OpenEnv server (one session per trajectory)."""

    url: str
    """http(s)://HOST:PORT or ws(s)://HOST:PORT[/ws] of the environment server."""
    name: str = "env"
    """The tool name the policy calls it by; the call's arguments are the action's fields."""
    timeout_s: float = Field(60.0, gt=0)


class GenerateSection(_Strict):
    backend: Literal["transformers", "vllm"] = "transformers"
    n: int = Field(8, ge=1)
    """Samples per prompt (the GRPO group size)."""
    temperature: float = Field(1.0, ge=0.0)
    """0 means greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    """0 disables top-k."""
    max_new_tokens: int = Field(32, ge=1)
    max_prompt_tokens: int = Field(512, ge=1)
    stop: list[str] = Field(default_factory=list)
    """Stop strings; the response ends with the stop string included (one rule for all backends)."""
    stop_token_ids: list[int] = Field(default_factory=list)
    """Token ids that end a response like EOS (e.g. <|im_end|>)."""
    batch_size: int = Field(64, ge=1)
    """Most sequences decoded together by the transformers backend."""
    batch_tokens: int | None = Field(None, ge=1)
    """Token budget of one transformers batch: sequences x (longest prompt + max_new_tokens), so
    long prompts get smaller batches (None: batch_size alone)."""
    tools: list[str] = Field(default_factory=list)
    """Tools the policy may call (multi-turn rollouts, issue 21 in progress): `python` (built in:
    the code runs in the code verifier's sandbox) or `module:function` / `file.py:function` (a
    typed, documented callable). Empty: single-turn sampling."""
    max_turns: int = Field(4, ge=1)
    """With tools: the most policy turns per trajectory."""
    max_response_tokens: int | None = Field(None, ge=1)
    """With tools: the token budget of a whole trajectory, observations included (None:
    max_new_tokens x max_turns)."""
    environment: EnvironmentSection | None = None
    """A stateful environment over OpenEnv's WebSocket protocol that the policy acts in through
    tool calls named `environment.name` (docs/tools.md)."""
    rows_per_part: int = Field(4096, ge=1)
    """Rows per Parquet row group / flush, which bounds memory."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: float32 on CPU, bfloat16 on GPU."""
    num_shards: int = Field(1, ge=1)
    """The pipeline fans generation out over this many shards (dsl.ParallelFor)."""
    # vLLM-only knobs (ignored by the transformers backend).
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    max_model_len: int | None = None
    enable_prefix_caching: bool = True


class RewardComponent(_Strict):
    verifier: str
    """A built-in verifier (math, exact, code, format) or a plugin 'module:fn' / 'file.py:fn'."""
    weight: float = 1.0
    name: str | None = None
    """Key in the reward_components column (default: the verifier spec)."""

    @property
    def key(self) -> str:
        return self.name or self.verifier


class RewardSpec(_Strict):
    """A weighted sum of named reward components for one data_source."""

    components: list[RewardComponent] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_keys(self) -> RewardSpec:
        keys = [c.key for c in self.components]
        if len(set(keys)) != len(keys):
            raise ValueError(f"reward component names must be unique, got {keys}; set `name`")
        return self


class OverlongPenalty(_Strict):
    """DAPO's soft overlong penalty, added as the reward component 'overlong'."""

    max_length: int = Field(ge=1)
    """Response tokens at which the penalty reaches -penalty (usually generate.max_new_tokens)."""
    buffer: int = Field(ge=1)
    """The penalty ramps linearly over the last `buffer` tokens before max_length."""
    penalty: float = Field(1.0, ge=0.0)

    @field_validator("buffer")
    @classmethod
    def _buffer_within_max_length(cls, v: int, info: ValidationInfo) -> int:
        max_length = info.data.get("max_length")
        if max_length is not None and v > max_length:
            raise ValueError(f"must be at most max_length ({max_length}): the penalty ramps "
                             "over the last `buffer` tokens before max_length")  # fmt: skip
        return v


class VerifySection(_Strict):
    rewards: dict[str, str | RewardSpec] = Field(default_factory=dict)
    """data_source -> a verifier spec (built-in name or plugin 'package.module:function' /
    'path/to/file.py:function', verl or TRL signature), or {components: [{verifier, weight,
    name}, ...]} for a weighted sum."""
    overlong_penalty: OverlongPenalty | None = None
    env_reward_weight: float = 1.0
    """With generate.environment: the environment's reward (its step rewards summed over the
    trajectory, rollout column `env_reward`) enters the reward with this weight, as the
    component 'env'; 0 leaves it out."""
    timeout_s: float = Field(5.0, gt=0)
    """Per-sample time limit; a sample over it scores 0 and records the error."""
    num_workers: int = Field(1, ge=0)
    """Verifier worker processes (0: inline, no timeout enforcement; for debugging)."""
    max_error_fraction: float = Field(0.05, ge=0.0, le=1.0)
    """The stage fails when more than this share of samples errored or timed out."""
    num_shards: int = Field(1, ge=1)
    """The pipeline fans verification out over this many shards (dsl.ParallelFor)."""


class TrainSection(_Strict):
    zero_stage: int = Field(0, ge=0, le=3)
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Cosine floor as a fraction of lr."""
    advantage: str = "grpo"
    """Advantage estimator, by registry name (components.train.algorithms)."""
    advantage_options: dict[str, Any] = Field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    policy_loss_options: dict[str, Any] = Field(default_factory=dict)
    loss_agg: str = "token-mean"
    loss_agg_horizon: int | None = None
    """Constant horizon for 'seq-mean-token-sum-norm' (default: generate.max_new_tokens)."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer steps per PPO epoch: the iteration's rollouts are split into this many."""
    ppo_epochs: int = Field(1, ge=1)
    micro_batch_tokens: int = Field(4096, ge=1)
    """Token budget (prompt + response, padded) of one forward/backward micro-batch."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU, bfloat16 on GPU. bf16 runs at ZeRO >= 1 (fp32 masters and Adam
    moments are then saved per parameter; checkpoints hold the fp32 masters)."""
    processes: int | None = Field(None, ge=1)
    """Data-parallel processes per train node (None: one per visible GPU, one on CPU; on a
    cluster with nodes > 1, cluster.stages.train.accelerator_count)."""
    nodes: int = Field(1, ge=1)
    """Nodes the train step spans. 1: one pod (DeepSpeed over its GPUs). More: the train task
    submits a Kubeflow Trainer TrainJob (or a Training Operator PyTorchJob:
    cluster.train_job.api) of `nodes` pods x `processes` ranks under torchrun, waits for it and
    deletes it (docs/deploy.md); without a cluster, `nodes` torchrun agents on this machine meet
    over a loopback rendezvous."""
    max_staleness: int = Field(0, ge=0)
    """Bounded staleness k: generate of iteration i samples with checkpoint max(0, i - k), so
    it overlaps train of the k iterations before. 0 is on-policy. Train refuses rollouts staler
    than k; set rollout_correction (tis) to correct for the lag (docs/algorithms.md)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """KL penalty against the frozen base policy (checkpoint 00000); 0 disables it and the
    reference model is not loaded."""
    kl_estimator: str = "low_var_kl"
    """KL estimator by registry name: k1, k2, k3 / low_var_kl, ..."""
    kl_in_reward: bool = False
    """Fold coef x KL into the token-level reward instead of adding it to the loss."""
    kl_metric: bool = False
    """Record `train/kl_ref`, the KL of the policy to the base (kl_estimator, token mean over the
    iteration's rollouts, before the update), even with kl_coef 0. It loads the reference model
    (one more no-grad forward per iteration); with kl_coef > 0 it is always recorded."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (transformers' non-reentrant checkpointing): about a third more compute for activation memory
    that no longer grows with the layer count. The same gradients, so it is kept out of train's
    lineage: turning it on or off retrains nothing. Refused on a base whose config sets any
    dropout (some architectures apply it in the layers it puts in training mode)."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Entropy bonus: loss -= entropy_coef x entropy (same aggregation as the policy loss)."""
    rollout_correction: Literal["tis", "mis"] | None = None
    """Truncated (tis) or masked (mis) importance sampling from the rollout engine's recorded
    logprobs to the trainer's recomputed old logprobs."""
    rollout_correction_cap: float = Field(2.0, gt=0.0)
    rollout_correction_level: Literal["token", "sequence"] = "token"
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards all agree (they carry no GRPO signal); counted in metrics."""
    overlong_filter: bool = False
    """DAPO: mask responses truncated at max_new_tokens out of the loss."""
    void_turn_filter: bool = False
    """SimpleTIR (multi-turn): mask trajectories out of the loss that hold a void turn, a policy
    turn with neither a tool call nor an answer (`answer_pattern`); they still count in their
    group's advantages. Needs generate.tools or generate.environment."""
    answer_pattern: str = r"\\boxed\{"
    """With void_turn_filter: a regular expression that finds an answer in a policy turn."""
    forking_top_rho: float | None = Field(None, gt=0.0, le=1.0)
    """Train only on the top-rho fraction of response tokens by entropy ("Beyond the 80/20 Rule")."""
    noisy_reward: Literal["backward", "forward"] | None = None
    """Correct binary rewards for a noisy verifier with known error rates (arXiv 2510.00915)."""
    noisy_fp_rate: float = Field(0.0, ge=0.0, lt=1.0)
    noisy_fn_rate: float = Field(0.0, ge=0.0, lt=1.0)


class EvaluateSection(_Strict):
    ks: list[int] = Field(default_factory=list)
    """Extra k values for pass@k, beyond every power of two up to n."""
    bootstrap_resamples: int = Field(1000, ge=1)
    seed: int = 1234
    every: int = Field(1, ge=1)
    """Evaluate every `every`-th checkpoint (the base and the last are always evaluated)."""
    num_shards: int = Field(1, ge=1)
    """The pipeline fans evaluation sampling out over this many shards, then gathers metrics."""


DEFAULT_IMAGE_REPO = "ghcr.io/rlvr-project"
DEFAULT_IMAGE_TAG = "0.1.0"
GPU_STAGES = ("generate", "train", "evaluate")


class Toleration(_Strict):
    key: str
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class StagePlacement(_Strict):
    """Where and how one stage's pods run on the cluster."""

    image: str | None = None
    """Full image reference; default: <image_repo>/rlvr-<stage>:<image_tag>."""
    cpu_request: str | None = None
    cpu_limit: str | None = None
    memory_request: str | None = None
    memory_limit: str | None = None
    accelerator_type: str | None = None
    """e.g. nvidia.com/gpu; None: a CPU stage, no accelerator requested."""
    accelerator_count: int = Field(0, ge=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    shm_size: str | None = None
    """Size of the in-memory emptyDir mounted at /dev/shm (NCCL needs it on GPU stages)."""
    retries: int = Field(2, ge=0)
    backoff_duration: str = "30s"
    backoff_factor: float = Field(2.0, ge=1.0)
    backoff_max_duration: str = "600s"
    timeout_s: int | None = Field(None, ge=1)
    """Pod deadline per iteration: a worker serving a segment gets activeDeadlineSeconds =
    timeout_s x run.segment_iterations (a one-iteration task, timeout_s); None: no limit."""

    @model_validator(mode="after")
    def _accelerator_pairs(self) -> StagePlacement:
        if (self.accelerator_type is None) != (self.accelerator_count == 0):
            raise ValueError("accelerator_type and accelerator_count > 0 go together")
        return self


def _gpu_stage(pool: str, cpu: str, memory: str, timeout_s: int) -> StagePlacement:
    return StagePlacement(
        cpu_request=cpu,
        memory_request=memory,
        memory_limit=memory,
        accelerator_type="nvidia.com/gpu",
        accelerator_count=1,
        node_selector={"rlvr.io/pool": pool},
        tolerations=[Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        shm_size="16Gi",
        timeout_s=timeout_s,
    )


def _default_stages() -> dict[str, StagePlacement]:
    return {
        "generate": _gpu_stage("generate", "8", "64Gi", 6 * 3600),
        "train": _gpu_stage("train", "8", "128Gi", 12 * 3600),
        "evaluate": _gpu_stage("generate", "8", "64Gi", 6 * 3600),
        "verify": StagePlacement(
            cpu_request="8",
            cpu_limit="16",
            memory_request="16Gi",
            memory_limit="32Gi",
            node_selector={"rlvr.io/pool": "verify"},
            timeout_s=2 * 3600,
        ),
        "init": StagePlacement(
            cpu_request="1",
            memory_request="4Gi",
            node_selector={"rlvr.io/pool": "verify"},
            timeout_s=3600,
        ),
    }


#: environment variable <- key of the object store's Secret (cluster.object_store_secret)
OBJECT_STORE_SECRET_KEYS = {
    "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
}


#: the variable a multi-node train pod reads its resolved config from (components/train/jobspec)
NODE_CONFIG_ENV = "RLVR_CONFIG_JSON"
#: environment names a multi-node train pod gets from its controller (Kubeflow Trainer's PET_*
#: as a prefix), from torchrun, or from rlvr (components/train/jobspec.env)
RESERVED_NODE_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", NODE_CONFIG_ENV, "PYTHONUNBUFFERED",
    *OBJECT_STORE_SECRET_KEYS, "AWS_ENDPOINT_URL", "HF_TOKEN",
})  # fmt: skip


class TrainJobSection(_Strict):
    """How a multi-node train step (train.nodes > 1) runs on the cluster."""

    api: Literal["trainer", "training-operator"] = "trainer"
    """trainer: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on `runtime`;
    training-operator: a Kubeflow Training Operator v1 PyTorchJob (kubeflow.org/v1)."""
    runtime: str = Field("rlvr-train", min_length=1)
    """The ClusterTrainingRuntime a TrainJob refers to (manifests/overlays/multi-node)."""
    namespace: str | None = None
    """Where the job is created; None: the namespace of the pipeline pod that submits it."""
    poll_s: float = Field(5.0, gt=0)
    """How often the submitting task reads the job's status."""
    schedule_timeout_s: float | None = Field(1800.0, gt=0)
    """How long a pod of the job may stay Pending (no node with free GPUs, its image still
    pulling) before the step fails naming the pods and the scheduler's reason; at most
    rendezvous_timeout_s, so that this, not node 0's rendezvous, reports a node that never came.
    None: no limit (with a pod-level gang scheduler, Volcano or coscheduling, whose queued pods
    stay Pending). A job with no pod at all counts as Pending (no controller running, a missing
    runtime), unless a queue (Kueue) holds it suspended."""
    rendezvous_timeout_s: int = Field(1800, ge=60)
    """How long node 0's rendezvous waits for every node to join (torchrun's static rendezvous
    waits 600 s by default, less than a fresh node's pull of a CUDA image can take)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the node pods: the interconnect's NCCL settings, e.g.
    NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG (docs/deploy.md). Never a secret. The names the
    job controller, torchrun and rlvr set themselves (PET_*, RANK, MASTER_ADDR, ..., the config
    and credential variables) are refused: a second value would shadow theirs."""

    @field_validator("env")
    @classmethod
    def _env_leaves_the_launchers_alone(cls, v: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in v if k.startswith("PET_") or k in RESERVED_NODE_ENV)
        if taken:
            raise ValueError(
                f"{', '.join(taken)}: set by the job controller, torchrun or rlvr on every node "
                "pod (the rendezvous, the config, the object store's credentials); remove "
                "them (train.nodes and train.processes set the topology, cluster.* the rest)"
            )
        return v


class ClusterSection(_Strict):
    """Where stages run on Kubernetes (the local runner ignores all of it)."""

    image_repo: str = DEFAULT_IMAGE_REPO
    image_tag: str = DEFAULT_IMAGE_TAG
    """An integer tag (7) becomes "7"; a decimal one must be quoted ("1.10"), since YAML would
    read 1.10 as the number 1.1."""
    images: dict[str, str] = Field(default_factory=dict)
    """Per-stage image overrides (generate, verify, train, evaluate); default REPO/rlvr-STAGE:TAG."""
    stages: dict[str, StagePlacement] = Field(default_factory=_default_stages)
    """Per-stage resources, accelerators, node pools, retries and timeouts."""
    object_store_secret: str | None = "rlvr-object-store"
    """Kubernetes Secret whose AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY become the stages' env."""
    hf_token_secret: str | None = None
    """Kubernetes Secret whose HF_TOKEN key becomes the stages' env (Hub inputs that are
    private or gated); referenced by name, its value never enters the compiled pipeline."""
    defaults_config_map: str | None = "rlvr-defaults"
    """ConfigMap (manifests/base) whose AWS_ENDPOINT_URL becomes the stages' env."""
    run_as_user: int | None = 10001
    """Pod security context: the images' non-root uid/gid."""
    service_account: str | None = "rlvr-pipeline-runner"
    """Service account the pipeline's pods run as (manifests/base)."""
    train_job: TrainJobSection = Field(default_factory=TrainJobSection)
    """The job a multi-node train step (train.nodes > 1) submits."""
    kfp_api: str = "http://ml-pipeline.kubeflow.svc.cluster.local:8888"
    """The KFP API as seen from inside the cluster: the last task of a segment submits the next
    segment there, with the service account's token (KF_PIPELINES_SA_TOKEN_PATH)."""

    @field_validator("image_tag", mode="before")
    @classmethod
    def _tag_as_text(cls, v: Any) -> Any:
        if isinstance(v, float):
            raise ValueError(f'image_tag {v!r} was read as a number; quote it, e.g. "1.10"')
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("stages", mode="before")
    @classmethod
    def _merge_with_defaults(cls, v: Any) -> Any:
        """A stage's settings in config override its defaults key by key (a deep merge), so
        `--set cluster.stages.train.accelerator_count=8` keeps the train pool's selectors."""
        if not isinstance(v, dict):
            return v
        unknown = sorted(set(v) - {"init", "generate", "verify", "train", "evaluate"})
        if unknown:
            raise ValueError(
                f"unknown stage(s) {unknown}; valid: init, generate, verify, train, evaluate"
            )
        merged = {k: d.model_dump() for k, d in _default_stages().items()}
        for stage, values in v.items():
            values = (
                values.model_dump(exclude_unset=True) if isinstance(values, BaseModel) else values
            )
            merged[stage] = {**merged[stage], **(values or {})}
        return merged

    def image(self, stage: str) -> str:
        placement = self.stages.get(stage)
        if placement is not None and placement.image:
            return placement.image
        base = "train" if stage == "init" else stage
        return self.images.get(base, f"{self.image_repo}/rlvr-{base}:{self.image_tag}")


class TrackingSection(_Strict):
    """Where each stage logs its figures (components/core/tracking.py)."""

    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"]
    )
    """TensorBoard event files go into the run (`<run>/tensorboard/<task>/`), no server needed."""
    mlflow_tracking_uri: str | None = None
    """Default: the MLFLOW_TRACKING_URI environment variable, else MLflow's own default."""
    mlflow_experiment: str = "rlvr"
    wandb_project: str = "rlvr"
    wandb_entity: str | None = None
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """Default: W&B's own (the WANDB_MODE environment variable, else online)."""


class RunConfig(_Strict):
    run: RunSection = Field(default_factory=RunSection)
    prepare: PrepareSection | None = None
    model: ModelSection
    data: DataSection
    generate: GenerateSection = Field(default_factory=GenerateSection)
    verify: VerifySection = Field(default_factory=VerifySection)
    train: TrainSection = Field(default_factory=TrainSection)
    evaluate: EvaluateSection = Field(default_factory=EvaluateSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        names = [e.name for e in self.data.eval]
        if len(set(names)) != len(names):
            raise ValueError(f"data.eval names must be unique, got {names}")
        if self.train.void_turn_filter and not (self.generate.tools or self.generate.environment):
            raise ValueError("train.void_turn_filter drops multi-turn trajectories with a void "
                             "turn; set generate.tools (or generate.environment), or turn it off")  # fmt: skip
        return self

    @field_validator("train")
    @classmethod
    def _answer_pattern(cls, t: TrainSection) -> TrainSection:
        try:
            re.compile(t.answer_pattern)
        except re.error as e:
            raise ValueError(f"train.answer_pattern {t.answer_pattern!r} is no regular "
                             f"expression ({e}); fix it") from None  # fmt: skip
        return t

    @property
    def run_id(self) -> str:
        if not self.run.run_id:
            raise ConfigError(
                "run.run_id is not set; pass --run-id or set run.run_id in the config"
            )
        return self.run.run_id

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.model_validate_json(text)

    def to_yaml(self) -> str:
        return yaml.safe_dump(json.loads(self.to_json()), sort_keys=False)


def code_stages(cfg: RunConfig) -> tuple[str, ...]:
    """The stages that run model-written code, whose pods carry the `rlvr.dev/runs-code` label
    (the code-sandbox overlay's seccomp profile and egress policy) and whose local containers get
    the sandbox's seccomp profile: verify and evaluate always (the code verifier), generate too
    when the policy has tools (the python tool runs its code in the same sandbox)."""
    return ("verify", "evaluate") + (("generate",) if cfg.generate.tools else ())


def unused_keys(cfg: RunConfig) -> dict[str, set[str]]:
    """Per section, the keys of features this run does not use. Stages leave them out of their
    lineage, so a run that does not use a feature keeps the lineage (and its committed outputs
    stay up to date) it had before the feature existed."""
    multi = bool(cfg.generate.tools or cfg.generate.environment)
    return {
        "generate": set()
        if multi
        else {"tools", "max_turns", "max_response_tokens", "environment"},
        "train": (set() if cfg.train.void_turn_filter else {"void_turn_filter", "answer_pattern"})
        | (set() if cfg.train.nodes > 1 else {"nodes"}),
        "verify": set() if cfg.generate.environment else {"env_reward_weight"},
    }


def _section_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the section holding ``loc``'s last part accepts (empty when it is not a
    section of known keys): walks RunConfig's fields, through lists and optional sections."""
    import typing

    model: Any = RunConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an item of a list: its model was found with the list's field
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        found = None
        stack = [field.annotation]
        while stack:  # the first model class inside X | None, list[X], ...
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                found = t
                break
            stack.extend(typing.get_args(t))
        if found is None:
            return []
        model = found
    return list(getattr(model, "model_fields", {}))


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(str(loc[-1]), _section_keys(loc), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(
                f"  {key}: unknown key (value {e['input']!r}); {_did_you_mean(e['loc'])}"
                "remove it or fix its spelling"
            )
        elif e["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            lines.append(f"  {key}: got {e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)


def _parse_value(text: str) -> Any:
    """Parse an override value as YAML, so `--set train.lr=1e-4` gives a float."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to a raw config mapping (in place) and return it.

    A numeric part indexes a list (`data.eval.0.n=8`); the value is YAML, so a whole list or
    mapping can be given inline (`data.eval=[{name: x, path: y.parquet}]`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        key, _, value = item.partition("=")
        parts = key.strip().split(".")
        node: Any = raw
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not (p.isascii() and p.isdigit()):
                    raise ConfigError(
                        f"override {item!r}: {'.'.join(parts[:i])} is a list; address an item by "
                        f"its index from 0 ({'.'.join(parts[:i])}.0...=...) or give the whole "
                        f"list as YAML ({'.'.join(parts[:i])}=[...])"
                    )
                idx = int(p)
                if idx >= len(node):
                    raise ConfigError(
                        f"override {item!r}: {'.'.join(parts[:i])} has {len(node)} item(s), "
                        f"no index {idx}; give the whole list as YAML ({'.'.join(parts[:i])}=[...])"
                    )
                if last:
                    node[idx] = _parse_value(value)
                else:
                    node = node[idx]
                continue
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[:i])!r} is not a section; give its "
                    f"value as YAML ({'.'.join(parts[:i])}={{...}} or =[...])"
                )
            if p.isascii() and p.isdigit() and p not in node:
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[:i]) or 'the config'} has no list here "
                    f"to index; give the value as YAML ({'.'.join(parts[:i])}=[...])"
                )
            if last:
                node[p] = _parse_value(value)
            else:
                node = node.setdefault(p, {})
    return raw


def _is_uri(s: str) -> bool:
    return "://" in s and not s.startswith("file://")


def _resolve(
    path: str, base: Path, *, hub: str | None = None, prepare_out: str | None = None
) -> str:
    """A local path made absolute (relative to the config file), a URI as is, and, for
    ``hub="model"`` / ``"dataset"``, a bare Hugging Face Hub id (``Qwen/Qwen2.5-0.5B``,
    ``owner/name/train.parquet``) as ``hf://...`` when no local path of that name exists."""
    if _is_uri(path):
        return path
    if path.startswith("file://"):
        path = path[len("file://") :]
    p = Path(path).expanduser()
    local = p if p.is_absolute() else (base / p).resolve()
    # a Hub id only where nothing local could be meant: no such path, not even its first
    # directory (a typo or an input a prepare step has yet to build stays a local path),
    # and not under the prepare step's output
    if (
        hub is not None
        and not local.exists()
        and not (base / p.parts[0]).exists()
        and not (prepare_out and str(local).startswith(prepare_out.rstrip("/") + "/"))
    ):
        from components.core.hub import bare_to_spec

        spec = bare_to_spec(path, dataset=hub == "dataset")
        if spec is not None:
            return spec
    return str(local)


def load_config(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    run_id: str | None = None,
    iterations: int | None = None,
) -> RunConfig:
    """Read, override, validate and resolve a run config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    apply_overrides(raw, list(overrides or []))
    if run_id is not None or iterations is not None:
        raw["run"] = raw.get("run") or {}
    if run_id is not None:
        raw["run"]["run_id"] = run_id
    if iterations is not None:
        raw["run"]["iterations"] = iterations
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e, str(path))) from None
    base = path.resolve().parent
    if cfg.prepare is not None and cfg.prepare.out is not None:
        cfg.prepare.out = _resolve(cfg.prepare.out, base)
    out = cfg.prepare.out if cfg.prepare is not None else None
    cfg.model.base = _resolve(cfg.model.base, base, hub="model", prepare_out=out)
    cfg.data.train = _resolve(cfg.data.train, base, hub="dataset", prepare_out=out)
    for ev in cfg.data.eval:
        ev.path = _resolve(ev.path, base, hub="dataset", prepare_out=out)
    cfg.run.store = _resolve(cfg.run.store, Path.cwd())
    if cfg.run.run_id is None:
        cfg.run.run_id = base.name
    return cfg


def from_pipeline(config_json: str, run_id: str = "") -> RunConfig:
    """The config a pipeline component received (its run id may be a separate parameter)."""
    cfg = RunConfig.from_json(config_json)
    if run_id:
        cfg.run.run_id = run_id
    return cfg


def effective_config(
    config_json: str,
    run_id: str = "",
    store: str = "",
    base_checkpoint: str = "",
    eval_sets: str = "",
) -> RunConfig:
    """The config a pipeline task runs with: the compiled-in config plus the run-time pipeline
    parameters (set in the KFP UI or at submit); empty parameters change nothing. `eval_sets` is a
    JSON list of eval-set objects ({name, path, n, ...})."""
    cfg = from_pipeline(config_json, run_id)
    try:
        if store:
            cfg.run.store = store
        if base_checkpoint:
            cfg.model.base = base_checkpoint
        if eval_sets:
            cfg.data.eval = [EvalSetConfig.model_validate(e) for e in json.loads(eval_sets)]
        return RunConfig.model_validate_json(cfg.to_json())
    except (ValidationError, ValueError) as e:
        raise ConfigError(f"invalid pipeline parameter: {e}") from None
