"""Multi-turn sampling with tools: each sample is a trajectory of
policy turns and tool observations, kept as one token stream after the prompt.

Per turn, every live trajectory is continued by the backend (any backend: one request of n=1 per
trajectory, its prompt the original prompt plus the trajectory so far, as token ids, never
re-tokenized) until it ends a tool call (`</tool_call>`), EOS or a stop string, or its token budget
runs out. A turn with tool calls gets one observation per call (components/generate/tools.py:
errors are observations), appended as tokens the policy did not sample (`response_mask` 0,
logprob 0); a turn without one is the answer. The trajectory ends with the answer
(`finish_reason` "stop"), at the response token budget ("length") or after `max_turns` policy
turns ("turns").

Seeds: turn k of sample j draws with `turn_seed(sample seed, k)`, so a trajectory depends only on
(run seed, iteration, prompt_id, sample index), as single-turn samples do: shards and batch
layouts give the same trajectories.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from components.generate.tools import ToolBox, parse_tool_calls
from components.model.backends import PromptRequest, SamplingSpec

TOOL_CALL_END = "</tool_call>"


def turn_seed(sample_seed: int, turn: int) -> int:
    """Turn 0 keeps the sample's seed (a single-turn sample is unchanged); later turns derive."""
    if turn == 0:
        return sample_seed
    key = f"{sample_seed}/turn/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def plain_observation(tokenizer) -> Callable[[str], list[int]]:
    """Observation tokens for a model without a tool role in its chat template: the result in
    `<tool_response>` tags, as Hermes-style templates render it."""

    def encode(text: str) -> list[int]:
        return tokenizer(
            f"\n<tool_response>\n{text}\n</tool_response>\n", add_special_tokens=False
        )["input_ids"]

    return encode


_SENTINEL = "\u2063RLVR-TURN\u2063"  # invisible separator: no template writes it itself


