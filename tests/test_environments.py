"""The OpenEnv WebSocket client (components/generate/environments.py) against a loopback server
(tests/envserver.py): an episode, an error reply, and a server that dies, hangs or is absent, each
a clear EnvError naming the URL."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("websockets", reason="environments need websockets (the 'env' extra)")

from components.generate.environments import EnvError, EnvSession, ws_url  # noqa: E402
from tests.envserver import GuessServer  # noqa: E402


def test_urls():
    assert ws_url("http://h:1") == "ws://h:1/ws" and ws_url("https://h/") == "wss://h/ws"
    assert ws_url("ws://h:1/ws") == "ws://h:1/ws"
    with pytest.raises(ValueError, match="expected http"):
        ws_url("h:1")


def test_an_episode_by_bisection():
    server = GuessServer()
    try:
        env = EnvSession(server.url)
        first = env.reset(seed=7)
        assert first.observation == {"feedback": "guess a number from 1 to 100"}
        assert first.reward is None and not first.done
        lo, hi, steps = 1, 100, 0
        while True:
            guess = (lo + hi) // 2
            r = env.step({"guess": guess})
            steps += 1
            if r.done:
                break
            lo, hi = (guess + 1, hi) if r.observation["feedback"] == "higher" else (lo, guess - 1)
        assert guess == random.Random(7).randint(1, 100) and r.reward == 1.0 and steps <= 7
        with pytest.raises(EnvError, match="refused the step: step needs an integer 'guess'"):
            env.step({"guess": "five"})
        env.close()
    finally:
        server.close()


def test_a_server_that_dies_hangs_or_is_absent_is_a_clear_error():
    dying = GuessServer(die_after=1)
    try:
        env = EnvSession(dying.url)
        env.reset(seed=1)
        env.step({"guess": 50})
        with pytest.raises(
            EnvError, match=r"ws://127.0.0.1:\d+/ws closed the connection mid-episode"
        ):
            env.step({"guess": 25})
        env.close()  # closing a dead session is fine
    finally:
        dying.close()
    hanging = GuessServer(hang=True)
    try:
        env = EnvSession(hanging.url, timeout_s=0.5)
        env.reset(seed=1)
        with pytest.raises(EnvError, match="did not answer a step within 0.5 s"):
            env.step({"guess": 50})
        env.close()
    finally:
        hanging.close()
    port = GuessServer()
    url = port.url
    port.close()
    with pytest.raises(EnvError, match="cannot connect .*is the server running"):
        EnvSession(url, connect_timeout_s=2)
