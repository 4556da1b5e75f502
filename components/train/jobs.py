"""Submit a multi-node train job, follow it to its end, and delete it: what the pipeline's train
task does on a cluster when `train.nodes` > 1.

    create TrainJob / PyTorchJob (fieldValidation=Strict; a leftover of the same name, from a
    task that died before cleaning up, is deleted first)
    poll its status every cluster.train_job.poll_s; stream each node pod's log as it starts,
    prefixed with the pod's name
    Complete / Succeeded  -> check that rank 0 committed the outputs, return the result
    Failed                -> StageError with the job's own condition message and every node
                             container that terminated abnormally (reason, exit code, message)
    always                -> delete the job (its JobSet / pods go with it); SIGTERM (the
                             pipeline run cancelled) ends the wait and still deletes it

It talks to the Kubernetes API directly (the `kubernetes` client the images already carry, as
kfp does), one loop for both job kinds; the specs are components/train/jobspec.py. The job is
owned by the task's pod when the pod can be read, so the cluster's garbage collector removes
a job whose task pod is deleted.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from components.core.config import RunConfig
from components.core.errors import StageError
from components.train import jobspec

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class JobKind:
    group: str
    version: str
    plural: str
    kind: str
    container: str
    #: pod label naming the job that owns the pod
    pod_label: str
    #: condition types (status True) that end the job: success, failure
    done: str
    failed: str


KINDS = {
    # Trainer v2 runs a TrainJob as a JobSet of the same name
    "trainer": JobKind(
        *jobspec.TRAINER,
        container=jobspec.NODE_CONTAINER["trainer"],
        pod_label="jobset.sigs.k8s.io/jobset-name",
        done="Complete",
        failed="Failed",
    ),  # fmt: skip
    "training-operator": JobKind(
        *jobspec.TRAINING_OPERATOR,
        container=jobspec.NODE_CONTAINER["training-operator"],
        pod_label="training.kubeflow.org/job-name",
        done="Succeeded",
        failed="Failed",
    ),  # fmt: skip
}


def job_state(kind: JobKind, obj: dict[str, Any]) -> tuple[str, str]:
    """("running" | "succeeded" | "failed", the deciding condition's reason and message)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("status") == "True" and c.get("type") in (kind.failed, kind.done):
            text = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return ("failed" if c["type"] == kind.failed else "succeeded"), text
    return "running", ""


def pod_failures(pods: list[dict[str, Any]]) -> list[str]:
    """Each container of the job's pods that ended abnormally, as `pod/container: reason (exit
    N): message`; a pod that never started says why it waits."""
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            wait = (cs.get("state") or {}).get("waiting") or {}
            if term and term.get("exitCode", 0) != 0:
                msg = (term.get("message") or "").strip()
                out.append(f"{name}/{cs['name']}: {term.get('reason') or 'Error'} (exit "
                           f"{term.get('exitCode')})" + (f": {msg}" if msg else ""))  # fmt: skip
            elif wait.get("reason") and wait["reason"] != "ContainerCreating":
                out.append(f"{name}/{cs['name']}: waiting ({wait['reason']}: "
                           f"{wait.get('message', '')})")  # fmt: skip
        if status.get("phase") == "Pending" and not status.get("containerStatuses"):
            why = [c.get("message", "") for c in status.get("conditions") or []
                   if c.get("status") == "False" and c.get("message")]  # fmt: skip
            out.append(f"{name}: pending" + (f" ({why[0]})" if why else ""))
    return out


class LogFollower:
    """Streams each job pod's container log, one daemon thread per pod, from the moment the pod
    has started; every line goes out prefixed with `[pod]`."""

    def __init__(self, core, namespace: str, container: str, out: TextIO) -> None:
        self.core, self.namespace, self.container, self.out = core, namespace, container, out
        self.threads: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()

    def update(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            name = pod["metadata"]["name"]
            if name in self.threads or (pod.get("status") or {}).get("phase") == "Pending":
                continue
            t = threading.Thread(target=self._follow, args=(name,), daemon=True)
            self.threads[name] = t
            t.start()

    def _follow(self, pod: str) -> None:
        try:
            resp = self.core.read_namespaced_pod_log(
                pod, self.namespace, container=self.container, follow=True,
                _preload_content=False,
            )  # fmt: skip
            pending = b""
            for chunk in resp.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                self._write(pod, lines)
            self._write(pod, [pending] if pending else [])
        except Exception as e:  # noqa: BLE001 - a lost log stream must not fail the job
            self._write(pod, [f"(log stream ended: {e})".encode()])

    def _write(self, pod: str, lines: list[bytes]) -> None:
        with self.lock:
            for line in lines:
                self.out.write(f"[{pod}] {line.decode(errors='replace')}\n")
            self.out.flush()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.threads.values():
            t.join(max(0.0, deadline - time.monotonic()))


def _own_namespace() -> str:
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _default_client():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _owner(core, namespace: str) -> dict[str, Any] | None:
    """An owner reference to the pod this task runs in (its name is the hostname), so deleting
    the task's pod deletes the job too; None when the pod cannot be read."""
    from kubernetes.client.exceptions import ApiException

    name = os.environ.get("HOSTNAME")
    if not name:
        return None
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid,
            "blockOwnerDeletion": False, "controller": False}  # fmt: skip


def iterations_served(cfg: RunConfig, stage_args: list[str]) -> list[int]:
    from components.core.warm import segment

    if "--segment" in stage_args:
        return list(segment(cfg, int(stage_args[stage_args.index("--segment") + 1])).iterations)
    return [int(stage_args[stage_args.index("--iteration") + 1])]


def committed_result(cfg: RunConfig, stage_args: list[str], job: str) -> dict[str, Any]:
    """What the task returns once the job succeeded, read from the store: rank 0 must have
    committed every checkpoint the job was to write (a job that exits 0 without them fails)."""
    from components.core.commit import NotCommittedError, read_manifest
    from components.core.layout import RunLayout, store_for

    store, layout = store_for(cfg), RunLayout.of(cfg)
    its = iterations_served(cfg, stage_args)
    manifests = []
    for i in its:
        try:
            manifests.append(read_manifest(store, layout.checkpoint(i + 1)))
        except NotCommittedError:
            raise StageError(f"train job {job} completed but {layout.checkpoint(i + 1)} is not "
                             "committed; see the job's logs above") from None  # fmt: skip
    place = {"job": job, "nodes": cfg.train.nodes,
             "processes_per_node": jobspec.processes_per_node(cfg)}  # fmt: skip
    if "--segment" in stage_args:
        seg = int(stage_args[stage_args.index("--segment") + 1])
        return {"task": "train", "segment": seg, "steps": len(its), **place}
    return {"skipped": False, "uri": layout.checkpoint(its[0] + 1),
            "stats": manifests[0].get("stats", {}), **place}  # fmt: skip


class _Cancelled(BaseException):
    """SIGTERM while the job runs: the task is being stopped; the job must go with it."""


def run_job(
    cfg: RunConfig,
    stage_args: list[str],
    *,
    api_client=None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Submit the job for `stage_args` (the train stage's `--segment S [--attempt A]` or
    `--iteration I`), wait for it, delete it; the committed result (see the module docstring)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    api = api_client or _default_client()
    out = out or sys.stdout
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    kind = KINDS[cfg.cluster.train_job.api]
    namespace = cfg.cluster.train_job.namespace or _own_namespace()
    body = jobspec.job_spec(cfg, stage_args, namespace=namespace,
                            iterations=len(iterations_served(cfg, stage_args)),
                            owner=_owner(core, namespace))  # fmt: skip
    name = body["metadata"]["name"]
    ref = dict(group=kind.group, version=kind.version, namespace=namespace, plural=kind.plural)
    what = f"{kind.kind} {namespace}/{name}"

    def create() -> None:
        custom.create_namespaced_custom_object(
            **ref, body=body, field_manager="rlvr", field_validation="Strict"
        )

    def delete() -> None:
        try:
            custom.delete_namespaced_custom_object(**ref, name=name,
                                                   propagation_policy="Background")  # fmt: skip
        except ApiException as e:
            if e.status != 404:
                raise

    try:
        create()
    except ApiException as e:
        if e.status != 409:
            raise StageError(f"creating {what} failed: {_api_message(e)}") from None
        # A task that died before its cleanup left this job: start over (committed iterations
        # are skipped by the stage itself, so nothing is trained twice).
        print(f"{what} exists (left by an earlier attempt); deleting it", file=out, flush=True)
        delete()
        _wait_gone(custom, ref, name, cfg.cluster.train_job.poll_s, sleep)
        create()
    print(f"submitted {what}: {cfg.train.nodes} nodes x {jobspec.processes_per_node(cfg)} "
          f"rank(s)", file=out, flush=True)  # fmt: skip

    previous = _on_sigterm()
    followers = LogFollower(core, namespace, kind.container, out)
    selector = f"{kind.pod_label}={name}"
    try:
        state, message, pods = "running", "", []
        while state == "running":
            obj = custom.get_namespaced_custom_object(**ref, name=name)
            state, message = job_state(kind, obj)
            pods = _list_pods(core, namespace, selector)
            followers.update(pods)
            if state == "running":
                sleep(cfg.cluster.train_job.poll_s)
        followers.join(timeout_s=30.0)
        if state == "failed":
            details = pod_failures(pods)
            raise StageError(f"{what} failed: {message or 'no reason given'}"
                             + "".join(f"\n  {d}" for d in details))  # fmt: skip
        print(f"{what} completed: {message}" if message else f"{what} completed", file=out,
              flush=True)  # fmt: skip
    except _Cancelled:
        print(f"stopped: deleting {what}", file=out, flush=True)
        raise SystemExit(143) from None
    finally:
        _restore_sigterm(previous)
        delete()
    return committed_result(cfg, stage_args, name)


def _list_pods(core, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The job's pods as plain JSON (the API's own field names)."""
    import json

    resp = core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return json.loads(resp.data).get("items", [])


def _wait_gone(custom, ref: dict, name: str, poll_s: float, sleep, timeout_s: float = 600) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            custom.get_namespaced_custom_object(**ref, name=name)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        sleep(poll_s)
    raise StageError(f"{ref['plural']} {name} was not deleted within {timeout_s:.0f} s")


def _api_message(e) -> str:
    import json

    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except (TypeError, ValueError):
        return f"{e.status} {e.reason}"


def _on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return None

    def cancel(signum, frame):
        raise _Cancelled()

    return signal.signal(signal.SIGTERM, cancel)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