def template_observation_text(tokenizer, text: str) -> str | None:
    """What the chat template writes after a sampled assistant turn for a tool message holding
    `text`, up to the next assistant turn's opening: the assistant's end-of-turn suffix (the
    policy stopped at `</tool_call>`, before it), the tool message, and the generation prompt.
    None when the template has no tool role (it drops the message or fails)."""
    user = {"role": "user", "content": "q"}
    turn = {"role": "assistant", "content": _SENTINEL}
    try:
        before = tokenizer.apply_chat_template([user, turn], tokenize=False)
        after = tokenizer.apply_chat_template(
            [user, turn, {"role": "tool", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # noqa: BLE001 - a template without a tool role may raise anything
        return None
    if not isinstance(before, str) or not after.startswith(before) or text not in after:
        return None
    suffix = before.split(_SENTINEL, 1)[1] if _SENTINEL in before else ""
    return suffix + after[len(before) :]


def observation_encoder(tokenizer) -> Callable[[str], list[int]]:
    """Observation tokens as the model's chat template renders a tool message, where it has a
    tool role; the plain `<tool_response>` template otherwise."""
    if template_observation_text(tokenizer, "x") is None:
        return plain_observation(tokenizer)

    def encode(text: str) -> list[int]:
        return tokenizer(template_observation_text(tokenizer, text), add_special_tokens=False)[
            "input_ids"
        ]

    return encode


@dataclass(frozen=True)
class EnvironmentSpec:
    """A stateful environment the policy acts in through tool calls named `name` (their
    arguments are the action's fields): one OpenEnv session per trajectory, reset with the
    trajectory's seed on its first call."""

    url: str
    name: str = "env"
    timeout_s: float = 60.0


class _Sessions:
    """The open environment sessions of one generate call, by trajectory."""

    def __init__(self, spec: EnvironmentSpec | None) -> None:
        self.spec, self.open = spec, {}

    def handles(self, name: str | None) -> bool:
        return self.spec is not None and name == self.spec.name

    def step(self, tr: Trajectory, arguments: dict[str, Any]) -> str:
        """The observation text of one action; EnvError ends the trajectory (the caller's)."""
        from components.generate.environments import EnvSession

        assert self.spec is not None
        key = (tr.prompt_id, tr.sample_index)
        if key not in self.open:
            self.open[key] = EnvSession(self.spec.url, timeout_s=self.spec.timeout_s)
            self.open[key].reset(seed=tr.seed)
        result = self.open[key].step(arguments)
        tr.env_reward += result.reward or 0.0
        tr.env_done = result.done
        return json.dumps(result.observation, sort_keys=True)

    def close(self) -> None:
        for session in self.open.values():
            session.close()
        self.open.clear()


@dataclass
class Trajectory:
    prompt_id: str
    sample_index: int
    prompt_token_ids: list[int]
    seed: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy
    turns: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    error: str | None = None  # why the environment ended this trajectory early
    env_reward: float = 0.0  # the environment's rewards, summed over its steps
    env_done: bool = False

    def add(self, role: str, content: str, ids: list[int], logprobs: list[float] | None) -> None:
        start = len(self.token_ids)
        self.token_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)
        self.turns.append(
            {"role": role, "content": content, "start": start, "end": len(self.token_ids)}
        )

    @property
    def response(self) -> str:
        """The final answer: the last policy turn's text."""
        return next((t["content"] for t in reversed(self.turns) if t["role"] == "assistant"), "")


def generate_multi_turn(
    backend,
    requests: list[PromptRequest],
    spec: SamplingSpec,
    toolbox: ToolBox,
    observe: Callable[[str], list[int]],
    *,
    decode: Callable[[list[int]], str],
    max_turns: int,
    max_response_tokens: int,
    environment: EnvironmentSpec | None = None,
) -> list[Trajectory]:
    """Every sample of every request as a finished trajectory (see the module docstring).

    `observe` encodes a tool's output as observation tokens; `decode` gives the text of a turn
    the trajectory's token budget cut short (its text must be what its tokens say: verify scores
    it). The calls of a turn run concurrently across trajectories (in order within one), on the
    toolbox's threads, while no sampling is under way.

    With an `environment`, calls naming it act in the trajectory's own session; a server that
    fails (refuses, dies, hangs, answers with an error) ends that trajectory with its `error`
    recorded and finish reason "error", and every other trajectory goes on."""
    sessions = _Sessions(environment)
    try:
        return _loop(
            backend,
            requests,
            spec,
            toolbox,
            observe,
            decode,
            max_turns,
            max_response_tokens,
            sessions,
        )
    finally:
        sessions.close()


def _act(
    tr: Trajectory, calls, toolbox: ToolBox, observe, max_response_tokens: int, sessions: _Sessions
) -> None:
    """Run one turn's calls of one trajectory, in order, appending an observation per call."""
    from components.generate.environments import EnvError

    for call in calls:
        if sessions.handles(call.name) and not call.error:
            try:
                text, ok = sessions.step(tr, call.arguments), True
            except EnvError as e:
                text, ok, tr.error = f"Error: {e}", False, str(e)
        else:
            text, ok = toolbox.call(call)
        tr.tool_calls += 1
        tr.tool_errors += not ok
        obs = observe(text)[: max_response_tokens - len(tr.token_ids)]
        tr.add("tool", text, obs, None)
        if tr.error:
            break
    if tr.error:
        tr.finish_reason = "error"
    elif len(tr.token_ids) >= max_response_tokens:
        tr.finish_reason = "length"


def _loop(
    backend, requests, spec, toolbox, observe, decode, max_turns, max_response_tokens, sessions
):
    trajs = [
        Trajectory(r.prompt_id, j, list(r.prompt_token_ids), seed)
        for r in requests
        for j, seed in enumerate(r.sample_seeds)
    ]
    live = list(trajs)
    for turn in range(max_turns):
        if not live:
            break
        batch = {f"{k}": (tr, max_response_tokens - len(tr.token_ids)) for k, tr in enumerate(live)}
        # one spec per distinct budget would split batches; the largest is enough per turn and
        # each trajectory is cut to its own budget below
        per_turn = min(spec.max_new_tokens, max(b for _, b in batch.values()))
        turn_spec = replace(spec, n=1, max_new_tokens=per_turn, stop=(*spec.stop, TOOL_CALL_END))
        reqs = [
            PromptRequest(key, tr.prompt_token_ids + tr.token_ids, [turn_seed(tr.seed, turn)])
            for key, (tr, _) in batch.items()
        ]
        acting = []
        for samples in backend.generate(reqs, turn_spec):
            for s in samples:
                tr, budget = batch[s.prompt_id]
                ids, lps = s.response_token_ids[:budget], s.response_logprobs[:budget]
                cut = len(ids) < len(s.response_token_ids)
                tr.add("assistant", decode(ids) if cut else s.response, ids, lps)
                calls = [] if cut else parse_tool_calls(s.response)
                if not calls:
                    tr.finish_reason = "length" if cut or s.finish_reason == "length" else "stop"
                elif len(tr.token_ids) >= max_response_tokens:
                    tr.finish_reason = "length"
                else:
                    acting.append((tr, calls))
        list(
            toolbox.map(lambda a: _act(*a, toolbox, observe, max_response_tokens, sessions), acting)
        )
        live = [tr for tr, _ in acting if tr.finish_reason is None]
    for tr in live:
        tr.finish_reason = "turns"
    return trajs
