"""The multi-turn sampling loop (components/generate/multiturn.py) on a scripted backend: the
policy's turns and the tools' observations as one token stream with the right mask, logprobs,
turn spans, budgets and finish reasons. (The scripted backend stands in for sampling only; the
tools are real.)"""

from __future__ import annotations

import pytest

from components.generate.multiturn import generate_multi_turn, plain_observation, turn_seed
from components.generate.tools import ToolBox, tool_from_callable
from components.model.backends import PromptRequest, Sample, SamplingSpec


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def chars(ids: list[int]) -> str:
    return "".join(map(chr, ids))


class ScriptedBackend:
    """Answers each prompt's turns from a script, as characters with logprob -0.5 each; records
    every request it got."""

    def __init__(self, scripts: dict[tuple[int, ...], list[str]]) -> None:
        self.scripts, self.requests = scripts, []

    def generate(self, requests, spec):
        out = []
        for r in requests:
            self.requests.append((r, spec))
            prompt = next(p for p in self.scripts if tuple(r.prompt_token_ids[: len(p)]) == p)
            done = sum(
                1
                for q, _ in self.requests[:-1]
                if tuple(q.prompt_token_ids[: len(prompt)]) == prompt
            )
            text = self.scripts[prompt][done][: spec.max_new_tokens]
            ids = [ord(c) for c in text]
            out.append(
                Sample(
                    r.prompt_id,
                    0,
                    text,
                    ids,
                    [-0.5] * len(ids),
                    "stop" if len(text) < spec.max_new_tokens else "length",
                )
            )
        yield out


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
BAD = '<tool_call>{"name": "mul", "arguments": {}}</tool_call>'


def run(scripts, *, max_turns=4, max_response_tokens=1000, n=1):
    backend = ScriptedBackend({tuple(map(ord, p)): s for p, s in scripts.items()})
    box = ToolBox({"add": tool_from_callable(add)})
    reqs = [
        PromptRequest(f"p{i}", [ord(c) for c in p], [11 * (i + 1) + j for j in range(n)])
        for i, p in enumerate(scripts)
    ]
    spec = SamplingSpec(n=n, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1000)
    try:
        return generate_multi_turn(
            backend,
            reqs,
            spec,
            box,
            plain_observation(CharTokenizer()),
            decode=chars,
            max_turns=max_turns,
            max_response_tokens=max_response_tokens,
        ), backend
    finally:
        box.close()


def test_a_tool_call_then_an_answer():
    (tr,), backend = run({"Q:": [CALL, "It is \\boxed{5}."]})
    obs = "\n<tool_response>\n5\n</tool_response>\n"
    assert tr.finish_reason == "stop" and tr.tool_calls == 1 and tr.tool_errors == 0
    assert tr.token_ids == [ord(c) for c in CALL + obs + "It is \\boxed{5}."]
    assert tr.mask == [1] * len(CALL) + [0] * len(obs) + [1] * len("It is \\boxed{5}.")
    assert tr.logprobs == [-0.5] * len(CALL) + [0.0] * len(obs) + [-0.5] * len("It is \\boxed{5}.")
    assert tr.turns == [
        {"role": "assistant", "content": CALL, "start": 0, "end": len(CALL)},
        {"role": "tool", "content": "5", "start": len(CALL), "end": len(CALL) + len(obs)},
        {
            "role": "assistant",
            "content": "It is \\boxed{5}.",
            "start": len(CALL) + len(obs),
            "end": len(tr.token_ids),
        },
    ]
    assert tr.response == "It is \\boxed{5}."
    # turn 2 continues from the prompt plus the whole trajectory, as tokens, with its own seed
    (r0, s0), (r1, s1) = backend.requests
    assert r1.prompt_token_ids == [ord(c) for c in "Q:" + CALL + obs]
    assert r0.sample_seeds == [11] and r1.sample_seeds == [turn_seed(11, 1)] != [11]
    assert "</tool_call>" in s1.stop and s1.n == 1


