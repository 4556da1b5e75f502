"""The Kubernetes objects a multi-node train step submits: a Kubeflow Trainer v2 TrainJob, or a
Kubeflow Training Operator v1 PyTorchJob (`cluster.train_job.api`). Pure functions of the config.

Both run the train image on `train.nodes` pods x `processes` ranks, each pod running
components/train/node.py, with the train stage's placement (cluster.stages.train): its node
pool's selectors and tolerations, its resources per node, an in-memory /dev/shm, the object
store's and Hugging Face's credentials by Secret reference (no secret value enters a spec), the
pipeline's service account and non-root security context, and a deadline of the stage's
per-iteration timeout times the iterations the job serves. The resolved config travels in the
RLVR_CONFIG_JSON variable, so every pod runs exactly the config the pipeline task resolved.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from components.core.config import RunConfig
from components.core.config_cluster import NODE_CONFIG_ENV, OBJECT_STORE_SECRET_KEYS, StagePlacement

CONFIG_ENV = NODE_CONFIG_ENV
#: what every pod runs: components/train/node.py on the config in CONFIG_ENV
NODE_COMMAND = ["python", "-m", "components.train.node", f"env:{CONFIG_ENV}"]
#: the field manager / patch owner the TrainJob's runtime patch is recorded under
MANAGER = "rlvr.dev/train-launcher"

TRAINER = ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
TRAINING_OPERATOR = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
#: Kubeflow Trainer's torch runtimes name the node job and its container "node"; the Training
#: Operator requires the container "pytorch"
NODE_CONTAINER = {"trainer": "node", "training-operator": "pytorch"}
SHM_VOLUME = "dshm"
#: label of a job and its pods naming the step they serve (step_key)
STEP_LABEL = "rlvr.dev/train-step"


def job_kind(cfg: RunConfig) -> tuple[str, str, str, str]:
    """(group, version, plural, kind) of the job this config submits."""
    return TRAINER if cfg.cluster.train_job.api == "trainer" else TRAINING_OPERATOR


def processes_per_node(cfg: RunConfig) -> int:
    """Ranks per node: train.processes, else the train pool's GPUs per node, else 1 (CPU)."""
    p = cfg.cluster.stages["train"]
    return cfg.train.processes or p.accelerator_count or 1


def step_key(cfg: RunConfig, stage_args: list[str]) -> str:
    """The same for every submission of one step (run, segment or iteration, attempt): the
    STEP_LABEL value by which a retried task finds what an earlier submission left."""
    return hashlib.sha256("\0".join([cfg.run_id, *stage_args]).encode()).hexdigest()[:16]


def job_name(cfg: RunConfig, stage_args: list[str], suffix: str) -> str:
    """A DNS-1035 name of at most 40 characters (JobSet, service and pod names derive from it)
    for one submission: the run, the step and a `suffix` of its own. Never reused: the Trainer
    finds a TrainJob's JobSet by name alone, so a new job of an old name could take the old
    JobSet's status and pods while they are being deleted."""
    slug = re.sub(r"[^a-z0-9-]+", "-", cfg.run_id.lower()).strip("-")[:14].strip("-") or "run"
    return f"rlvr-train-{slug}-{step_key(cfg, stage_args)[:8]}-{suffix}"


def labels(cfg: RunConfig, stage_args: list[str]) -> dict[str, str]:
    """The job's and its pods' labels: the run, and the step (STEP_LABEL)."""
    run = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.run_id)[:63].strip("-_.") or "run"
    return {
        "app.kubernetes.io/part-of": "rlvr",
        "app.kubernetes.io/component": "train",
        "rlvr.dev/run-id": run,
        STEP_LABEL: step_key(cfg, stage_args),
    }


def deadline_s(cfg: RunConfig, iterations: int) -> int | None:
    timeout = cfg.cluster.stages["train"].timeout_s
    return timeout * iterations if timeout else None


def env(cfg: RunConfig) -> list[dict[str, Any]]:
    """The node container's environment: the resolved config, credentials by reference only."""
    c = cfg.cluster
    out: list[dict[str, Any]] = [
        {"name": CONFIG_ENV, "value": cfg.to_json()},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if c.object_store_secret:
        out += [
            {
                "name": var,
                "valueFrom": {"secretKeyRef": {"name": c.object_store_secret, "key": key}},
            }
            for var, key in OBJECT_STORE_SECRET_KEYS.items()
        ]
    if c.hf_token_secret:
        out.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": c.hf_token_secret, "key": "HF_TOKEN"}},
            }
        )
    if c.defaults_config_map:
        out.append(
            {
                "name": "AWS_ENDPOINT_URL",
                "valueFrom": {
                    "configMapKeyRef": {
                        "name": c.defaults_config_map,
                        "key": "AWS_ENDPOINT_URL",
                        "optional": True,
                    }
                },
            }
        )
    out += [{"name": k, "value": v} for k, v in sorted(c.train_job.env.items())]
    return out


