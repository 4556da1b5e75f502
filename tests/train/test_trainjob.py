"""The multi-node train step on a cluster, without one: the TrainJob / PyTorchJob the train task
submits, field by field and strictly valid against the released Kubeflow API models, and the
compiled pipeline's train task. The loop that submits, follows and deletes the job is
tests/train/test_trainjob_follow.py."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from components.core.config import ConfigError, RunConfig, load_config
from components.core.config_cluster import RESERVED_NODE_ENV
from components.train import jobspec
from tests.support.cluster import SEGMENT_ARGS, cluster_cfg
from tests.support.crd import assert_valid

OWNER = {
    "apiVersion": "v1",
    "kind": "Pod",
    "name": "task-pod",
    "uid": "u-1",
    "blockOwnerDeletion": False,
    "controller": False,
}

ENV_REFS = [
    {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "rlvr-object-store", "key": "AWS_ACCESS_KEY_ID"}},
    },
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {
            "secretKeyRef": {"name": "rlvr-object-store", "key": "AWS_SECRET_ACCESS_KEY"}
        },
    },
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}},
    {
        "name": "AWS_ENDPOINT_URL",
        "valueFrom": {
            "configMapKeyRef": {
                "name": "rlvr-defaults",
                "key": "AWS_ENDPOINT_URL",
                "optional": True,
            }
        },
    },
    {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
]
LABELS = {
    "app.kubernetes.io/part-of": "rlvr",
    "app.kubernetes.io/component": "train",
    "rlvr.dev/run-id": "Demo_Run.7",
}


def labels(cfg: RunConfig, args: list[str]) -> dict[str, str]:
    """LABELS and the step's own label (one value per run, segment or iteration, attempt)."""
    return {**LABELS, "rlvr.dev/train-step": jobspec.step_key(cfg, args)}


