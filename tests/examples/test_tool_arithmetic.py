"""The tool-use demo (examples/tool_arithmetic): its warm-up traces are exactly what the generate
stage's multi-turn loop writes for the same turns with the real python tool, its tokenizer keeps
the tool tokens whole through a save and load, its eval set is held out, and prepare commits a
loadable base."""

from __future__ import annotations

import json

import pytest

from components.generate.multiturn import generate_multi_turn, observation_encoder
from components.generate.tools import load_tools
from components.model.backends import PromptRequest, Sample, SamplingSpec
from examples.arithmetic.data import Problem
from examples.arithmetic.prepare import chat_prompt
from examples.tool_arithmetic.task import (
    TOOL_TOKENS,
    answer_text,
    build_tokenizer,
    make_splits,
    tool_call_text,
    trace_ids,
)


class Replay:
    """Replays given policy turns (as the tokenizer encodes them) in order, for one prompt."""

    def __init__(self, tok, turns: list[str]) -> None:
        from components.model.backends import BackendInfo

        self.tok, self.turns, self.info = tok, list(turns), BackendInfo("replay", "0")

    def generate(self, requests, spec):
        (r,) = requests
        text = self.turns.pop(0)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if not self.turns:
            ids = ids + [self.tok.eos_token_id]
        yield [Sample(r.prompt_id, 0, text, ids, [-0.1] * len(ids), "stop")]


def test_a_warm_up_trace_is_what_the_generate_loop_writes():
    tok = build_tokenizer()
    p = Problem(873, "*", 197, level=4)
    ids, trained = trace_ids(tok, observation_encoder(tok), p, tool=True)
    prompt = tok(chat_prompt(tok, p), add_special_tokens=False)["input_ids"]
    tools = load_tools(["python"])
    try:
        (tr,) = generate_multi_turn(
            Replay(tok, [tool_call_text(p), answer_text(p)]),
            [PromptRequest("p", prompt, [1])],
            SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=64),
            tools,
            observation_encoder(tok),
            decode=tok.decode,
            max_turns=2,
            max_response_tokens=112,
        )
    finally:
        tools.close()
    assert tr.tool_errors == 0 and tr.turns[1]["content"] == "171981\n"
    assert tr.token_ids == ids and tr.mask == trained
    assert tok.decode(ids[trained.index(0) : len(trained) - trained[::-1].index(0)]) == (
        "<tool_response>171981\n</tool_response>"
    )
    direct, mask = trace_ids(tok, observation_encoder(tok), p, tool=False)
    assert tok.decode(direct) == "\\boxed{171981}<eos>" and mask == [1] * len(direct)


def test_the_tokenizer_keeps_tool_tokens_whole_through_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    from examples.arithmetic.model import build_model, save_checkpoint
    from examples.tool_arithmetic.task import MAX_POSITIONS

    tok = build_tokenizer()
    save_checkpoint(build_model(tok, max_positions=MAX_POSITIONS), tok, tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for t in TOOL_TOKENS:
        assert len(again(t, add_special_tokens=False)["input_ids"]) == 1
    text = tool_call_text(Problem(123, "*", 456, 4))
    assert (
        again(text, add_special_tokens=False)["input_ids"]
        == tok(text, add_special_tokens=False)["input_ids"]
    )
    assert observation_encoder(again)("5\n") == observation_encoder(tok)("5\n")


def test_eval_and_dev_problems_are_held_out_of_train():
    splits = make_splits(seed=3, n_train=5000, n_eval=300, n_dev=100)
    key = lambda p: (min(p.a, p.b), max(p.a, p.b))  # noqa: E731
    held = {key(p) for p in splits["eval"] + splits["dev"]}
    assert len(held) == 400 and not held & {key(p) for p in splits["train"]}
    assert all(100 <= x <= 999 for p in splits["train"] for x in (p.a, p.b))


@pytest.mark.slow
def test_prepare_commits_a_loadable_base_and_its_curve(tmp_path):
    from components.model.checkpoint import load_policy
    from examples.tool_arithmetic.prepare import ToolWarmup, prepare

    cfg = ToolWarmup(n_train=64, n_eval=8, n_dev=4, max_steps=2, eval_every=1, target=2.0)
    prepare(tmp_path / "build", cfg)
    summary = json.loads((tmp_path / "build" / "prepare.json").read_text())
    assert [c["step"] for c in summary["curve"]] == [1, 2]
    assert {"pass@1", "tool_call_rate", "pass@1_when_called"} <= set(summary["curve"][0])
    model, tok = load_policy(tmp_path / "build" / "base")
    assert len(tok) == model.config.vocab_size and "<tool_call>" in tok.get_vocab()
    assert not list(tmp_path.glob(".build.*"))  # nothing half-written left beside it
