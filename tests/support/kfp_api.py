"""A loopback HTTP server that implements the few KFP v2beta1 endpoints `rlvr submit`, `schedule`
and `runs` use, and records every request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeKFP:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                outer.requests.append((self.command, self.path, body))
                path = self.path.split("?")[0]
                if path == "/apis/v2beta1/experiments" and self.command == "GET":
                    out = {"experiments": []}
                elif path == "/apis/v2beta1/experiments":
                    out = {"experiment_id": "exp-1", "display_name": body.get("display_name")}
                elif path == "/apis/v2beta1/runs" and self.command == "POST":
                    out = {"run_id": "run-123", "display_name": body.get("display_name")}
                elif path == "/apis/v2beta1/runs":
                    out = {
                        "runs": [
                            {"run_id": "run-123", "display_name": "demo", "state": "SUCCEEDED"}
                        ],
                        "total_size": 1,
                    }
                elif path == "/apis/v2beta1/recurringruns":
                    out = {"recurring_run_id": "rr-7"}
                else:
                    out = {}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _reply

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[dict]:
        return [b for m, p, b in self.requests if m == "POST" and p.split("?")[0] == path]
