"""Kubernetes placement for pipeline tasks, all from config (`cluster.stages.<stage>`).

The pipeline functions only wire tasks; this module adds, per stage: the image, CPU/memory
requests and limits, the accelerator type and count, node selectors and tolerations for its node
pool, an in-memory emptyDir at /dev/shm (NCCL), retries with backoff, a timeout, object-store
credentials from a Kubernetes Secret (by reference: no secret value ever enters the compiled
YAML), and caching off (stages are idempotent against the object store; KFP's cache could only
return a stale result).
"""

from kfp import dsl, kubernetes

from components.core.config import RunConfig
from components.core.config_cluster import OBJECT_STORE_SECRET_KEYS, ClusterSection, StagePlacement

# the pods of stages that run model-written code (components.core.config.code_stages) get this
# label, which the code-sandbox overlay matches (the seccomp profile that lets the sandbox build
# itself, narrow egress)
RUNS_CODE_LABEL = ("rlvr.dev/runs-code", "true")
#: train.handoff.channel: broadcast: train's and generate's pods get this label (value
#: `sender` / `receiver`), which the weight-channel overlay's NetworkPolicy admits to each
#: other; the sender learns the address it publishes from POD_IP (the downward API)
WEIGHT_CHANNEL_LABEL = "rlvr.dev/weight-channel"
#: what a task that submits a multi-node job gets on top of the job's own deadline: the time to
#: clear an earlier submission's leftovers (components/train/jobs.py waits up to 600 s), create
#: the job, and read its end
JOB_DEADLINE_MARGIN_S = 900


def submits_job(cfg: RunConfig, stage: str) -> bool:
    """Whether the task of `stage` submits a multi-node job instead of running the stage in its
    own pod: train with train.nodes > 1 (components/train/jobs.py)."""
    return stage == "train" and cfg.train.nodes > 1


def place(
    task: dsl.PipelineTask,
    stage: str,
    cluster: ClusterSection,
    *,
    iterations: int = 1,
    runs_code: bool = False,
    submits_job: bool = False,
    channel: str | None = None,
) -> dsl.PipelineTask:
    """Placement of one task; `iterations` is how many iterations it serves (a segment's
    worker: `run.segment_iterations`), which scales its pod deadline; `runs_code`: the stage
    runs model-written code (`code_stages`); `submits_job`: the task only submits and follows a
    multi-node job, which carries the stage's own placement, so its pod gets init's resources
    and pool (no GPU), but keeps the stage's retries (its peers wait for them:
    components.core.warm.retry_grace_s) and the stage's deadline plus a margin, so the job's own
    deadline (the same) fires first and its reason reaches the task's log. `channel`: the
    task's end of the weight channel (`sender`, `receiver`) where the run uses it."""
    task.set_caching_options(False)
    _labels(task, runs_code, channel)
    _resources(task, cluster.stages["init" if submits_job else stage])
    own = cluster.stages[stage]
    if own.retries:
        task.set_retry(
            num_retries=own.retries,
            backoff_duration=own.backoff_duration,
            backoff_factor=own.backoff_factor,
            backoff_max_duration=own.backoff_max_duration,
        )
    if own.timeout_s:
        margin_s = JOB_DEADLINE_MARGIN_S if submits_job else 0
        kubernetes.set_timeout(task, own.timeout_s * iterations + margin_s)
    _credentials_and_identity(task, cluster)
    return task


def _labels(task: dsl.PipelineTask, runs_code: bool, channel: str | None) -> None:
    """The pod labels network policies select on (manifests/), and the pod's own IP for the
    weight channel's sender, which publishes it in the store for its receivers."""
    if runs_code:
        kubernetes.add_pod_label(task, *RUNS_CODE_LABEL)
    if channel is not None:
        kubernetes.add_pod_label(task, WEIGHT_CHANNEL_LABEL, channel)
        if channel == "sender":
            kubernetes.use_field_path_as_env(task, env_name="POD_IP", field_path="status.podIP")


def _resources(task: dsl.PipelineTask, p: StagePlacement) -> None:
    """CPU, memory and accelerators, the node pool (selector and tolerations), and /dev/shm."""
    if p.cpu_request:
        task.set_cpu_request(p.cpu_request)
    if p.cpu_limit:
        task.set_cpu_limit(p.cpu_limit)
    if p.memory_request:
        task.set_memory_request(p.memory_request)
    if p.memory_limit:
        task.set_memory_limit(p.memory_limit)
    if p.accelerator_type:
        task.set_accelerator_type(p.accelerator_type)
        task.set_accelerator_limit(p.accelerator_count)
    for key, value in sorted(p.node_selector.items()):
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for t in p.tolerations:
        kubernetes.add_toleration(
            task, key=t.key, operator=t.operator, value=t.value, effect=t.effect
        )
    if p.shm_size:
        kubernetes.empty_dir_mount(
            task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=p.shm_size
        )


def _credentials_and_identity(task: dsl.PipelineTask, cluster: ClusterSection) -> None:
    """The object store's and the Hub's credentials from their secrets, the cluster's default
    endpoint from its config map, and the uid the pod runs as."""
    if cluster.object_store_secret:
        kubernetes.use_secret_as_env(
            task,
            secret_name=cluster.object_store_secret,
            secret_key_to_env=OBJECT_STORE_SECRET_KEYS,
        )
    if cluster.hf_token_secret:
        kubernetes.use_secret_as_env(
            task, secret_name=cluster.hf_token_secret, secret_key_to_env={"HF_TOKEN": "HF_TOKEN"}
        )
    if cluster.defaults_config_map:
        kubernetes.use_config_map_as_env(
            task,
            config_map_name=cluster.defaults_config_map,
            config_map_key_to_env={"AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL"},
            optional=True,
        )
    if cluster.run_as_user is not None:
        kubernetes.set_security_context(
            task,
            run_as_user=cluster.run_as_user,
            run_as_group=cluster.run_as_user,
            run_as_non_root=True,
        )
