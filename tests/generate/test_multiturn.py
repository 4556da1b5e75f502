"""Multi-turn rollouts: the response is the whole trajectory after the
prompt, and `response_mask` says which of its tokens the policy sampled. Tool and environment
tokens condition the policy but are no actions: they leave the loss, the KL and every token
count. Hand-computed values throughout."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch

from components.core.config import TrainSection
from components.core.errors import StageError
from components.core.schemas import OPTIONAL, ROLLOUTS, SCORED, SchemaError, validate
from components.train.batching import Rollouts
from components.train.objective import build_targets, micro_batch_loss, response_mask_of


def test_the_loss_mask_keeps_sampled_tokens_only():
    # lengths 3 and 2 in a row of width 3; tool tokens (0) and padding both leave
    mask = response_mask_of([3, 2], [[1, 0, 1], [0, 1]])
    assert mask.tolist() == [[True, False, True], [False, True, False]]
    assert response_mask_of([3, 2]).tolist() == [[True, True, True], [True, True, False]]


def test_grpo_token_mean_on_a_multi_turn_group_by_hand():
    """One group of two trajectories, rewards 1 and 0. GRPO: mean 0.5, sample std (n-1) of
    [1, 0] = 1/sqrt(2), so A = +-0.5 / (1/sqrt(2) + 1e-6) on every sampled token. At ratio 1, PPO-clip's
    token-mean loss is -(sum of A over the sampled tokens) / (number of sampled tokens):
    trajectory 0 has 2 sampled tokens (one tool token between), trajectory 1 has 1 (a tool
    token before it), so the loss is -(2a - a) / 3 = -a / 3: -0.23570.
    Counting the tool tokens would give -(3a - 2a) / 5 instead. The gradient is -A / 3 on each
    sampled token and exactly 0 on tool tokens."""
    t = TrainSection(advantage="grpo", policy_loss="ppo_clip", loss_agg="token-mean")
    mask = response_mask_of([3, 2], [[1, 0, 1], [0, 1]])
    old = torch.zeros(2, 3)
    targets = build_targets(
        t,
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        response_mask=mask,
        truncated=torch.tensor([False, False]),
        old_logprobs=old,
        rollout_logprobs=old,
        ref_logprobs=None,
        entropy=None,
    )
    a = 0.5 / (1 / math.sqrt(2) + 1e-6)  # GRPO divides by std + 1e-6 (verl's epsilon)
    assert targets.loss_mask.tolist() == mask.tolist()
    torch.testing.assert_close(
        targets.advantages[mask], torch.tensor([a, a, -a]), rtol=0, atol=1e-6
    )
    logprobs = old.clone().requires_grad_()
    loss, _ = micro_batch_loss(
        t,
        logprobs=logprobs,
        entropy=None,
        old_logprobs=old,
        advantages=targets.advantages,
        loss_mask=targets.loss_mask,
        is_weights=targets.is_weights,
        ref_logprobs=None,
        num_tokens=float(targets.loss_mask.sum()),
        num_seqs=2.0,
        horizon=3,
    )
    assert loss.item() == pytest.approx(-a / 3, abs=1e-6)
    loss.backward()
    expected = torch.tensor([[-a / 3, 0.0, -a / 3], [0.0, a / 3, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected, rtol=0, atol=1e-6)


def test_kl_to_the_reference_skips_tool_tokens():
    """kl_ref is a token mean over sampled tokens: a tool token whose logprobs differ wildly
    (here by 5 nats, where the old logprob of a tool token means nothing) changes nothing."""
    t = TrainSection(kl_metric=True, kl_estimator="k1")
    mask = response_mask_of([2], [[1, 0]])
    old = torch.tensor([[-1.0, -9.0]])
    ref = torch.tensor([[-1.5, -4.0]])
    targets = build_targets(
        t,
        rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        response_mask=mask,
        truncated=torch.tensor([False]),
        old_logprobs=old,
        rollout_logprobs=old,
        ref_logprobs=ref,
        entropy=None,
    )
    assert targets.metrics["train/kl_ref"] == pytest.approx(0.5)  # k1: old - ref, sampled only


def _scored(response_mask) -> pa.Table:
    row = {
        "prompt_id": "p",
        "sample_index": 0,
        "data_source": "d",
        "ground_truth": "1",
        "prompt": "q",
        "prompt_token_ids": [1, 2],
        "response": "r",
        "response_token_ids": [3, 4, 5],
        "response_logprobs": [-0.1, 0.0, -0.2],
        "finish_reason": "stop",
        "checkpoint": "c",
        "extra_info": None,
        "policy_version": 0,
        "reward": 1.0,
        "verifier": "v",
        "extracted_answer": "1",
        "verify_error": None,
        "reward_components": [],
    }
    table = pa.Table.from_pylist([row], schema=SCORED)
    if response_mask is not None:
        table = table.append_column(
            pa.field("response_mask", OPTIONAL["response_mask"]),
            pa.array([response_mask], OPTIONAL["response_mask"]),
        )
    return table


def test_rollouts_read_the_mask_and_refuse_a_bad_one():
    assert Rollouts.from_table(_scored(None), "s.parquet").sampled is None
    assert Rollouts.from_table(_scored([1, 0, 1]), "s.parquet").sampled == [[1, 0, 1]]
    with pytest.raises(StageError, match=r"s.parquet: row 0: response_mask must hold one 0 or 1"):
        Rollouts.from_table(_scored([1, 0]), "s.parquet")
    with pytest.raises(StageError, match="response_mask"):
        Rollouts.from_table(_scored([1, 2, 1]), "s.parquet")


def test_the_optional_columns_are_checked_where_present():
    validate(ROLLOUTS, "rollouts", "r.parquet")  # single-turn: nothing required beyond today
    bad = ROLLOUTS.append(pa.field("response_mask", pa.list_(pa.float32())))
    with pytest.raises(SchemaError, match="r.parquet: column 'response_mask' has type"):
        validate(bad, "rollouts", "r.parquet")
    ok = ROLLOUTS.append(pa.field("turns", OPTIONAL["turns"]))
    validate(ok, "rollouts", "r.parquet")


def test_void_turns_by_hand():
    """SimpleTIR's void turn: a policy turn with neither a tool call nor an answer."""
    import re

    from components.core.turns import has_void_turn

    answer = re.compile(r"\\boxed\{")
    call = {"role": "assistant", "content": '<tool_call>{"name": "python"}</tool_call>'}
    tool = {"role": "tool", "content": "no answer here"}  # a tool's text is never a policy turn
    done = {"role": "assistant", "content": "so \\boxed{5}"}
    assert not has_void_turn([call, tool, done], answer)
    assert has_void_turn([call, tool, {"role": "assistant", "content": "hmm"}], answer)
    assert has_void_turn([{"role": "assistant", "content": "<tool_call>{cut"}], answer)
    assert has_void_turn([{"role": "assistant", "content": ""}], answer)
    assert not has_void_turn([], answer)


