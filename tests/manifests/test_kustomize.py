"""The kustomize manifests, checked without a cluster.

Each kustomization is rendered by `render()` below, a small subset of kustomize (resources,
namespace, labels/commonLabels, strategic-merge patches) that refuses any field it does not
implement instead of guessing. When a kustomize v4+ is on PATH (`kustomize`, or `kubectl
kustomize`), its output must equal ours object for object. Every rendered object is validated
offline and strictly (unknown fields are errors) against the Kubernetes JSON schemas bundled in
kubernetes-validate; the test skips when that package is missing. The rest are the properties
docs/deploy.md relies on: no secret values, pinned images, non-root pods, RBAC wiring, the GPU
pool scheduling objects.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.support.crd import assert_valid

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
KUSTOMIZATIONS = (
    "base",
    "overlays/dev",
    "overlays/gpu-pools",
    "overlays/code-sandbox",
    "overlays/multi-node",
    "overlays/weight-channel",
)
NAMESPACE = "rlvr"
# Validated against the oldest Kubernetes still commonly run that has every field used here
# (PodSecurity admission labels, fsGroupChangePolicy, ttlSecondsAfterFinished), and the newest
# schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", "latest")
# MutatingAdmissionPolicy (v1beta1) exists from 1.34 on
VERSIONS_FOR = {"overlays/code-sandbox": ("1.34.0", "latest")}

CLUSTER_SCOPED = {
    "Namespace",
    "PriorityClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "PersistentVolume",
    "CustomResourceDefinition",
    "IngressClass",
    "RuntimeClass",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ClusterTrainingRuntime",
}
# Kubeflow's kinds, validated against the released API models (tests/support/crd.py) rather than
# Kubernetes' own schemas
KUBEFLOW_KINDS = {"ClusterTrainingRuntime", "TrainingRuntime", "TrainJob", "PyTorchJob"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


# --- a kustomize subset -----------------------------------------------------------------------


def _key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _merge(target: dict, patch: dict) -> dict:
    """Strategic merge as far as these manifests need it: maps merge, null deletes, lists are
    replaced. A list of named maps (containers, env) would need merge keys, so it is refused."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            if isinstance(v, list) and any(isinstance(i, dict) and "name" in i for i in v):
                raise NotImplementedError(f"strategic merge of list {k!r} needs merge keys")
            target[k] = copy.deepcopy(v)
    return target


def _apply_patch(objs: list[dict], entry: dict, base: Path) -> list[dict]:
    if set(entry) - {"path", "patch"}:
        raise NotImplementedError(f"patch fields {sorted(set(entry) - {'path', 'patch'})}")
    text = (base / entry["path"]).read_text() if "path" in entry else entry["patch"]
    patch = yaml.safe_load(text)
    meta = patch.get("metadata", {})
    matches = [
        o
        for o in objs
        if o["kind"] == patch["kind"]
        and o["metadata"]["name"] == meta["name"]
        and meta.get("namespace", o["metadata"].get("namespace")) == o["metadata"].get("namespace")
    ]
    assert len(matches) == 1, f"patch {meta['name']} matches {len(matches)} objects"
    if patch.get("$patch") == "delete":
        return [o for o in objs if o is not matches[0]]
    body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
    _merge(matches[0], body)
    return objs


def _set_namespace(objs: list[dict], ns: str) -> None:
    for o in objs:
        if o["kind"] == "Namespace":
            if o["metadata"]["name"] != ns:
                raise NotImplementedError("renaming a Namespace object")
            continue
        if o["kind"] not in CLUSTER_SCOPED:
            o["metadata"]["namespace"] = ns
        # kustomize fills in ServiceAccount subjects that name no namespace.
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for s in o.get("subjects", []):
                if s.get("kind") == "ServiceAccount" and not s.get("namespace"):
                    s["namespace"] = ns