def test_a_failed_call_is_an_observation_and_budgets_end_trajectories():
    (bad, many, long), _ = run(
        {"A:": [BAD, "no"], "B:": [CALL] * 9, "C:": [CALL, "x" * 500]},
        max_turns=3,
        max_response_tokens=400,
    )
    assert bad.finish_reason == "stop" and bad.tool_errors == 1
    assert bad.turns[1]["content"] == "Error: no tool named 'mul' (tools: add)"
    assert many.finish_reason == "turns" and many.tool_calls == 3  # max_turns policy turns
    assert long.finish_reason == "length" and len(long.token_ids) == 400
    assert long.mask[-1] == 1  # the answer was cut at the budget, its tokens still sampled
    # the cut turn's text is what its kept tokens say (verify scores it), not the whole sample
    last = long.turns[-1]
    assert last["content"] == "x" * (last["end"] - last["start"]) == long.response


def test_a_turn_cut_at_the_budget_inside_a_call_runs_no_tool():
    (tr,), _ = run({"Q:": [CALL]}, max_response_tokens=len(CALL) - 1)
    assert tr.finish_reason == "length" and tr.tool_calls == 0 and len(tr.turns) == 1
    assert tr.response == CALL[:-1]


def test_the_calls_of_a_turn_run_side_by_side_across_trajectories():
    """Two trajectories' calls meet at a barrier of two: run one after the other, the first
    would wait out the barrier's timeout and fail."""
    import threading

    barrier = threading.Barrier(2, timeout=10)

    def meet(a: int, b: int) -> int:
        """Wait for the other call, then add."""
        barrier.wait()
        return a + b

    backend = ScriptedBackend({tuple(map(ord, p)): [CALL, "done"] for p in ("A:", "B:")})
    box = ToolBox({"add": tool_from_callable(meet, name="add")})
    reqs = [PromptRequest(p, [ord(c) for c in p], [i]) for i, p in enumerate(("A:", "B:"))]
    spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1000)
    try:
        trajs = generate_multi_turn(
            backend,
            reqs,
            spec,
            box,
            plain_observation(CharTokenizer()),
            decode=chars,
            max_turns=2,
            max_response_tokens=1000,
        )
    finally:
        box.close()
    assert [t.tool_errors for t in trajs] == [0, 0]
    assert [t.turns[1]["content"] for t in trajs] == ["5", "5"]


def test_a_single_turn_answer_is_a_plain_sample():
    (tr,), _ = run({"Q:": ["\\boxed{7}"]})
    assert tr.finish_reason == "stop" and tr.mask == [1] * 9 and len(tr.turns) == 1


def test_without_tool_calls_the_loop_samples_what_single_turn_generation_does(tiny_assets):
    """The real transformers backend and tiny model (which never calls a tool): every trajectory
    is one turn, all sampled, with the tokens and logprobs single-turn generation gives from the
    same seeds (turn 0 keeps the sample's seed; batch layout does not change a sample)."""
    from components.model.backends import sample_seed
    from components.model.checkpoint import load_policy
    from components.model.hf_backend import TransformersBackend

    model, tok = load_policy(tiny_assets / "base")
    backend = TransformersBackend(model, tok, batch_size=16)
    reqs = [
        PromptRequest(
            f"p{i}",
            tok(f"{i}+{2 * i}=", add_special_tokens=False)["input_ids"],
            [sample_seed(0, 0, f"p{i}", j) for j in range(3)],
        )
        for i in range(4)
    ]
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    single = {(s.prompt_id, s.sample_index): s for b in backend.generate(reqs, spec) for s in b}
    box = ToolBox({"add": tool_from_callable(add)})
    try:
        trajs = generate_multi_turn(
            backend,
            reqs,
            spec,
            box,
            plain_observation(tok),
            decode=tok.decode,
            max_turns=3,
            max_response_tokens=64,
        )
    finally:
        box.close()
    assert len(trajs) == 12
    for tr in trajs:
        s = single[(tr.prompt_id, tr.sample_index)]
        assert len(tr.turns) == 1 and tr.mask == [1] * len(tr.token_ids)
        assert tr.token_ids == s.response_token_ids
        # another batch layout: float rounding only (docs/contracts.md, batch invariance)
        assert tr.logprobs == pytest.approx(s.response_logprobs, abs=1e-4)
        assert tr.finish_reason == s.finish_reason


