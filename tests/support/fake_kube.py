"""A loopback HTTP server that answers the few Kubernetes API endpoints the multi-node train task
uses (components/train/jobs.py) and records every request, so the real `kubernetes` client can
be driven through submit, follow and delete without a cluster (as KFP's client tests do)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from components.train import jobspec


class FakeKube:
    """The Kubernetes API endpoints the train task uses: create / get / list (by label) /
    delete (with a uid precondition) of one custom resource kind, pods by label selector, a pod,
    and a pod's log (followed). Each created job answers GETs with `statuses` in turn (the last
    one repeats); an int there is an error answer of that HTTP status instead (404 also removes
    the job). `existing` holds jobs present before the test (leftovers), whose pods
    (`leftover_pods`) outlive their deletion by `pod_lag` pod lists."""

    def __init__(self, statuses: list[dict | int], pods: list[dict], logs: dict[str, list[str]]):
        self.statuses, self.pods, self.logs = statuses, pods, logs
        self.jobs: dict[str, dict] = {}
        self.gets: dict[str, int] = {}
        self.requests: list[tuple[str, str, dict, dict]] = []
        self.existing: dict[str, dict] = {}
        self.leftover_pods: list[dict] = []
        self.pod_lag = 0
        self.log_cut: dict[str, int] = {}  # pod -> how many times its log stream ends early
        self.served: dict[str, int] = {}  # pod -> log lines served so far
        self.uids = 0
        self.create_error: tuple[int, dict] | None = None
        self.no_crd = False  # the job kind's CRD is not installed
        self.on_poll = lambda: None  # what happens in the job while the task polls it
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else {}

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, message: str) -> None:
                self._send(code, {"kind": "Status", "code": code, "message": message})

            def _route(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                body = self._body() if self.command in ("POST", "DELETE") else {}
                outer.requests.append((self.command, url.path, query, body))
                parts = url.path.strip("/").split("/")
                if parts[:2] == ["api", "v1"]:
                    return self._core(parts[4:], query)
                name = parts[6] if len(parts) > 6 else None
                everything = {**outer.existing, **outer.jobs}
                if self.command == "POST":
                    if outer.create_error:
                        return self._send(outer.create_error[0], outer.create_error[1])
                    name = body["metadata"]["name"]
                    if name in everything:
                        return self._status(409, f"{name} already exists")
                    outer.uids += 1
                    body["metadata"]["uid"] = f"uid-{outer.uids}"
                    outer.jobs[name] = body
                    return self._send(201, body)
                if self.command == "DELETE":
                    if name not in everything:
                        return self._status(404, f"{name} not found")
                    want = (body.get("preconditions") or {}).get("uid")
                    if want and want != everything[name]["metadata"].get("uid"):
                        return self._status(409, "Precondition failed: UID in precondition")
                    outer.jobs.pop(name, None) or outer.existing.pop(name, None)
                    return self._send(200, {"kind": "Status", "status": "Success"})
                if outer.no_crd:
                    return self._status(404, "the server could not find the requested resource")
                if name is None:  # a list, by label
                    key, _, value = query.get("labelSelector", "").partition("=")
                    items = [
                        j
                        for j in everything.values()
                        if j["metadata"].get("labels", {}).get(key) == value
                    ]
                    return self._send(200, {"kind": "List", "items": items})
                if name in outer.existing:
                    return self._send(200, outer.existing[name])
                if name not in outer.jobs:
                    return self._status(404, f"{name} not found")
                outer.on_poll()
                n = outer.gets[name] = outer.gets.get(name, 0) + 1
                status = outer.statuses[min(n, len(outer.statuses)) - 1]
                if isinstance(status, int):  # an error answer (404: the job is gone)
                    if status == 404:
                        outer.jobs.pop(name)
                    return self._status(status, f"answer {status}")
                return self._send(200, {**outer.jobs[name], "status": status})

            def _core(self, parts: list[str], query: dict) -> None:
                if parts == ["pods"]:
                    selector = query.get("labelSelector", "")
                    if selector.startswith(jobspec.STEP_LABEL):  # a step's pods: leftovers'
                        key, _, value = selector.partition("=")
                        if any(
                            j["metadata"].get("labels", {}).get(key) == value
                            for j in outer.existing.values()
                        ):
                            return self._send(
                                200, {"kind": "PodList", "items": outer.leftover_pods}
                            )
                        outer.pod_lag -= 1
                        items = outer.leftover_pods if outer.pod_lag >= 0 else []
                        return self._send(200, {"kind": "PodList", "items": items})
                    return self._send(200, {"kind": "PodList", "items": outer.pods})
                if len(parts) == 2:  # the task's own pod
                    return self._send(
                        200,
                        {
                            "kind": "Pod",
                            "metadata": {"name": parts[1], "uid": "uid-of-" + parts[1]},
                        },
                    )
                pod = parts[1]
                lines = outer.logs.get(pod, [])
                # a stream from the start, or (sinceSeconds) from where the last one stopped
                start = outer.served.get(pod, 0) if "sinceSeconds" in query else 0
                stop = len(lines)
                if outer.log_cut.get(pod):  # this stream drops after one line
                    outer.log_cut[pod] -= 1
                    stop = start + 1
                lines = lines[start:stop]
                outer.served[pod] = start + len(lines)
                data = "".join(line + "\n" for line in lines).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _route

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self):
        from kubernetes import client

        conf = client.Configuration(host=f"http://127.0.0.1:{self.server.server_port}")
        return client.ApiClient(conf)

    def calls(self, method: str) -> list[tuple[str, dict, dict]]:
        return [(p, q, b) for m, p, q, b in self.requests if m == method]

    def created(self) -> str:
        """The name of the one job the task created."""
        ((_, _, body),) = self.calls("POST")
        return body["metadata"]["name"]