def test_the_void_turn_filter_masks_whole_trajectories_that_still_count_in_their_group():
    """Group of three, rewards 1, 0, 0; row 2 holds a void turn. GRPO over all three rows: mean
    1/3, sample std sqrt(1/3), so A = (1 - 1/3) / sqrt(1/3) = 1.1547 for row 0 and -0.5774 for
    rows 1 and 2; with the filter row 2 leaves the loss mask, the others keep theirs unchanged."""
    mask = response_mask_of([2, 2, 2], [[1, 1], [1, 0], [1, 1]])
    old = torch.zeros(3, 2)
    kw = dict(
        rewards=torch.tensor([1.0, 0.0, 0.0]),
        group_ids=torch.tensor([0, 0, 0]),
        response_mask=mask,
        truncated=torch.tensor([False] * 3),
        old_logprobs=old,
        rollout_logprobs=old,
        void=torch.tensor([False, False, True]),
    )
    on = build_targets(TrainSection(void_turn_filter=True), **kw)
    off = build_targets(TrainSection(), **kw)
    assert on.loss_mask.tolist() == [[True, True], [True, False], [False, False]]
    assert off.loss_mask.tolist() == mask.tolist()
    assert on.metrics["train/void_masked"] == 1.0 and "train/void_masked" not in off.metrics
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    torch.testing.assert_close(
        on.advantages[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-6), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(on.advantages, off.advantages, rtol=0, atol=0)


def test_rollouts_find_void_turns_in_the_turns_column():
    table = _scored([1, 0, 1])
    turns = [
        [
            {"role": "assistant", "content": "<tool_call>{}</tool_call>", "start": 0, "end": 1},
            {"role": "tool", "content": "1", "start": 1, "end": 2},
            {"role": "assistant", "content": "nothing", "start": 2, "end": 3},
        ]
    ]
    with_turns = table.append_column(
        pa.field("turns", OPTIONAL["turns"]), pa.array([turns[0]], OPTIONAL["turns"])
    )
    ro = Rollouts.from_table(with_turns, "s.parquet")
    assert ro.void(r"\\boxed\{").tolist() == [True]
    assert ro.void(r"nothing").tolist() == [False]
    assert Rollouts.from_table(table, "s.parquet").void(r"x").tolist() == [False]


def test_the_void_turn_filter_needs_tools_and_a_valid_pattern(tmp_path):
    from components.core.config import ConfigError, load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {base: b}\ndata: {train: t.parquet}\ntrain: {void_turn_filter: true}\n")
    with pytest.raises(ConfigError, match="void_turn_filter.*set generate.tools"):
        load_config(str(cfg))
    load_config(str(cfg), ["generate.tools=[python]"])
    with pytest.raises(ConfigError, match="answer_pattern"):
        load_config(str(cfg), ["generate.tools=[python]", "train.answer_pattern=("])


def test_features_a_run_does_not_use_stay_out_of_its_lineage():
    """A single-turn run's lineage leaves out the multi-turn keys, the void-turn filter and
    the environment's reward weight: they enter only when used (their declared roles)."""
    from components.core.config import RunConfig
    from components.core.config_fields import lineage_dump

    base = {"model": {"base": "b"}, "data": {"train": "t.parquet"}}
    plain = RunConfig.model_validate(base)
    dumped = lineage_dump(plain.generate, plain)
    assert not {"tools", "max_turns", "max_response_tokens", "environment"} & set(dumped)
    assert "void_turn_filter" not in lineage_dump(plain.train, plain)
    assert "env_reward_weight" not in lineage_dump(plain.verify, plain)
    tools = RunConfig.model_validate(
        {**base, "generate": {"tools": ["python"]}, "train": {"void_turn_filter": True}}
    )
    # max_images_per_prompt only refuses input, cuda_graphs and continuous batching only
    # launch steps: never in it (a backend's sub-section enters flat, key by key)
    g = tools.generate
    keys = (
        (set(type(g).model_fields) - {"transformers", "vllm"})
        | set(type(g.transformers).model_fields)
        | set(type(g.vllm).model_fields)
    )
    left_out = keys - set(lineage_dump(g, tools))
    assert left_out == {"max_images_per_prompt", "cuda_graphs", "continuous_batching"}
    left_out = set(type(tools.train).model_fields) - set(lineage_dump(tools.train, tools))
    machinery = {"kl_metric", "gradient_checkpointing", "state_every", "handoff"}
    assert left_out == machinery | {
        "nodes",
        "old_logprobs",
        "freeze_vision",
        "skip_no_signal_steps",
    }
    skipping = RunConfig.model_validate({**base, "train": {"skip_no_signal_steps": True}})
    assert "skip_no_signal_steps" in lineage_dump(skipping.train, skipping)  # it changes updates
    # old_logprobs: auto and recompute train alike (within float precision), rollout does not
    assert "old_logprobs" not in lineage_dump(plain.train, plain)
    bypass = RunConfig.model_validate({**base, "train": {"old_logprobs": "rollout"}})
    assert "old_logprobs" in lineage_dump(bypass.train, bypass)
    env = RunConfig.model_validate({**base, "generate": {"environment": {"url": "http://e:1"}}})
    assert "env_reward_weight" in lineage_dump(env.verify, env)