@pytest.mark.slow
def test_a_run_with_tools_writes_turns_that_verify_and_train_read(tmp_path, tiny_assets):
    """generate.tools through the stages: the rollouts carry response_mask and turns (pandas
    reads them), verify passes them on, train takes its update on the mask, and generate's
    manifest reports the tool figures. (The tiny model never calls a tool, so every mask is all
    ones; the loop's tool turns are covered above.)"""
    import pandas as pd

    from components.core.commit import read_manifest
    from components.core.config import load_config
    from components.core.layout import RunLayout
    from components.core.store import LocalStore
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import run as train
    from components.verify.stage import run as verify
    from tests.support.runs import write_config

    tools = tmp_path / "tools.py"
    tools.write_text(
        'def add(a: int, b: int) -> int:\n    """Add two integers."""\n    return a + b\n'
    )
    cfg = load_config(
        write_config(
            tmp_path,
            tiny_assets,
            generate={"tools": [f"{tools}:add"], "max_turns": 2},
            run={"iterations": 1},
        )
    )
    run_setup.run(cfg)
    generate(cfg, 0)
    layout = RunLayout.of(cfg)
    stats = read_manifest(LocalStore(), layout.rollouts(0))["stats"]
    assert stats["tools"] == ["add"] and stats["tool_calls_per_sample"] == 0.0
    assert stats["turns_mean"] == 1.0
    df = pd.read_parquet(f"{layout.rollouts(0)}/part-00000.parquet")
    assert {"response_mask", "turns"} <= set(df.columns)
    row = df.iloc[0]
    assert list(row.response_mask) == [1] * len(row.response_token_ids)
    assert row.turns[0]["role"] == "assistant" and row.turns[0]["end"] == len(row.response_mask)
    verify(cfg, 0)
    scored = pd.read_parquet(f"{layout.scored(0)}/part-00000.parquet")
    assert "response_mask" in scored.columns
    assert train(cfg, 0)["skipped"] is False
    from components.evaluate.stage import run as evaluate

    evaluate(cfg, 1)  # with the same tools: pass@k on the trajectories' final answers
    import json
    from pathlib import Path

    metrics = json.loads(Path(layout.evals(1), "metrics.json").read_text())
    assert 0.0 <= metrics["overall"]["pass@1"] <= 1.0


def test_tool_figures_combine_over_shards_as_one_run_would():
    """Shard A: 10 samples, 4 calls, 1 failed; shard B: 30 samples, 6 calls, 3 failed. One run:
    40 samples, 10 calls, 4 failed: calls per sample 0.25, error share 0.4 (a share of the
    calls: weighting by samples would give (10 * 0.25 + 30 * 0.5) / 40 = 0.4375)."""
    from components.core.figures import combine_shards, stage_figures

    a = stage_figures(
        "generate",
        {
            "samples": 10,
            "tool_calls": 4,
            "tool_calls_per_sample": 0.4,
            "tool_error_share": 0.25,
            "turns_mean": 1.5,
        },
    )
    b = stage_figures(
        "generate",
        {
            "samples": 30,
            "tool_calls": 6,
            "tool_calls_per_sample": 0.2,
            "tool_error_share": 0.5,
            "turns_mean": 1.0,
        },
    )
    both = combine_shards([a, b])
    assert both["rollout/tool_calls"] == 10
    assert both["rollout/tool_calls_per_sample"] == pytest.approx(0.25)
    assert both["rollout/tool_error_share"] == pytest.approx(0.4)
    assert both["rollout/turns_mean"] == pytest.approx(1.125)