def _add_labels(objs: list[dict], pairs: dict, selectors: bool, templates: bool) -> None:
    for o in objs:
        o["metadata"].setdefault("labels", {}).update(pairs)
        spec = o.get("spec", {})
        if selectors:
            if o["kind"] == "Service":
                spec.setdefault("selector", {}).update(pairs)
            elif o["kind"] in WORKLOADS - {"Job"}:
                spec.setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)
        if (selectors or templates) and o["kind"] in WORKLOADS:
            tmeta = spec.setdefault("template", {}).setdefault("metadata", {})
            tmeta.setdefault("labels", {}).update(pairs)


SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "commonLabels", "resources", "patches"}


def render(directory: Path) -> list[dict]:
    """The objects `kustomize build directory` produces, for the fields in SUPPORTED."""
    kfile = directory / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    if set(k) - SUPPORTED:
        raise NotImplementedError(f"{kfile}: {sorted(set(k) - SUPPORTED)}")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise NotImplementedError(f"{kfile}: kind {k['kind']}")
    objs: list[dict] = []
    for res in k.get("resources", []):
        path = (directory / res).resolve()
        if path.is_dir():
            objs += render(path)
        else:
            objs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in k.get("patches", []):
        objs = _apply_patch(objs, entry, directory)
    if k.get("namespace"):
        _set_namespace(objs, k["namespace"])
    for spec in k.get("labels", []):
        _add_labels(
            objs,
            spec["pairs"],
            spec.get("includeSelectors", False),
            spec.get("includeTemplates", False),
        )
    if k.get("commonLabels"):
        _add_labels(objs, k["commonLabels"], True, True)
    keys = [_key(o) for o in objs]
    duplicates = {x for x in keys if keys.count(x) > 1}
    assert not duplicates, f"{directory}: objects defined twice: {duplicates}"
    return objs


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(MANIFESTS / name) for name in KUSTOMIZATIONS}


def _one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: found {len(found)}"
    return found[0]


def _pod_specs(objs: list[dict]):
    for o in objs:
        if o["kind"] in WORKLOADS:
            yield o, o["spec"]["template"]["spec"]


def _containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


# --- real kustomize, when installed ---------------------------------------------------------


