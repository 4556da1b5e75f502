"""Stateful environments over OpenEnv's WebSocket protocol .

An environment runs as its own server (on a cluster: its own container) and rlvr speaks OpenEnv's
stateful path to it with this small client, importing nothing of openenv: one WebSocket to
`ws://HOST/ws` per trajectory (one connection is one environment instance), JSON text messages

    -> {"type": "reset", "data": {"seed": ...}}     <- {"type": "observation", "data":
    -> {"type": "step", "data": {<action fields>}}        {"observation": {...}, "reward": r,
    -> {"type": "close"}                                   "done": bool}}
                                                     <- {"type": "error", "data": {"message",
                                                                                   "code"}}

(docs/tools.md, "Environments over OpenEnv"). The policy acts through a tool call naming the
environment; its arguments are the action's fields. Every failure of the server (a refused
connection, a connection closed mid-episode, no answer within the timeout, an error reply) is an
`EnvError` naming the URL and the cause: the loop ends that trajectory with the error recorded,
and the stage goes on. A session is never reconnected: a new connection would be a new,
never-reset environment.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from components.core.errors import UserError


class EnvError(RuntimeError):
    """The environment server failed this episode; the message says where and why."""


@dataclass(frozen=True)
class StepResult:
    observation: dict[str, Any]
    reward: float | None
    done: bool


def ws_url(url: str) -> str:
    """`http(s)://host:port` or `ws(s)://host:port[/ws]` as the session endpoint `ws(s)://.../ws`."""
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.startswith(("ws://", "wss://")):
        raise UserError(
            f"generate.environment.url {url!r}: expected http(s)://HOST:PORT or ws(s)://HOST:PORT"
        )
    return url if url.rstrip("/").endswith("/ws") else url.rstrip("/") + "/ws"


class EnvSession:
    """One episode of one environment: `reset`, then `step`s, then `close`."""

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, timeout_s: float = 60.0):
        from websockets.sync.client import connect

        self.url, self.timeout_s = ws_url(url), timeout_s
        self._stack = contextlib.ExitStack()  # websockets >= 17 wants connect() as a context
        try:
            self._ws = self._stack.enter_context(
                connect(
                    self.url,
                    open_timeout=connect_timeout_s,
                    close_timeout=1.0,
                    ping_interval=None,
                    max_size=16 * 2**20,
                )
            )
        except (OSError, TimeoutError) as e:
            raise EnvError(
                f"environment {self.url}: cannot connect ({type(e).__name__}: "
                f"{e}); is the server running?"
            ) from None
        except Exception as e:  # noqa: BLE001 - websockets' handshake errors
            raise EnvError(f"environment {self.url}: the handshake failed ({e})") from None

    def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(json.dumps(message))
            reply = json.loads(self._ws.recv(timeout=self.timeout_s))
        except ConnectionClosed as e:
            raise EnvError(
                f"environment {self.url} closed the connection mid-episode "
                f"({e.rcvd.code if e.rcvd else 'no close frame'})"
            ) from None
        except TimeoutError:
            raise EnvError(
                f"environment {self.url} did not answer a {message['type']} within "
                f"{self.timeout_s:g} s"
            ) from None
        except (OSError, ValueError) as e:
            raise EnvError(f"environment {self.url}: {type(e).__name__}: {e}") from None
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise EnvError(
                f"environment {self.url} refused the {message['type']}: "
                f"{data.get('message')} ({data.get('code')})"
            )
        return reply

    def _result(self, reply: dict[str, Any]) -> StepResult:
        data = reply.get("data") or {}
        if reply.get("type") != "observation" or not isinstance(data.get("observation"), dict):
            raise EnvError(
                f"environment {self.url} answered {str(reply)[:200]!r}, not an observation"
            )
        reward = data.get("reward")
        return StepResult(
            data["observation"],
            None if reward is None else float(reward),
            bool(data.get("done", False)),
        )

    def reset(self, **kwargs: Any) -> StepResult:
        return self._result(self._exchange({"type": "reset", "data": kwargs}))

    def step(self, action: dict[str, Any]) -> StepResult:
        return self._result(self._exchange({"type": "step", "data": action}))

    def close(self) -> None:
        try:
            self._ws.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001, S110 - closing a dead session is fine
            pass
        self._stack.close()