POD_SPEC = {
    "nodeSelector": {"rlvr.io/pool": "train"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
    "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True},
    "serviceAccountName": "rlvr-pipeline-runner",
}
RESOURCES = {
    "requests": {"cpu": "8", "memory": "128Gi"},
    "limits": {"cpu": "96", "memory": "128Gi", "nvidia.com/gpu": "8"},
}


def test_trainjob_field_by_field(tmp_path):
    cfg = cluster_cfg(tmp_path)
    job = jobspec.train_job(
        cfg, SEGMENT_ARGS, name="rlvr-train-x", namespace="team-a", iterations=4, owner=OWNER
    )
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    meta = job["metadata"]
    assert meta["name"] == "rlvr-train-x"
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == labels(cfg, SEGMENT_ARGS)
    assert meta["ownerReferences"] == [OWNER]
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "rlvr-train",
    }
    assert spec["activeDeadlineSeconds"] == 12 * 3600 * 4  # train's timeout x the segment's
    t = spec["trainer"]
    assert t["image"] == "registry.example/rlvr/rlvr-train:1.2"
    assert t["command"] == [
        "python",
        "-m",
        "components.train.node",
        "env:RLVR_CONFIG_JSON",
        "--run-id",
        "Demo_Run.7",
        *SEGMENT_ARGS,
    ]
    assert (t["numNodes"], t["numProcPerNode"]) == (2, 8)
    assert t["resourcesPerNode"] == RESOURCES
    assert t["env"][0]["name"] == "RLVR_CONFIG_JSON"
    assert RunConfig.from_json(t["env"][0]["value"]) == cfg  # every pod runs the resolved config
    assert t["env"][1] == {"name": "PYTHONUNBUFFERED", "value": "1"}
    assert t["env"][2:] == ENV_REFS
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == "rlvr.dev/train-launcher"
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    pod = node["template"]["spec"]["template"]
    assert pod["metadata"] == {"labels": labels(cfg, SEGMENT_ARGS)}  # leftovers are found by it
    assert pod["spec"] == {
        **POD_SPEC,
        "containers": [
            {"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
        ],
    }
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(spec) == {"runtimeRef", "trainer", "runtimePatches", "activeDeadlineSeconds"}
    assert_valid(job)


def test_pytorchjob_field_by_field(tmp_path):
    cfg = cluster_cfg(tmp_path, api="training-operator", nodes=3)
    args = ["--iteration", "5"]
    job = jobspec.pytorch_job(cfg, args, name="j", namespace="team-a", iterations=1)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"] == {"name": "j", "namespace": "team-a", "labels": labels(cfg, args)}
    spec = job["spec"]
    assert spec["nprocPerNode"] == "8"
    assert spec["runPolicy"] == {
        "backoffLimit": 0,
        "cleanPodPolicy": "None",
        "activeDeadlineSeconds": 12 * 3600,
    }
    replicas = spec["pytorchReplicaSpecs"]
    assert {k: (v["replicas"], v["restartPolicy"]) for k, v in replicas.items()} == {
        "Master": (1, "Never"),
        "Worker": (2, "Never"),
    }
    assert replicas["Master"]["template"] == replicas["Worker"]["template"]
    template = replicas["Master"]["template"]
    assert template["metadata"] == {"labels": labels(cfg, args)}
    (container,) = template["spec"]["containers"]
    assert {k: v for k, v in template["spec"].items() if k != "containers"} == POD_SPEC
    assert container["name"] == "pytorch"
    assert container["image"] == "registry.example/rlvr/rlvr-train:1.2"
    assert container["command"] == [
        "python",
        "-m",
        "components.train.node",
        "env:RLVR_CONFIG_JSON",
        "--run-id",
        "Demo_Run.7",
        "--iteration",
        "5",
    ]
    assert container["env"][2:] == ENV_REFS
    assert container["resources"] == RESOURCES
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert_valid(job)


def test_cpu_pool_and_bare_placement_give_minimal_valid_specs(tmp_path):
    """No accelerator, no shm, no security context, no secrets: only what is configured."""
    cfg = cluster_cfg(tmp_path, processes=2)
    cfg.cluster.stages["train"] = cfg.cluster.stages["verify"].model_copy(
        update={"node_selector": {}, "timeout_s": None}
    )
    cfg.cluster.run_as_user = cfg.cluster.service_account = None
    cfg.cluster.object_store_secret = cfg.cluster.hf_token_secret = None
    cfg.cluster.defaults_config_map = None
    for build in (jobspec.train_job, jobspec.pytorch_job):
        job = build(cfg, SEGMENT_ARGS, name="j", namespace="ns", iterations=4)
        assert "activeDeadlineSeconds" not in json.dumps(job)
        assert "secretKeyRef" not in json.dumps(job) and "dshm" not in json.dumps(job)
        assert_valid(job)
    t = jobspec.train_job(cfg, SEGMENT_ARGS, name="j", namespace="ns", iterations=4)["spec"][
        "trainer"
    ]
    assert t["numProcPerNode"] == 2  # train.processes wins
    assert t["resourcesPerNode"] == {
        "requests": {"cpu": "8", "memory": "16Gi"},
        "limits": {"cpu": "16", "memory": "32Gi"},
    }
    pod = jobspec.train_job(cfg, SEGMENT_ARGS, name="j", namespace="ns", iterations=4)["spec"][
        "runtimePatches"
    ][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["template"]["spec"]["template"]["spec"] == {}


def test_a_misspelt_field_fails_validation(tmp_path):
    job = jobspec.train_job(
        cluster_cfg(tmp_path), SEGMENT_ARGS, name="j", namespace="ns", iterations=4
    )
    job["spec"]["trainer"]["numNode"] = job["spec"]["trainer"].pop("numNodes")
    with pytest.raises(AssertionError, match=r"\.spec\.trainer\.numNode \(not in the schema\)"):
        assert_valid(job)


def test_job_names_are_dns_labels_new_per_submission_with_a_stable_step_label(tmp_path):
    cfg = cluster_cfg(tmp_path)
    name = jobspec.job_name(cfg, SEGMENT_ARGS, "a1b2c")
    assert re.fullmatch(r"rlvr-train-demo-run-7-[0-9a-f]{8}-a1b2c", name) and len(name) <= 40
    key = jobspec.step_key(cfg, SEGMENT_ARGS)
    assert key == jobspec.step_key(cfg, list(SEGMENT_ARGS))  # a retried task: the same step
    assert key != jobspec.step_key(cfg, ["--segment", "2", "--attempt", "run-abc"])
    assert key != jobspec.step_key(cfg, ["--segment", "1", "--attempt", "run-def"])
    cfg.run.run_id = "X" * 200
    assert len(jobspec.job_name(cfg, SEGMENT_ARGS, "a1b2c")) <= 40
    assert jobspec.labels(cfg, SEGMENT_ARGS)["rlvr.dev/run-id"] == "X" * 63


def test_no_secret_value_enters_a_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t")
    cfg = cluster_cfg(tmp_path)
    for build in (jobspec.train_job, jobspec.pytorch_job):
        text = json.dumps(build(cfg, SEGMENT_ARGS, name="j", namespace="ns", iterations=4))
        assert "s3cr3t" not in text


def test_the_names_rlvr_and_the_launchers_set_are_refused_in_train_job_env(tmp_path):
    """A second MASTER_ADDR or PET_NNODES in the pod spec would shadow the controller's; a
    second AWS_SECRET_ACCESS_KEY would put a value where a Secret reference belongs."""
    cfg = cluster_cfg(tmp_path)
    ours = {e["name"] for e in jobspec.env(cfg)} - set(cfg.cluster.train_job.env)
    assert ours and ours <= RESERVED_NODE_ENV  # every variable rlvr sets is guarded
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"base": "s3://b/m"},
                "data": {"train": "s3://b/d"},
                "cluster": {
                    "train_job": {
                        "env": {"NCCL_DEBUG": "INFO", "PET_NNODES": "4", "MASTER_ADDR": "10.0.0.1"}
                    }
                },
            }
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"c\.yaml:\n  cluster\.train_job\.env: .*MASTER_ADDR, "
        r"PET_NNODES: set by the job controller, torchrun or rlvr .*; remove them",
    ):
        load_config(path)
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"base": "s3://b/m"},
                "data": {"train": "s3://b/d"},
                "cluster": {"train_job": {"env": {"NCCL_DEBUG": "INFO"}}},
            }
        )
    )
    assert load_config(path).cluster.train_job.env == {"NCCL_DEBUG": "INFO"}