def _env_call(guess: int) -> str:
    return f'<tool_call>{{"name": "env", "arguments": {{"guess": {guess}}}}}</tool_call>'


def test_an_environment_drives_a_trajectory_and_a_dying_server_ends_only_its_samples():
    """Each trajectory acts in its own session of a loopback OpenEnv server (reset with the
    trajectory's seed): observations come back as JSON, rewards add up. A server that dies
    mid-episode ends the trajectories acting in it with a clear error (finish "error"); the
    others finish as usual."""
    pytest.importorskip("websockets")
    from components.generate.multiturn import EnvironmentSpec
    from tests.support.envserver import GuessServer

    server = GuessServer()
    try:
        env = EnvironmentSpec(server.url, timeout_s=5)
        scripts = {"G:": [_env_call(50), _env_call(75), "\\boxed{75}"], "A:": [CALL, "5"]}
        backend = ScriptedBackend({tuple(map(ord, p)): s for p, s in scripts.items()})
        box = ToolBox({"add": tool_from_callable(add)})
        reqs = [PromptRequest(f"p{i}", [ord(c) for c in p], [3]) for i, p in enumerate(scripts)]
        spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1000)
        guess, plain = generate_multi_turn(
            backend,
            reqs,
            spec,
            box,
            plain_observation(CharTokenizer()),
            decode=chars,
            max_turns=4,
            max_response_tokens=2000,
            environment=env,
        )
        box.close()
    finally:
        server.close()
    assert guess.finish_reason == "stop" and guess.error is None and guess.tool_calls == 2
    target = _target(3)  # the server's number for seed 3, the trajectory's seed
    assert [t["content"] for t in guess.turns if t["role"] == "tool"] == [
        _feedback(50, target),
        _feedback(75, target),
    ]
    assert guess.env_reward == float(75 == target or 50 == target)
    assert plain.finish_reason == "stop" and plain.tool_calls == 1

    dying = GuessServer(die_after=1)
    try:
        env = EnvironmentSpec(dying.url, timeout_s=5)
        backend = ScriptedBackend({tuple(map(ord, p)): s for p, s in scripts.items()})
        box = ToolBox({"add": tool_from_callable(add)})
        guess, plain = generate_multi_turn(
            backend,
            reqs,
            spec,
            box,
            plain_observation(CharTokenizer()),
            decode=chars,
            max_turns=4,
            max_response_tokens=2000,
            environment=env,
        )
        box.close()
    finally:
        dying.close()
    assert guess.finish_reason == "error" and "closed the connection mid-episode" in guess.error
    assert guess.turns[-1]["role"] == "tool" and guess.turns[-1]["content"].startswith("Error:")
    assert guess.tool_errors == 1 and plain.finish_reason == "stop"


def _target(seed: int) -> int:
    import random

    return random.Random(seed).randint(1, 100)


def _feedback(guess: int, target: int) -> str:
    word = "correct" if guess == target else "higher" if guess < target else "lower"
    return f'{{"feedback": "{word}"}}'


QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_observations_follow_the_chat_template_where_it_has_a_tool_role(tiny_assets):
    """A Qwen-style template: after a turn the policy ended at </tool_call>, the observation is
    the assistant's end-of-turn, the tool message as the template writes it, and the next
    assistant turn's opening. A template without a tool role gets the plain tags."""
    from transformers import AutoTokenizer

    from components.generate.multiturn import observation_encoder, template_observation_text

    tok = AutoTokenizer.from_pretrained(tiny_assets / "base")
    tok.chat_template = QWEN_LIKE
    assert template_observation_text(tok, "42") == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert (
        observation_encoder(tok)("42")
        == tok(template_observation_text(tok, "42"), add_special_tokens=False)["input_ids"]
    )
    tok.chat_template = (
        "{% for m in messages %}{% if m.role != 'tool' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    assert template_observation_text(tok, "42") is None  # the tool message is dropped
    plain = observation_encoder(tok)("42")
    assert tok.decode(plain) == "\n<tool_response>\n42\n</tool_response>\n"
