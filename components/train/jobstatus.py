"""What a multi-node train job says of itself, read from the Kubernetes API's answers: which job
kinds exist and how each reports its end (conditions, the label of its pods), why its pods fail
or wait, and their logs streamed into the submitting task's own. Pure reading, no decisions:
components/train/jobs.py submits, follows and deletes the job with these.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from components.train import jobspec


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
    ),
    "training-operator": JobKind(
        *jobspec.TRAINING_OPERATOR,
        container=jobspec.NODE_CONTAINER["training-operator"],
        pod_label="training.kubeflow.org/job-name",
        done="Succeeded",
        failed="Failed",
    ),
}


def job_state(kind: JobKind, obj: dict[str, Any]) -> tuple[str, str]:
    """("running" | "succeeded" | "failed", the deciding condition's reason and message)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("status") == "True" and c.get("type") in (kind.failed, kind.done):
            text = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return ("failed" if c["type"] == kind.failed else "succeeded"), text
    return "running", ""


def suspended(obj: dict[str, Any]) -> bool:
    """Held by a queue (Kueue suspends a job until its quota admits it): a TrainJob's
    spec.suspend, a PyTorchJob's spec.runPolicy.suspend, or a Suspended condition."""
    spec = obj.get("spec") or {}
    if spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"):
        return True
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions)


#: waiting reasons that do not cure themselves: the image name or the pod's spec is wrong, or
#: what it refers to is missing (a Secret, a ConfigMap key); the step fails FATAL_WAIT_S after
FATAL_WAITS = {
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
}
FATAL_WAIT_S = 300.0


def pod_failures(pods: list[dict[str, Any]]) -> list[str]:
    """Each container of the job's pods that ended abnormally, as `pod/container: reason (exit
    N): message`, or waits for a reason (an image that will not pull); and every pod still
    Pending, with the scheduler's reason if it gave one."""
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        said = len(out)
        waiting = []
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            wait = (cs.get("state") or {}).get("waiting") or {}
            if term and term.get("exitCode", 0) != 0:
                msg = (term.get("message") or "").strip()
                out.append(
                    f"{name}/{cs['name']}: {term.get('reason') or 'Error'} (exit "
                    f"{term.get('exitCode')})" + (f": {msg}" if msg else "")
                )
            elif wait.get("reason") and wait["reason"] != "ContainerCreating":
                out.append(
                    f"{name}/{cs['name']}: waiting ({wait['reason']}: {wait.get('message', '')})"
                )
            elif wait.get("reason"):
                waiting.append(wait["reason"])
        if status.get("phase") == "Pending" and len(out) == said:
            why = [
                c.get("message", "")
                for c in status.get("conditions") or []
                if c.get("status") == "False" and c.get("message")
            ] or waiting
            out.append(f"{name}: pending" + (f" ({why[0]})" if why else ""))
    return out


def fatal_waits(pods: list[dict[str, Any]]) -> list[str]:
    """The containers that wait for a reason no wait will cure (FATAL_WAITS)."""
    return [
        line for line in pod_failures(pods) if any(f"waiting ({r}:" in line for r in FATAL_WAITS)
    ]


class LogFollower:
    """Streams each job pod's container log, one daemon thread per pod, from the moment the pod
    has started; every line goes out prefixed with `[pod]`. A stream that ends while its
    container still runs (the API server's or kubelet's idle timeout, LOG_READ_TIMEOUT_S of
    silence, a restart) is taken up again from about the second it stopped (a line may repeat:
    the API resumes by seconds, on the kubelet's clock), up to MAX_RESUMES times a pod.
    `say` writes the task's own lines, under the same lock, so lines never interleave."""

    MAX_RESUMES = 20
    LOG_READ_TIMEOUT_S = 300

    def __init__(self, core, namespace: str, container: str, out: TextIO) -> None:
        self.core, self.namespace, self.container, self.out = core, namespace, container, out
        self.threads: dict[str, threading.Thread] = {}
        self.ended: dict[str, float] = {}  # pod -> when its last stream ended (epoch seconds)
        self.resumes: dict[str, int] = {}
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _running(self, pod: dict[str, Any]) -> bool:
        """Whether the node container itself still runs (the pod's phase lags behind it)."""
        return any(
            cs.get("name") == self.container and "running" in (cs.get("state") or {})
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
        )

    def update(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            name = pod["metadata"]["name"]
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Pending" or (name in self.threads and self.threads[name].is_alive()):
                continue
            since = None
            if name in self.threads:  # its stream ended: resume while the container runs
                if not self._running(pod) or self.resumes.get(name, 0) >= self.MAX_RESUMES:
                    continue
                self.resumes[name] = self.resumes.get(name, 0) + 1
                since = max(1, math.ceil(time.time() - self.ended.get(name, time.time())) + 1)
            t = threading.Thread(target=self._follow, args=(name, since), daemon=True)
            self.threads[name] = t
            t.start()

    def _follow(self, pod: str, since_s: int | None) -> None:
        try:
            kwargs = {"since_seconds": since_s} if since_s else {}
            resp = self.core.read_namespaced_pod_log(
                pod,
                self.namespace,
                container=self.container,
                follow=True,
                _preload_content=False,
                _request_timeout=(10, self.LOG_READ_TIMEOUT_S),
                **kwargs,
            )
            pending = b""
            for chunk in resp.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                self._write(pod, lines)
            self._write(pod, [pending] if pending else [])
        except Exception as e:  # noqa: BLE001 - a lost log stream must not fail the job
            self._write(pod, [f"(log stream ended: {e})".encode()])
        finally:
            self.ended[pod] = time.time()

    def _write(self, pod: str, lines: list[bytes]) -> None:
        with self.lock:
            for line in lines:
                self.out.write(f"[{pod}] {line.decode(errors='replace')}\n")
            self.out.flush()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in list(self.threads.values()):
            t.join(max(0.0, deadline - time.monotonic()))
