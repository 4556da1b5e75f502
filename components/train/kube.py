"""The Kubernetes API as the multi-node train task uses it (components/train/jobs.py): the
client, the task pod's own namespace and owner reference, every call with a timeout and the
transient failures ridden out, listing pods, deleting what may already be gone.

It talks to the API directly through the `kubernetes` client the images already carry, as kfp
does.
"""

from __future__ import annotations

import os
from typing import Any

from components.core.errors import StageError

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: How long the API server may fail to answer a poll (restarts, upgrades, throttling) before the
#: task gives up on a step that may run for hours; the job is deleted then, as on any failure.
API_GRACE_S = 300.0
#: (connect, read) seconds of one API call; a hung connection must not hang the follow loop
REQUEST_TIMEOUT = (10, 60)
#: statuses of an API answer worth asking again (throttled, or the server or its proxy failing)
TRANSIENT_STATUSES = {0, 429, 500, 502, 503, 504}


def own_namespace() -> str:
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def default_client():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def owner_of_job(core, namespace: str) -> dict[str, Any] | None:
    """An owner reference to the pod this task runs in, so deleting the task's pod deletes the
    job too; None when the job goes to another namespace, or the pod's own is unknown
    (Kubernetes has no cross-namespace owners: its garbage collector would take the owner for
    gone and delete the job at once), or the pod is unknown. KFP's launcher gives the pod's name and uid (KFP_POD_NAME, KFP_POD_UID);
    elsewhere the name is the hostname (cut to 63 characters) and the uid is read."""
    if not os.path.exists(NAMESPACE_FILE) or own_namespace() != namespace:
        return None  # (the pod's namespace unknown: no token mounted, a kubeconfig instead)
    name, uid = os.environ.get("KFP_POD_NAME"), os.environ.get("KFP_POD_UID")
    if not (name and uid):
        name = os.environ.get("HOSTNAME")
        if not name:
            return None
        try:
            uid = core.read_namespaced_pod(name, namespace, _request_timeout=REQUEST_TIMEOUT)
            uid = uid.metadata.uid
        except Exception:  # noqa: BLE001 - no owner: the job is still deleted by this task
            return None
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": name,
        "uid": uid,
        "blockOwnerDeletion": False,
        "controller": False,
    }


class Api:
    """Every call to the Kubernetes API: a request timeout; throttling, a failing server and
    no answer at all ridden out for `grace_s`; any other error a StageError saying what was
    being done (`errors` maps an HTTP status to what it means there)."""

    def __init__(self, sleep, monotonic, grace_s: float, poll_s: float, say) -> None:
        self.sleep, self.monotonic, self.grace_s, self.poll_s, self.say = (
            sleep,
            monotonic,
            grace_s,
            poll_s,
            say,
        )

    def __call__(
        self, doing: str, fn, *args, errors: dict[int, str] | None = None, hint=None, **kwargs
    ):
        failing_since = None
        while True:
            try:
                return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            except Exception as e:  # noqa: BLE001 - sorted below
                status = getattr(e, "status", None)
                if errors and status in errors:
                    raise StageError(f"{doing}: {errors[status]}") from None
                if not transient(e):
                    raise StageError(
                        f"{doing} failed: {api_message(e)}" + (hint(e) if hint else "")
                    ) from None
                now = self.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self.grace_s:
                    raise StageError(
                        f"the Kubernetes API did not answer for {self.grace_s:.0f} s "
                        f"while {doing}: {api_message(e)}"
                    ) from None
                self.say(f"{doing} failed ({api_message(e)}); trying again")
                self.sleep(self.poll_s)


def tolerant_delete(custom):
    """delete_namespaced_custom_object for which gone (404) and replaced meanwhile (409: the uid
    changed) are done too."""
    from kubernetes.client.exceptions import ApiException

    def delete(**kwargs):
        try:
            return custom.delete_namespaced_custom_object(**kwargs)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            return None

    return delete


def list_pods(
    core, namespace: str, selector: str, _request_timeout=REQUEST_TIMEOUT
) -> list[dict[str, Any]]:
    """The job's pods as plain JSON (the API's own field names)."""
    import json

    resp = core.list_namespaced_pod(
        namespace,
        label_selector=selector,
        _preload_content=False,
        _request_timeout=_request_timeout,
    )
    return json.loads(resp.data).get("items", [])


def transient(e: Exception) -> bool:
    """An API answer worth asking again: throttling, a failing server or proxy, or no answer at
    all (a connection refused, reset or timed out while the API server restarts)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(e, ApiException):
        return (e.status or 0) in TRANSIENT_STATUSES
    return isinstance(e, HTTPError | OSError)


def api_message(e) -> str:
    import json

    if not hasattr(e, "status"):  # no answer at all: the connection's own error
        return f"{type(e).__name__}: {e}"
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except (TypeError, ValueError):
        return f"{e.status} {e.reason}"
