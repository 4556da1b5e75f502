"""The OpenEnv WebSocket client (components/generate/environments.py) against a loopback server
(tests/support/envserver.py): an episode, an error reply, and a server that dies, hangs or is absent, each
a clear EnvError naming the URL."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("websockets", reason="environments need websockets (the 'env' extra)")

from components.generate.environments import EnvError, EnvSession, ws_url  # noqa: E402
from tests.support.envserver import GuessServer  # noqa: E402


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


class BisectingPolicy:
    """A scripted policy for the guessing game (stands in for sampling only): it reads the
    feedback so far from its prompt, as the model would, and bisects; once told "correct" it
    answers. Everything around it is real: the generate stage's loop and writer, the server,
    verify's scorer."""

    def __init__(self, tokenizer) -> None:
        from components.model.backends import BackendInfo

        self.tok, self.info = tokenizer, BackendInfo("scripted", "0")

    def generate(self, requests, spec):
        import re

        from components.model.backends import Sample

        out = []
        for r in requests:
            text = self.tok.decode(r.prompt_token_ids)
            guesses = [int(g) for g in re.findall(r'"guess": (\d+)', text)]
            words = re.findall(r'"feedback": "(\w+)"', text)
            lo, hi = 1, 100
            for g, w in zip(guesses, words, strict=False):
                lo, hi = (g + 1, hi) if w == "higher" else (lo, g - 1) if w == "lower" else (g, g)
            reply = (
                f"\\boxed{{{guesses[-1]}}}"
                if words and words[-1] == "correct"
                else f'<tool_call>{{"name": "env", "arguments": {{"guess": {(lo + hi) // 2}}}}}'
                "</tool_call>"
            )
            ids = self.tok(reply, add_special_tokens=False)["input_ids"]
            out.append(Sample(r.prompt_id, 0, reply, ids, [-0.1] * len(ids), "stop"))
        yield out


def _stage_rollouts(tmp_path, tiny_assets, server, name):
    """The generate stage's rollouts of two prompts x 2 samples in the server's game."""
    from components.core.commit import OutputDir
    from components.core.config import EnvironmentSection
    from components.core.store import LocalStore
    from components.generate.rollouts import (
        LoadedPolicy,
        PromptRow,
        RolloutSettings,
        generate_rollouts,
    )
    from components.generate.tools import ToolBox
    from components.model.backends import SamplingSpec
    from components.model.checkpoint import load_policy

    _, tok = load_policy(tiny_assets / "base")
    prompts = [
        PromptRow(f"p{i}", "guess", "0", [{"role": "user", "content": f"G{i}:"}], None)
        for i in range(2)
    ]
    out = OutputDir(LocalStore(), str(tmp_path / name), "generate")
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=100, seed=7)
    box = ToolBox({})
    try:
        settings = RolloutSettings(
            max_prompt_tokens=64,
            rows_per_part=100,
            tools=box,
            max_turns=10,
            max_response_tokens=4000,
            environment=EnvironmentSection(url=server.url, timeout_s=5),
        )
        stats = generate_rollouts(
            out,
            LoadedPolicy(BisectingPolicy(tok), tok, "base", 0),
            prompts,
            spec,
            settings,
            iteration=0,
        )
    finally:
        box.close()
    out.commit(stats)
    import pyarrow.parquet as pq

    return pq.read_table(str(tmp_path / name / "part-00000.parquet")), stats


def test_an_environment_episode_end_to_end_through_generate_and_verify(tmp_path, tiny_assets):
    """Each trajectory plays its own session (reset with its seed) until the server says
    "correct" (reward 1, done) and answers: the rollouts keep the turns and `env_reward`, and
    verify adds the environment's reward to the verifier's as the component 'env'."""
    from components.verify.scoring import score_table

    server = GuessServer()
    try:
        table, stats = _stage_rollouts(tmp_path, tiny_assets, server, "ok")
    finally:
        server.close()
    rows = table.to_pylist()
    assert len(rows) == 4 and stats["env_errors"] == 0
    for row in rows:
        assert row["finish_reason"] == "stop" and row["env_reward"] == 1.0
        tool_turns = [t for t in row["turns"] if t["role"] == "tool"]
        assert '"correct"' in tool_turns[-1]["content"] and len(tool_turns) <= 7  # bisection
        assert row["response"].startswith("\\boxed{")
    kw = dict(num_workers=0, timeout_s=5, max_error_fraction=0.0)
    scored, _ = score_table(table, {"guess": "math"}, **kw)
    assert scored.column("reward").to_pylist() == [1.0] * 4  # math 0 (ground truth "0") + env 1
    components = scored.column("reward_components").to_pylist()[0]
    assert {c["name"]: c["value"] for c in components} == {"env": 1.0, "math": 0.0}
    off, _ = score_table(table, {"guess": "math"}, env_reward_weight=0.0, **kw)
    assert off.column("reward").to_pylist() == [0.0] * 4
    _five_readers_agree(str(tmp_path / "ok" / "part-00000.parquet"), rows)


def _five_readers_agree(path: str, rows: list[dict]) -> None:
    """The turns, mask and environment reward read the same in pandas, polars, duckdb and HF
    datasets as in pyarrow."""
    import datasets
    import duckdb
    import pandas as pd
    import polars as pl

    def norm(turns, mask, reward):
        return (
            [(t["role"], t["content"], t["start"], t["end"]) for t in turns],
            [int(m) for m in mask],
            float(reward),
        )

    want = [norm(r["turns"], r["response_mask"], r["env_reward"]) for r in rows]
    df = pd.read_parquet(path)
    pl_df = pl.read_parquet(path)
    hf = datasets.Dataset.from_parquet(path, cache_dir=str(Path(path).parent / ".hf"))
    got = {
        "pandas": [norm(*v) for v in zip(df.turns, df.response_mask, df.env_reward, strict=True)],
        "polars": [norm(*v) for v in pl_df.select("turns", "response_mask", "env_reward").rows()],
        "duckdb": [
            norm(*v)
            for v in duckdb.sql(f"SELECT turns, response_mask, env_reward FROM '{path}'").fetchall()
        ],
        "datasets": [
            norm(*v) for v in zip(hf["turns"], hf["response_mask"], hf["env_reward"], strict=True)
        ],
    }
    for reader, value in got.items():
        assert value == want, reader


def test_a_server_dying_mid_episode_ends_its_samples_not_the_stage(tmp_path, tiny_assets):
    server = GuessServer(die_after=3)
    try:
        table, stats = _stage_rollouts(tmp_path, tiny_assets, server, "dies")
    finally:
        server.close()
    reasons = table.column("finish_reason").to_pylist()
    assert "error" in reasons and stats["env_errors"] == reasons.count("error") >= 1
    dead = table.filter(pa_equal(table, "error")).to_pylist()[0]
    assert dead["turns"][-1]["role"] == "tool" and dead["turns"][-1]["content"].startswith("Error:")
    assert server.url.split("//")[1].split("/")[0] in dead["turns"][-1]["content"]


def pa_equal(table, reason):
    import pyarrow.compute as pc

    return pc.equal(table.column("finish_reason"), reason)