def test_compiled_pipeline_train_task_submits_instead_of_training(tmp_path):
    """With train.nodes 2 the compiled train task runs on the init pool (no GPU: its pod only
    submits and follows the job) under the train stage's deadline; with 1 it is the GPU pod."""
    from pipelines.train import compile_pipeline

    def train_executor(nodes: int) -> tuple[dict, dict]:
        cfg = cluster_cfg(tmp_path)
        cfg.train.nodes = nodes
        cfg.cluster.stages["init"].retries = 0  # init's pool, but not init's retries
        path = compile_pipeline(cfg, str(tmp_path / f"p{nodes}.yaml"))
        docs = list(yaml.safe_load_all(open(path)))
        spec, platform = docs[0], docs[1]
        executor = spec["deploymentSpec"]["executors"]["exec-train-worker"]["container"]
        (task,) = [
            t
            for t in spec["root"]["dag"]["tasks"].values()
            if t["componentRef"]["name"] == "comp-train-worker"
        ]
        executor["retryPolicy"] = task.get("retryPolicy")
        k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
            "exec-train-worker"
        ]
        return executor, k8s

    multi, multi_k8s = train_executor(2)
    single, single_k8s = train_executor(1)
    assert multi["image"] == single["image"] == "registry.example/rlvr/rlvr-train:1.2"
    assert "accelerator" not in multi["resources"] and "accelerator" in single["resources"]
    assert multi_k8s["nodeSelector"] == {"labels": {"rlvr.io/pool": "verify"}}
    assert "tolerations" not in multi_k8s and "emptyDirMounts" not in multi_k8s
    deadline = 12 * 3600 * 4  # the IR carries it as a string
    assert single_k8s["activeDeadlineSeconds"] == str(deadline)
    # the job's own deadline (the same) fires first, so the task reads and reports why
    assert multi_k8s["activeDeadlineSeconds"] == str(deadline + 900)
    # the train stage's retry policy, not init's (the peers' grace is computed from it)
    assert (
        multi["retryPolicy"] == single["retryPolicy"] and multi["retryPolicy"]["maxRetryCount"] == 2
    )