def _kustomize_cmd() -> list[str] | None:
    """A kustomize v4+ command line, or None. v4 is the first that knows `labels:`."""
    candidates = []
    if shutil.which("kustomize"):
        candidates.append((["kustomize", "build"], ["kustomize", "version"], r"v(\d+)\."))
    if shutil.which("kubectl"):
        # kubectl's own version comes first in its output; the embedded kustomize's is a field.
        candidates.append(
            (
                ["kubectl", "kustomize"],
                ["kubectl", "version", "--client", "-o", "json"],
                r'"kustomizeVersion":\s*"v(\d+)\.',
            )
        )
    for build, version, pattern in candidates:
        try:
            out = subprocess.run(version, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(pattern, out)
        if m and int(m.group(1)) >= 4:
            return build
    return None


KUSTOMIZE = _kustomize_cmd()
needs_kustomize = pytest.mark.skipif(
    KUSTOMIZE is None, reason="no kustomize v4+ (kustomize or kubectl) on PATH"
)


def _kustomize_build(directory: Path) -> list[dict]:
    out = subprocess.run(
        [*KUSTOMIZE, str(directory)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@needs_kustomize
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renderer_agrees_with_kustomize(rendered, name):
    ours = {_key(o): o for o in rendered[name]}
    theirs = {_key(o): o for o in _kustomize_build(MANIFESTS / name)}
    assert sorted(ours) == sorted(theirs)
    for key, obj in ours.items():
        assert json.dumps(obj, sort_keys=True) == json.dumps(theirs[key], sort_keys=True), key


@needs_kustomize
def test_renderer_agrees_with_kustomize_on_common_labels_and_deletes(tmp_path):
    # Features our manifests do not use today, so the renderer stays honest about them.
    (tmp_path / "base").mkdir()
    (tmp_path / "over").mkdir()
    dev = MANIFESTS / "overlays" / "dev"
    (tmp_path / "base" / "kustomization.yaml").write_text(
        "resources: [deploy.yaml, svc.yaml, job.yaml]\ncommonLabels: {team: ml}\n"
    )
    for src, dst in (
        ("minio-deployment", "deploy"),
        ("minio-service", "svc"),
        ("create-bucket-job", "job"),
    ):
        shutil.copy(dev / f"{src}.yaml", tmp_path / "base" / f"{dst}.yaml")
    (tmp_path / "over" / "kustomization.yaml").write_text(
        "namespace: other\nresources: [../base]\npatches:\n"
        "  - patch: |-\n      $patch: delete\n      apiVersion: v1\n      kind: Service\n"
        "      metadata: {name: minio}\n"
    )
    ours = {_key(o): o for o in render(tmp_path / "over")}
    theirs = {_key(o): o for o in _kustomize_build(tmp_path / "over")}
    assert ours == theirs


# --- schema validation ----------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_object_validates_against_the_kubernetes_schemas(rendered, name):
    kv = pytest.importorskip("kubernetes_validate.utils", reason="kubernetes-validate missing")
    errors = []
    for obj in rendered[name]:
        if obj["kind"] in KUBEFLOW_KINDS:
            assert_valid(obj)
    for version in VERSIONS_FOR.get(name, K8S_VERSIONS):
        version = kv.latest_version() if version == "latest" else version
        for obj in rendered[name]:
            if obj["kind"] in KUBEFLOW_KINDS:
                continue
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as e:
                errors.append(f"{version} {'/'.join(_key(obj))} {e.json_path}: {e.message}")
            except kv.SchemaNotFoundError:
                errors.append(f"{version} {'/'.join(_key(obj))}: no schema for the kind")
    assert not errors, "\n".join(errors)


# --- what docs/deploy.md relies on ----------------------------------------------------------


def test_everything_lives_in_the_rlvr_namespace(rendered):
    assert _one(rendered["base"], "Namespace", NAMESPACE)
    for name, objs in rendered.items():
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                assert o["metadata"]["namespace"] == NAMESPACE, (name, _key(o))
            assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rlvr"


def test_the_secret_is_an_empty_template(rendered):
    for name, objs in rendered.items():
        for o in objs:
            if o["kind"] != "Secret":
                continue
            values = {**o.get("data", {}), **o.get("stringData", {})}
            assert values, f"{name}: Secret {o['metadata']['name']} has no keys"
            filled = sorted(k for k, v in values.items() if v)
            assert not filled, f"{name}: Secret values committed for {filled}"
    secret = _one(rendered["base"], "Secret", "rlvr-object-store")
    assert set(secret["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_no_credential_is_written_into_a_pod_spec(rendered):
    for _, objs in rendered.items():
        for o, pod in _pod_specs(objs):
            for c in _containers(pod):
                for env in c.get("env", []):
                    if re.search(r"KEY|SECRET|PASSWORD|TOKEN|ROOT_USER", env["name"]):
                        assert "valueFrom" in env, f"{_key(o)}: {env['name']} is inline"


def test_references_resolve(rendered):
    for name, objs in rendered.items():
        if name == "overlays/gpu-pools":
            continue  # an add-on without pods; it references nothing
        data = {
            (o["kind"], o["metadata"]["name"]): {**o.get("data", {}), **o.get("stringData", {})}
            for o in objs
            if o["kind"] in ("Secret", "ConfigMap")
        }
        claims = {o["metadata"]["name"] for o in objs if o["kind"] == "PersistentVolumeClaim"}
        for o, pod in _pod_specs(objs):
            for c in _containers(pod):
                for env in c.get("env", []):
                    for kind, field in (
                        ("Secret", "secretKeyRef"),
                        ("ConfigMap", "configMapKeyRef"),
                    ):
                        ref = env.get("valueFrom", {}).get(field)
                        if ref:
                            assert ref["key"] in data[(kind, ref["name"])], (name, _key(o), ref)
                ports = {p["name"] for p in c.get("ports", [])}
                for probe in ("readinessProbe", "livenessProbe"):
                    port = c.get(probe, {}).get("httpGet", {}).get("port")
                    assert port is None or port in ports, (_key(o), probe, port)
            for vol in pod.get("volumes", []):
                if "persistentVolumeClaim" in vol:
                    assert vol["persistentVolumeClaim"]["claimName"] in claims


def test_images_are_pinned(rendered):
    for name, objs in rendered.items():
        for o, pod in _pod_specs(objs):
            for c in _containers(pod):
                image = c["image"]
                repo, _, digest = image.partition("@")
                last = repo.rsplit("/", 1)[-1]
                assert ":" in last or digest, f"{name} {_key(o)}: {image} has no tag"
                tag = last.partition(":")[2]
                assert tag != "latest", f"{name} {_key(o)}: {image} is not pinned"
                assert c.get("imagePullPolicy") != "Always"


def test_pods_run_as_non_root(rendered):
    objs = rendered["overlays/dev"]
    minio = _one(objs, "Deployment", "minio")
    assert minio["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert minio["spec"]["strategy"]["type"] == "Recreate"  # one RWO volume
    for o, pod in _pod_specs(objs):
        sc = pod.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True, _key(o)
        assert sc.get("runAsUser", 0) != 0, _key(o)
        assert pod.get("automountServiceAccountToken") is False, _key(o)
        for c in _containers(pod):
            csc = c.get("securityContext", {})
            assert csc.get("allowPrivilegeEscalation") is False, (_key(o), c["name"])
            assert csc.get("capabilities", {}).get("drop") == ["ALL"], (_key(o), c["name"])
            assert c.get("resources", {}).get("requests"), (_key(o), c["name"])


def test_minio_refuses_an_unfilled_secret(rendered):
    # Given empty credentials MinIO would start with its well-known default root user.
    c = _one(rendered["overlays/dev"], "Deployment", "minio")["spec"]["template"]["spec"]
    script = c["containers"][0]["args"][0]
    assert '"${#MINIO_ROOT_USER}" -lt 3' in script and '"${#MINIO_ROOT_PASSWORD}" -lt 8' in script
    assert "exec minio server /data" in script


def test_bucket_job_uses_the_secret_and_the_configured_bucket(rendered):
    objs = rendered["overlays/dev"]
    job = _one(objs, "Job", "minio-create-bucket")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("minio/mc:RELEASE.")
    refs = {e["name"]: e.get("valueFrom", {}) for e in c["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert refs[key]["secretKeyRef"] == {"name": "rlvr-object-store", "key": key}
    assert refs["RLVR_BUCKET"]["configMapKeyRef"]["name"] == "rlvr-defaults"
    assert 'mb --ignore-existing "rlvr/$RLVR_BUCKET"' in c["args"][0]


def test_defaults_match_the_config_and_the_dev_object_store(rendered):
    from components.core.config_cluster import DEFAULT_IMAGE_REPO, DEFAULT_IMAGE_TAG, ClusterSection

    base = _one(rendered["base"], "ConfigMap", "rlvr-defaults")["data"]
    assert base["RLVR_IMAGE_REPO"] == DEFAULT_IMAGE_REPO == ClusterSection().image_repo
    assert base["RLVR_IMAGE_TAG"] == DEFAULT_IMAGE_TAG
    assert base["RLVR_STORE"].startswith(f"s3://{base['RLVR_BUCKET']}/")
    assert base["AWS_ENDPOINT_URL"] == ""  # AWS S3 itself

    objs = rendered["overlays/dev"]
    dev = _one(objs, "ConfigMap", "rlvr-defaults")["data"]
    assert {k: v for k, v in dev.items() if k != "AWS_ENDPOINT_URL"} == {
        k: v for k, v in base.items() if k != "AWS_ENDPOINT_URL"
    }
    url = urlparse(dev["AWS_ENDPOINT_URL"])
    service = _one(objs, "Service", "minio")
    assert url.hostname == service["metadata"]["name"]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    pod_labels = _one(objs, "Deployment", "minio")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_rolebinding_grants_the_runner_role_to_the_service_account(rendered):
    objs = rendered["base"]
    sa = _one(objs, "ServiceAccount", "rlvr-pipeline-runner")
    binding = _one(objs, "RoleBinding", "rlvr-pipeline-runner")
    role = _one(objs, "Role", binding["roleRef"]["name"])
    assert binding["roleRef"]["kind"] == "Role"
    assert {
        "kind": "ServiceAccount",
        "name": sa["metadata"]["name"],
        "namespace": sa["metadata"]["namespace"],
    } in binding["subjects"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]


def test_role_is_least_privilege(rendered):
    role = _one(rendered["base"], "Role", "rlvr-pipeline-runner")
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(
            rule["verbs"]
        )
        if {"secrets", "configmaps"} & set(rule["resources"]):
            assert rule.get("resourceNames") and rule["verbs"] == ["get"], rule
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("workflowtaskresults", "create") in granted  # Argo >= 3.4 reports outputs this way
    assert ("pods", "create") not in granted


def test_gpu_pools_schedule_the_stages(rendered):
    objs = rendered["overlays/gpu-pools"]
    pc = _one(objs, "PriorityClass", "rlvr-training")
    assert pc["value"] > 0 and pc["globalDefault"] is False

    hard = _one(objs, "ResourceQuota", "rlvr-quota")["spec"]["hard"]
    assert {"requests.nvidia.com/gpu", "requests.cpu", "requests.memory"} <= set(hard)
    # A quota on limits.* would reject every pod without limits (KFP's own containers).
    assert not [k for k in hard if k.startswith("limits.")]
    # ...and one on requests.* rejects pods without requests unless a LimitRange fills them.
    (limits,) = _one(objs, "LimitRange", "rlvr-container-defaults")["spec"]["limits"]
    assert {"cpu", "memory"} <= set(limits["defaultRequest"])

    pools = yaml.safe_load(_one(objs, "ConfigMap", "rlvr-node-pools")["data"]["pools.yaml"])
    gpu_taint = {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "present",
        "effect": "NoSchedule",
    }
    for stage in ("generate", "train", "evaluate"):
        pool = pools[stage]
        assert pool["nodeSelector"]["rlvr.io/pool"] in {"generate", "train"}
        assert gpu_taint in pool["tolerations"] and pool["gpus"] >= 1, stage
    assert pools["generate"]["nodeSelector"] == {"rlvr.io/pool": "generate"}
    assert pools["train"]["nodeSelector"] == {"rlvr.io/pool": "train"}
    assert pools["train"]["priorityClassName"] == pc["metadata"]["name"]
    for stage in ("verify", "init"):
        assert pools[stage]["nodeSelector"] == {"rlvr.io/pool": "verify"}
        assert pools[stage]["tolerations"] == [] and pools[stage]["gpus"] == 0


def test_gpu_pools_do_not_reapply_the_secret_template(rendered):
    # Applied next to a filled-in Secret, it must not blank it (see its kustomization).
    kinds = {o["kind"] for o in rendered["overlays/gpu-pools"]}
    assert "Secret" not in kinds and "Namespace" not in kinds


def test_local_overlay_template_keeps_credentials_out_of_git():
    example = MANIFESTS / "overlays" / "local.example"
    env = (example / "object-store.env.example").read_text()
    values = dict(
        line.split("=", 1) for line in env.splitlines() if line and not line.startswith("#")
    )
    assert values == {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    ignored = (MANIFESTS / ".gitignore").read_text().split()
    assert "/overlays/local/" in ignored and "*.env" in ignored


@needs_kustomize
def test_local_overlay_fills_the_secret(tmp_path):
    tree = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, tree)
    local = tree / "overlays" / "local"
    shutil.copytree(tree / "overlays" / "local.example", local)
    (local / "object-store.env").write_text(
        "AWS_ACCESS_KEY_ID=test-user\nAWS_SECRET_ACCESS_KEY=not-a-secret\n"
    )
    objs = _kustomize_build(local)
    secret = _one(objs, "Secret", "rlvr-object-store")
    # The filled values replace the template's; no empty stringData is left to override them.
    assert "stringData" not in secret
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert _one(objs, "Deployment", "minio")


def test_code_pods_get_the_sandbox_profile_and_narrow_egress(rendered):
    objs = {obj["kind"]: obj for obj in rendered["overlays/code-sandbox"]}
    label = {"rlvr.dev/runs-code": "true"}
    policy = objs["MutatingAdmissionPolicy"]["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["objectSelector"]["matchLabels"] == label
    expr = policy["mutations"][0]["applyConfiguration"]["expression"]
    assert 'type: "Localhost"' in expr and "profiles/rlvr-code-sandbox.json" in expr
    binding = objs["MutatingAdmissionPolicyBinding"]["spec"]
    assert binding["policyName"] == objs["MutatingAdmissionPolicy"]["metadata"]["name"]
    netpol = objs["NetworkPolicy"]["spec"]
    assert netpol["podSelector"]["matchLabels"] == label and netpol["policyTypes"] == ["Egress"]
    ports = {p["port"] for rule in netpol["egress"] for p in rule["ports"]}
    assert ports == {53, 443, 9000, 8887, 8080}


def test_the_shipped_seccomp_profile_is_the_generated_one():
    from components.sandbox.seccomp import SANDBOX_BUILDER_NEEDS, pod_profile

    shipped = json.loads(
        (MANIFESTS / "overlays/code-sandbox/seccomp/rlvr-code-sandbox.json").read_text()
    )
    assert shipped == pod_profile(), "regenerate: python -m components.sandbox pod-profile"
    denied = set(shipped["syscalls"][0]["names"])
    assert not denied & set(SANDBOX_BUILDER_NEEDS)
    assert {"ptrace", "bpf", "keyctl", "perf_event_open", "setns", "io_uring_setup"} <= denied


def test_multi_node_runtime_matches_what_the_train_task_submits(rendered):
    """The runtime's image is the config's default train image, its trainer job and container
    are the ones a TrainJob's runtime patch and the launcher's log stream name, and the
    Trainer can find it (the ancestor-step label)."""
    from components.core.config import RunConfig
    from components.train import jobspec

    objs = rendered["overlays/multi-node"]
    cfg = RunConfig.model_validate(
        {
            "run": {"run_id": "r", "store": "/s"},
            "model": {"base": "/b"},
            "data": {"train": "/t.parquet"},
        }
    )
    runtime = _one(objs, "ClusterTrainingRuntime", cfg.cluster.train_job.runtime)
    assert "namespace" not in runtime["metadata"]
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == jobspec.NODE_CONTAINER["trainer"]
    assert node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
    }
    assert node["template"]["spec"]["backoffLimit"] == 0
    pod = node["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == jobspec.NODE_CONTAINER["trainer"]
    assert container["image"] == cfg.cluster.image("train")
    assert container["command"] == jobspec.NODE_COMMAND


def test_multi_node_rbac_lets_the_runner_manage_its_jobs(rendered):
    from components.core.config_cluster import ClusterSection

    objs = rendered["overlays/multi-node"]
    role = _one(objs, "Role", "rlvr-train-launcher")
    assert role["metadata"]["namespace"] == NAMESPACE
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    verbs = {"create", "get", "list", "watch", "delete"}  # components/train/jobs.py uses these
    assert rules == {
        ("trainer.kubeflow.org", "trainjobs"): verbs,
        ("kubeflow.org", "pytorchjobs"): verbs,
    }
    binding = _one(objs, "RoleBinding", "rlvr-train-launcher")
    assert binding["roleRef"]["name"] == "rlvr-train-launcher"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "namespace": NAMESPACE, "name": ClusterSection().service_account}
    ]
    # the job's pods and logs are read under the base Role
    base = {
        r["resources"][0]: set(r["verbs"])
        for r in _one(rendered["base"], "Role", "rlvr-pipeline-runner")["rules"]
    }
    assert {"get", "list"} <= base["pods"] and "get" in base["pods/log"]
