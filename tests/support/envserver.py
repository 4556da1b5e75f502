"""A loopback environment server speaking OpenEnv's WebSocket protocol (`/ws`), for tests: a
guess-the-number game. reset(seed) picks a number in 1..100; step({"guess": n}) answers
"higher", "lower" or "correct" (reward 1, done). `die_after` steps, the server drops every
connection without a close frame (a server that dies mid-episode); `hang` makes it stop
answering."""

from __future__ import annotations

import json
import random
import threading

from websockets.sync.server import serve


class GuessServer:
    def __init__(self, *, die_after: int | None = None, hang: bool = False) -> None:
        self.die_after, self.hang, self.steps = die_after, hang, 0
        self._stop = threading.Event()
        self.server = serve(self._session, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _session(self, ws) -> None:
        if ws.request.path != "/ws":
            ws.close(1008, "not found")
            return
        target = None
        for raw in ws:
            msg = json.loads(raw)
            kind, data = msg.get("type"), msg.get("data") or {}
            if kind == "close":
                return
            if kind == "reset":
                target = random.Random(data.get("seed", 0)).randint(1, 100)
                reply = {
                    "observation": {"feedback": "guess a number from 1 to 100"},
                    "reward": None,
                    "done": False,
                }
            elif kind == "step":
                self.steps += 1
                if self.die_after is not None and self.steps > self.die_after:
                    ws.socket.close()  # the process is gone: no close frame
                    return
                if self.hang:
                    self._stop.wait(30)
                    return
                guess = data.get("guess")
                if target is None or not isinstance(guess, int):
                    ws.send(
                        json.dumps(
                            {
                                "type": "error",
                                "data": {
                                    "message": "step needs an integer 'guess' after reset",
                                    "code": "VALIDATION_ERROR",
                                },
                            }
                        )
                    )
                    continue
                feedback = "correct" if guess == target else "higher" if guess < target else "lower"
                reply = {
                    "observation": {"feedback": feedback},
                    "reward": 1.0 if guess == target else 0.0,
                    "done": guess == target,
                }
            else:
                ws.send(
                    json.dumps(
                        {
                            "type": "error",
                            "data": {"message": f"unknown {kind}", "code": "UNKNOWN_TYPE"},
                        }
                    )
                )
                continue
            ws.send(json.dumps({"type": "observation", "data": reply}))

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