def resources(p: StagePlacement, per_node: int) -> dict[str, dict[str, str]]:
    requests = {"cpu": p.cpu_request, "memory": p.memory_request}
    limits = {"cpu": p.cpu_limit, "memory": p.memory_limit}
    if p.accelerator_type:
        limits[p.accelerator_type] = str(per_node)
    out = {
        "requests": {k: v for k, v in requests.items() if v},
        "limits": {k: v for k, v in limits.items() if v},
    }
    return {k: v for k, v in out.items() if v}


def _pod_spec_fields(cfg: RunConfig) -> dict[str, Any]:
    """Scheduling and security fields of a node pod (what the train pool's placement sets)."""
    c, p = cfg.cluster, cfg.cluster.stages["train"]
    spec: dict[str, Any] = {}
    if p.node_selector:
        spec["nodeSelector"] = dict(sorted(p.node_selector.items()))
    if p.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in p.tolerations]
    if p.shm_size:
        spec["volumes"] = [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": p.shm_size}}
        ]
    if c.run_as_user is not None:
        spec["securityContext"] = {
            "runAsUser": c.run_as_user,
            "runAsGroup": c.run_as_user,
            "runAsNonRoot": True,
        }
    if c.service_account:
        spec["serviceAccountName"] = c.service_account
    return spec


def _shm_mounts(cfg: RunConfig) -> list[dict[str, str]]:
    return (
        [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
        if cfg.cluster.stages["train"].shm_size
        else []
    )


def _metadata(
    cfg: RunConfig, stage_args: list[str], name: str, namespace: str, owner: dict | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels(cfg, stage_args)}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def train_job(
    cfg: RunConfig,
    stage_args: list[str],
    *,
    name: str,
    namespace: str,
    iterations: int,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The TrainJob (Kubeflow Trainer v2) on the `cluster.train_job.runtime` runtime. Placement
    goes in as a runtime patch of the runtime's `node` job, the only place Trainer v2 takes
    node selectors, tolerations, volumes and the pod's security context from a TrainJob."""
    group, version, _, kind = TRAINER
    per_node = processes_per_node(cfg)
    container = NODE_CONTAINER["trainer"]
    trainer: dict[str, Any] = {
        "image": cfg.cluster.image("train"),
        "command": [*NODE_COMMAND, "--run-id", cfg.run_id, *stage_args],
        "env": env(cfg),
        "numNodes": cfg.train.nodes,
        "numProcPerNode": per_node,
    }
    res = resources(cfg.cluster.stages["train"], per_node)
    if res:
        trainer["resourcesPerNode"] = res
    pod_spec = _pod_spec_fields(cfg)
    if _shm_mounts(cfg):
        pod_spec["containers"] = [{"name": container, "volumeMounts": _shm_mounts(cfg)}]
    pod = {"metadata": {"labels": labels(cfg, stage_args)}, "spec": pod_spec}
    spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": group,
            "kind": "ClusterTrainingRuntime",
            "name": cfg.cluster.train_job.runtime,
        },
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {"name": container, "template": {"spec": {"template": pod}}}
                            ],
                        }
                    }
                },
            }
        ],
    }
    deadline = deadline_s(cfg, iterations)
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": _metadata(cfg, stage_args, name, namespace, owner),
        "spec": spec,
    }


def pytorch_job(
    cfg: RunConfig,
    stage_args: list[str],
    *,
    name: str,
    namespace: str,
    iterations: int,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The PyTorchJob (Kubeflow Training Operator v1): one Master and nodes - 1 Workers on the
    same pod template. The operator's RANK is the pod's index, which node.py takes as the
    node's rank; nothing restarts a failed pod (the pipeline task's retry reruns the step)."""
    group, version, _, kind = TRAINING_OPERATOR
    per_node = processes_per_node(cfg)
    container: dict[str, Any] = {
        "name": NODE_CONTAINER["training-operator"],
        "image": cfg.cluster.image("train"),
        "command": [*NODE_COMMAND, "--run-id", cfg.run_id, *stage_args],
        "env": env(cfg),
    }
    res = resources(cfg.cluster.stages["train"], per_node)
    if res:
        container["resources"] = res
    if _shm_mounts(cfg):
        container["volumeMounts"] = _shm_mounts(cfg)
    template = {
        "metadata": {"labels": labels(cfg, stage_args)},
        "spec": {"containers": [container], **_pod_spec_fields(cfg)},
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if cfg.train.nodes > 1:
        replicas["Worker"] = {
            "replicas": cfg.train.nodes - 1,
            "restartPolicy": "Never",
            "template": template,
        }
    run_policy: dict[str, Any] = {"backoffLimit": 0, "cleanPodPolicy": "None"}
    deadline = deadline_s(cfg, iterations)
    if deadline:
        run_policy["activeDeadlineSeconds"] = deadline
    spec = {"nprocPerNode": str(per_node), "runPolicy": run_policy, "pytorchReplicaSpecs": replicas}
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": _metadata(cfg, stage_args, name, namespace, owner),
        "spec": spec,
    }


def job_spec(cfg: RunConfig, stage_args: list[str], **kwargs: Any) -> dict[str, Any]:
    """The job `cluster.train_job.api` names."""
    build = train_job if cfg.cluster.train_job.api == "trainer" else pytorch_job
    return build(cfg, stage_args, **kwargs)
