"""The `cluster` section of a run's config: images, node pools, GPUs, tolerations, timeouts and
retries per stage, the multi-node train job, and the names a run's pods must not be given."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from components.core.config_base import Strict
from components.core.stages import STEPS

DEFAULT_IMAGE_REPO = "ghcr.io/rlvr-project"
DEFAULT_IMAGE_TAG = "0.1.0"
GPU_STAGES = ("generate", "train", "evaluate")


class Toleration(Strict):
    key: str
    """The taint's key."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """`Equal` (key and value) or `Exists` (key alone)."""
    value: str | None = None
    """The taint's value (with `Equal`)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated (null: every effect)."""


#: Kubernetes quantities as KFP's task setters accept them (kfp.dsl.PipelineTask.set_cpu_limit /
#: set_memory_limit): checked when the config loads, not when a pipeline compiles.
_CPU = re.compile(r"[0-9]*\.?[0-9]+m?")
_MEMORY = re.compile(r"[0-9]*\.?[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki|k)?")


class StagePlacement(Strict):
    """Where and how one stage's pods run on the cluster."""

    image: str | None = None
    """Full image reference; default: <image_repo>/rlvr-<stage>:<image_tag>."""
    cpu_request: str | None = None
    """CPU request (a Kubernetes quantity: `8`, `500m`)."""
    cpu_limit: str | None = None
    """CPU limit (null: none)."""
    memory_request: str | None = None
    """Memory request (`64Gi`)."""
    memory_limit: str | None = None
    """Memory limit (null: none)."""
    accelerator_type: str | None = None
    """e.g. nvidia.com/gpu; None: a CPU stage, no accelerator requested."""
    accelerator_count: int = Field(0, ge=0)
    """GPUs per pod."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pod must land on (its node pool)."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pod tolerates (a GPU pool's)."""
    shm_size: str | None = None
    """Size of the in-memory emptyDir mounted at /dev/shm (NCCL needs it on GPU stages)."""
    retries: int = Field(2, ge=0)
    """KFP retries of a failed task."""
    backoff_duration: str = "30s"
    """The first retry's delay."""
    backoff_factor: float = Field(2.0, ge=1.0)
    """Each next retry's delay, as a multiple of the one before."""
    backoff_max_duration: str = "600s"
    """The longest retry delay."""
    timeout_s: int | None = Field(None, ge=1)
    """Pod deadline per iteration: a worker serving a segment gets activeDeadlineSeconds =
    timeout_s x run.segment_iterations (a one-iteration task, timeout_s); None: no limit."""

    @field_validator("cpu_request", "cpu_limit", mode="before")
    @classmethod
    def _cpu_quantity(cls, v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool):
            v = str(v)  # `cpu_limit: 0.5` in YAML
        if isinstance(v, str) and not _CPU.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a CPU quantity: cores ('8', '0.5') or millicores ('500m')"
            )
        return v

    @field_validator("memory_request", "memory_limit", "shm_size", mode="before")
    @classmethod
    def _memory_quantity(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # bytes
        if isinstance(v, str) and not _MEMORY.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a memory quantity: a number with an optional unit (E, P, T, G, M, K "
                "or k, or Ei, Pi, Ti, Gi, Mi, Ki), e.g. '64Gi'"
            )
        return v

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
RESERVED_NODE_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        NODE_CONFIG_ENV,
        "PYTHONUNBUFFERED",
        *OBJECT_STORE_SECRET_KEYS,
        "AWS_ENDPOINT_URL",
        "HF_TOKEN",
    }
)


class TrainJobSection(Strict):
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


class ClusterSection(Strict):
    """Where stages run on Kubernetes (the local runner ignores all of it)."""

    image_repo: str = DEFAULT_IMAGE_REPO
    """The registry and path of the stage images: <image_repo>/rlvr-<stage>:<image_tag>."""
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
        unknown = sorted(set(v) - set(STEPS))
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
