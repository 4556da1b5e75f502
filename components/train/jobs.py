"""Submit a multi-node train job, follow it to its end, and delete it: what the pipeline's train
task does on a cluster when `train.nodes` > 1.

    leftovers             -> jobs of the same step (label rlvr.dev/train-step), left by a task
                             that died before cleaning up, are deleted in the foreground and
                             waited out, pods and all
    create                -> a TrainJob / PyTorchJob of a name never used before
                             (fieldValidation=Strict); SIGTERM is armed before it
    follow                -> poll its status every cluster.train_job.poll_s; stream each node
                             pod's log as it starts, prefixed with the pod's name (resumed if
                             the stream drops); say why pods wait (unschedulable, image pull)
                             when that changes; ride out an API server that fails to answer
                             for up to API_GRACE_S at every call
    Complete / Succeeded  -> check that rank 0 committed the outputs, return the result
    Failed                -> StageError with the job's own condition message and every node
                             container that terminated abnormally (reason, exit code, message)
    Pending too long      -> StageError with the scheduler's reason, or what to check when
                             no pod was ever created (cluster.train_job.schedule_timeout_s; a
                             job a queue holds suspended waits); a node that cannot start
                             at all (FATAL_WAITS: a bad image name, a missing Secret) after
                             FATAL_WAIT_S
    gone (404)            -> StageError: the job was deleted by someone else
    always                -> delete the job by its uid (its JobSet / pods go with it); SIGTERM
                             (the pipeline run cancelled) ends the wait and still deletes it;
                             a failure is recorded as the train task's failure marker, so the
                             other stages' workers stop waiting (or wait for KFP's retry)

Reading what the job and its pods say (kinds, conditions, failures, logs) is
components/train/jobstatus.py; the API calls themselves (timeouts, transient failures, the
owner reference) components/train/kube.py. It talks to the Kubernetes API directly (the `kubernetes` client
the images already carry, as kfp does), one loop for both job kinds; the specs are
components/train/jobspec.py. The job is owned by the task's pod (as KFP's launcher names it, or
its hostname) when the job goes to the pod's own namespace, so the cluster's garbage collector
removes a job whose task pod is deleted.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from components.core.config import RunConfig
from components.core.config_cluster import TrainJobSection
from components.core.errors import StageError
from components.train import jobspec
from components.train.jobstatus import (
    FATAL_WAIT_S,
    KINDS,
    JobKind,
    LogFollower,
    fatal_waits,
    job_state,
    pod_failures,
    suspended,
)
from components.train.kube import (
    API_GRACE_S,
    REQUEST_TIMEOUT,
    Api,
    default_client,
    list_pods,
    own_namespace,
    owner_of_job,
    tolerant_delete,
)


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
            raise StageError(
                f"train job {job} completed but {layout.checkpoint(i + 1)} is not "
                "committed; see the job's logs above"
            ) from None
    place = {
        "job": job,
        "nodes": cfg.train.nodes,
        "processes_per_node": jobspec.processes_per_node(cfg),
    }
    if "--segment" in stage_args:
        seg = int(stage_args[stage_args.index("--segment") + 1])
        return {"task": "train", "segment": seg, "steps": len(its), **place}
    return {
        "skipped": False,
        "uri": layout.checkpoint(its[0] + 1),
        "stats": manifests[0].get("stats", {}),
        **place,
    }


class _Cancelled(BaseException):
    """SIGTERM while the job runs: the task is being stopped; the job must go with it."""


def run_job(
    cfg: RunConfig,
    stage_args: list[str],
    *,
    attempt: str | None = None,
    retried: bool = False,
    api_client=None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    api_grace_s: float = API_GRACE_S,
) -> dict[str, Any]:
    """Submit the job for `stage_args` (the train stage's `--segment S [--attempt A]
    [--retried]` or `--iteration I`), wait for it, delete it; the committed result (see the
    module docstring). Any failure is also recorded as the train task's failure marker of
    `attempt` (so the generate, verify and evaluate workers stop waiting, or, when KFP retries
    the task (`retried`), wait for the retry), unless the job's ranks recorded their own; a
    marker an earlier try of the task left is cleared first."""
    from components.core.store import StoreError
    from components.core.warm import RunStatus

    previous = _on_sigterm()  # before anything is created: a cancel must never leak a job
    try:
        if attempt is not None:
            with contextlib.suppress(StoreError):
                RunStatus.of(cfg, attempt).clear("train")
        return _run_job(
            cfg,
            stage_args,
            api_client=api_client,
            out=out or sys.stdout,
            sleep=sleep,
            monotonic=monotonic,
            api_grace_s=api_grace_s,
        )
    except BaseException as e:
        if attempt is not None:
            _mark_failed(cfg, attempt, retried, e)
        if isinstance(e, _Cancelled):
            raise SystemExit(143) from None
        raise
    finally:
        _restore_sigterm(previous)


def _mark_failed(cfg: RunConfig, attempt: str, retried: bool, e: BaseException) -> None:
    from components.core.store import StoreError
    from components.core.warm import RunStatus, retry_grace_s

    try:
        status = RunStatus.of(cfg, attempt)
        if "train" in status.failures():  # a rank's own marker (this try's) says more
            return
        error = "the train task was stopped (SIGTERM)" if isinstance(e, _Cancelled) else e
        status.mark_failed("train", error, grace_s=retry_grace_s(cfg, "train") if retried else 0.0)
    except StoreError:  # the store may be why the step failed; the task's exit still tells
        pass


def _run_job(cfg, stage_args, *, api_client, out, sleep, monotonic, api_grace_s):
    job = _Submission(
        cfg,
        stage_args,
        api_client=api_client,
        out=out,
        sleep=sleep,
        monotonic=monotonic,
        api_grace_s=api_grace_s,
    )
    # What an earlier submission of this step left (its task died before cleaning up) goes
    # first, pods and all: committed iterations are skipped by the stage itself, so nothing is
    # trained twice, and no old rank can still write.
    job.clear_leftovers()
    job.name_it()
    try:
        job.create()
        job.follow()
    except _Cancelled:
        job.say(f"stopped: deleting {job.what}")
        for d in pod_failures(job.pods):  # why it had not finished, if a pod says
            job.say(f"  {d}")
        raise
    finally:
        if job.sent:  # nothing was created when no create was sent
            job.delete()
    return committed_result(cfg, stage_args, job.name)


class _Submission:
    """One train job of this step on the cluster: the API clients it is submitted through, its
    name and uid once known, and the pods the last poll saw."""

    def __init__(self, cfg, stage_args, *, api_client, out, sleep, monotonic, api_grace_s):
        from kubernetes import client as k8s

        self.cfg, self.stage_args = cfg, stage_args
        self.sleep, self.monotonic = sleep, monotonic
        self.kind = kind = KINDS[cfg.cluster.train_job.api]
        self.tj = tj = cfg.cluster.train_job
        self.namespace = tj.namespace or own_namespace()
        try:
            api_client = api_client or default_client()
        except Exception as e:  # noqa: BLE001 - no in-cluster config and no kubeconfig
            raise StageError(
                f"cannot reach the Kubernetes API to submit the {kind.kind}: {e}"
            ) from None
        self.custom, self.core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
        self.followers = LogFollower(self.core, self.namespace, kind.container, out)
        self.say = self.followers.say
        self.api = Api(sleep, monotonic, api_grace_s, tj.poll_s, self.say)
        self.ref = dict(
            group=kind.group, version=kind.version, namespace=self.namespace, plural=kind.plural
        )
        self.step = f"{jobspec.STEP_LABEL}={jobspec.step_key(cfg, stage_args)}"
        self.no_crd = {
            404: f"the cluster has no {kind.plural}.{kind.group} (install Kubeflow "
            + ("Trainer v2.2 or later" if kind.kind == "TrainJob" else "Training Operator")
            + "; docs/deploy.md, Multi-node training)"
        }
        self.name = self.what = ""
        self.body: dict[str, Any] = {}
        self.uid: str | None = None  # the created job's uid: only this job is ever deleted
        self.sent = False  # a create was sent (its outcome may be unknown)
        self.pods: list[dict[str, Any]] = []
        # what the follow loop carries from one poll to the next
        self.waits: list[str] = []
        self.pending_since: float | None = None
        self.fatal_since: float | None = None

    def clear_leftovers(self) -> None:
        _clear_leftovers(
            self.api,
            self.custom,
            self.core,
            self.ref,
            self.kind,
            self.step,
            self.say,
            self.sleep,
            self.monotonic,
            self.no_crd,
        )

    def name_it(self) -> None:
        """A name never used before, and the job's spec under it."""
        import secrets

        cfg, stage_args = self.cfg, self.stage_args
        self.name = jobspec.job_name(cfg, stage_args, secrets.token_hex(3)[:5])
        self.body = jobspec.job_spec(
            cfg,
            stage_args,
            name=self.name,
            namespace=self.namespace,
            iterations=len(iterations_served(cfg, stage_args)),
            owner=owner_of_job(self.core, self.namespace),
        )
        self.what = f"{self.kind.kind} {self.namespace}/{self.name}"

    def create(self) -> None:
        created = self.api(
            f"creating {self.what}",
            lambda **kw: self._create_once(),
            errors=self.no_crd,
            hint=lambda e: _version_hint(self.kind, e),
        )
        self.uid = ((created or {}).get("metadata") or {}).get("uid") or None
        self.say(
            f"submitted {self.what}: {self.cfg.train.nodes} nodes x "
            f"{jobspec.processes_per_node(self.cfg)} rank(s)"
        )

    def _create_once(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        self.sent = True
        try:
            return self.custom.create_namespaced_custom_object(
                **self.ref,
                body=self.body,
                field_manager="rlvr",
                field_validation="Strict",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as e:
            if e.status != 409:
                raise
            # the name is this submission's own: an earlier create of it landed after all
            return self.custom.get_namespaced_custom_object(
                **self.ref, name=self.name, _request_timeout=REQUEST_TIMEOUT
            )

    def follow(self) -> None:
        """Poll the job until it leaves running, streaming its pods' logs; a StageError when it
        failed, or when its pods wait past what `check_waits` allows."""
        gone = {
            404: "it was deleted while it ran (by someone else: this task deletes it only "
            "when it ends); rerun the step"
        }
        while True:
            obj = self.api(
                f"reading {self.what}",
                self.custom.get_namespaced_custom_object,
                **self.ref,
                name=self.name,
                errors=gone,
            )
            self.pods = self.api(
                f"listing the pods of {self.what}",
                list_pods,
                self.core,
                self.namespace,
                f"{self.kind.pod_label}={self.name}",
            )
            state, message = job_state(self.kind, obj)
            self.followers.update(self.pods)
            if state != "running":
                break
            self.check_waits(obj)
            self.sleep(self.tj.poll_s)
        self.followers.join(timeout_s=30.0)
        if state == "failed":
            details = pod_failures(self.pods)
            raise StageError(
                f"{self.what} failed: {message or 'no reason given'}"
                + "".join(f"\n  {d}" for d in details)
            )
        self.say(f"{self.what} completed: {message}" if message else f"{self.what} completed")

    def check_waits(self, obj: dict[str, Any]) -> None:
        """Say why pods wait (unschedulable, image pull) when that changes; a StageError when
        they have been Pending past cluster.train_job.schedule_timeout_s, or a node cannot
        start at all (FATAL_WAITS) for FATAL_WAIT_S."""
        pods, tj = self.pods, self.tj
        now_waiting = pod_failures(pods)  # pods that wait: unschedulable, image pull
        if now_waiting != self.waits and now_waiting:
            self.say("not running: " + "; ".join(now_waiting))
        self.waits = now_waiting
        now = self.monotonic()
        # No pod at all counts as waiting too (a controller that is not running, or a
        # runtime it cannot find, leaves the job podless forever), unless a queue holds the
        # job suspended.
        pending = (not pods and not suspended(obj)) or any(
            (p.get("status") or {}).get("phase") == "Pending" for p in pods
        )
        self.pending_since = _since(self.pending_since, pending, now)
        if (
            tj.schedule_timeout_s
            and self.pending_since is not None
            and now - self.pending_since > tj.schedule_timeout_s
        ):
            why = now_waiting if pods else [_no_pods(self.kind, tj)]
            raise StageError(
                f"{self.what}: pods still Pending after {tj.schedule_timeout_s:.0f} s "
                "(cluster.train_job.schedule_timeout_s)" + "".join(f"\n  {d}" for d in why)
            )
        fatal = fatal_waits(pods)
        self.fatal_since = _since(self.fatal_since, bool(fatal), now)
        if self.fatal_since is not None and now - self.fatal_since > FATAL_WAIT_S:
            raise StageError(
                f"{self.what}: a node cannot start, and waiting will not help "
                "(fix the image or what the pod refers to, then rerun)"
                + "".join(f"\n  {d}" for d in fatal)
            )

    def delete(self) -> None:
        """Delete the job (by its uid once known), and say how by hand if that fails."""
        from kubernetes import client as k8s

        options = k8s.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=k8s.V1Preconditions(uid=self.uid) if self.uid else None,
        )
        try:
            with _sigterm_deferred():  # a second SIGTERM must not leave the job behind
                self.api(
                    f"deleting {self.what}",
                    tolerant_delete(self.custom),
                    **self.ref,
                    name=self.name,
                    body=options,
                )
        except StageError as e:
            self.say(
                f"could not delete {self.what} ({e}): delete it by hand (kubectl -n "
                f"{self.namespace} delete {self.kind.plural} {self.name})"
            )


def _no_pods(kind: JobKind, tj: TrainJobSection) -> str:
    """Why a job can sit with no pod at all, and where to look."""
    if kind.kind == "TrainJob":
        check = (
            f"Kubeflow Trainer's controller (and JobSet's) is running and the "
            f"ClusterTrainingRuntime {tj.runtime!r} exists"
        )
    else:
        check = "the Training Operator is running"
    return (
        f"no pod was created: check that {check} (kubectl describe {kind.plural} shows the "
        "controller's events)"
    )


def _since(start: float | None, holds: bool, now: float) -> float | None:
    """When a condition seen at every poll began to hold without a break (None: it does not)."""
    if not holds:
        return None
    return now if start is None else start


def _clear_leftovers(
    api: Api,
    custom,
    core,
    ref,
    kind: JobKind,
    step: str,
    say,
    sleep,
    monotonic,
    no_crd: dict[int, str],
    timeout_s: float = 600.0,
) -> None:
    """Delete every job of this step (label `step`) in the foreground, each by its uid, and wait
    until neither the jobs nor their pods remain."""
    from kubernetes import client as k8s

    def listed() -> list[dict[str, Any]]:
        found = api(
            f"listing the {kind.plural} of this step",
            custom.list_namespaced_custom_object,
            **ref,
            label_selector=step,
            errors=no_crd,
        )
        return found.get("items") or []

    items = listed()
    if not items:
        return
    for job in items:
        meta = job["metadata"]
        say(
            f"{kind.kind} {meta['name']} of this step exists (left by an earlier attempt); "
            "deleting it and its pods"
        )
        options = k8s.V1DeleteOptions(
            propagation_policy="Foreground", preconditions=k8s.V1Preconditions(uid=meta.get("uid"))
        )
        api(
            f"deleting the leftover {meta['name']}",
            tolerant_delete(custom),
            **ref,
            name=meta["name"],
            body=options,
        )
    deadline = monotonic() + timeout_s
    while monotonic() < deadline:
        pods = api("listing the leftovers' pods", list_pods, core, ref["namespace"], step)
        if not listed() and not pods:
            return
        sleep(5.0)
    raise StageError(
        f"the leftover {kind.plural} of this step ({step}) and their pods were not "
        f"gone within {timeout_s:.0f} s; delete them by hand"
    )


def _version_hint(kind: JobKind, e) -> str:
    """A hint when the cluster's Trainer predates the TrainJob fields rlvr writes."""
    text = f"{getattr(e, 'body', '')}"
    if kind.kind == "TrainJob" and "unknown field" in text:
        return (
            "\n  (rlvr's TrainJobs need Kubeflow Trainer v2.2 or later: runtimePatches and "
            "activeDeadlineSeconds came in v2.2; or set cluster.train_job.api: "
            "training-operator on a Training Operator cluster)"
        )
    return ""


def _on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return None

    def cancel(signum, frame):
        raise _Cancelled()

    return signal.signal(signal.SIGTERM, cancel)


@contextlib.contextmanager
def _sigterm_deferred():
    """SIGTERM held back (delivered on leaving) while the block runs, in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
