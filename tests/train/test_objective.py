"""The train objective assembled from the algorithm library, on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from components.core.config import TrainSection
from components.train.objective import (
    build_targets,
    micro_batch_loss,
    response_mask_of,
    rollout_mismatch,
)

F64 = torch.float64


def base_inputs(**kw):
    mask = response_mask_of([2, 2, 1, 2])  # [4, 2]
    d = dict(
        rewards=torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=F64),
        group_ids=torch.tensor([0, 0, 1, 1]),
        response_mask=mask,
        truncated=torch.tensor([False, False, False, True]),
        old_logprobs=torch.full((4, 2), -1.0, dtype=F64),
        rollout_logprobs=torch.full((4, 2), -1.0, dtype=F64),
    )
    d.update(kw)
    return d


def test_grpo_targets_and_dynamic_sampling():
    t = TrainSection(dynamic_sampling=True)
    tg = build_targets(t, **base_inputs())
    # group 0 rewards (1, 1): zero variance -> dropped; group 1 (0, 1): mean .5, unbiased std
    # sqrt(.5) = .70711 -> advantages -.5/.70711 = -.70711 and +.70711.
    assert tg.keep.tolist() == [False, False, True, True]
    assert tg.metrics["train/zero_var_groups"] == 1.0 and tg.metrics["train/dropped_rows"] == 2.0
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert tg.advantages[2, 0].item() == pytest.approx(-s, abs=1e-9)
    assert tg.advantages[2, 1].item() == 0.0  # beyond row 2's single token
    assert tg.advantages[3].tolist() == pytest.approx([s, s], abs=1e-9)
    assert torch.equal(tg.is_weights, torch.ones(4, 2, dtype=F64))


def test_overlong_filter_masks_truncated_rows():
    tg = build_targets(TrainSection(overlong_filter=True), **base_inputs())
    assert tg.loss_mask[3].tolist() == [False, False] and tg.loss_mask[0].tolist() == [True, True]
    assert tg.metrics["train/overlong_masked"] == 1.0


def test_noisy_backward_correction_rescales_rewards():
    t = TrainSection(
        noisy_reward="backward", noisy_fp_rate=0.1, noisy_fn_rate=0.2, advantage="dr_grpo"
    )
    tg = build_targets(t, **base_inputs())
    # corrected r = (r - .1) / (1 - .1 - .2): 1 -> 1.285714, 0 -> -0.142857; group 1 mean .571429
    hi, lo = 0.9 / 0.7, -0.1 / 0.7
    assert tg.advantages[3, 0].item() == pytest.approx(hi - (hi + lo) / 2, abs=1e-9)
    assert tg.metrics["train/reward_mean"] == pytest.approx((3 * hi + lo) / 4, abs=1e-9)


def test_tis_weights_cap():
    rollout = torch.full((4, 2), -1.0, dtype=F64)
    rollout[0, 0] = -3.0  # old - rollout = 2 -> ratio e^2 = 7.39, capped at 2
    t = TrainSection(rollout_correction="tis", rollout_correction_cap=2.0)
    tg = build_targets(t, **base_inputs(rollout_logprobs=rollout))
    assert tg.is_weights[0, 0].item() == pytest.approx(2.0) and tg.is_weights[0, 1].item() == 1.0
    assert tg.metrics["train/tis_clipped"] == pytest.approx(1 / 7)  # 1 of 7 valid tokens


def test_forking_tokens_keep_top_entropy():
    ent = torch.tensor([[0.1, 0.9], [0.5, 0.2], [0.8, 0.0], [0.3, 0.4]], dtype=F64)
    tg = build_targets(TrainSection(forking_top_rho=0.3), **base_inputs(), entropy=ent)
    # 7 valid tokens, ceil(.3 * 7) = 3 kept: .9, .8, .5
    assert tg.loss_mask.tolist() == [[False, True], [True, False], [True, False], [False, False]]


def test_loss_adds_kl_and_entropy_bonus():
    t = TrainSection(policy_loss="reinforce", kl_coef=0.5, kl_estimator="k1", entropy_coef=0.1)
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=F64)
    ent = torch.tensor([[2.0, 4.0]], dtype=F64)
    loss, metrics = micro_batch_loss(
        t,
        logprobs=lp,
        entropy=ent,
        old_logprobs=lp.detach(),
        advantages=torch.tensor([[1.0, 1.0]], dtype=F64),
        loss_mask=torch.tensor([[True, True]]),
        is_weights=torch.ones(1, 2, dtype=F64),
        ref_logprobs=ref,
        num_tokens=4,
        num_seqs=1,
        horizon=2,
    )
    # token-mean with a GLOBAL count of 4 tokens (this micro-batch holds 2 of them):
    # pg = -(1*-1 + 1*-2)/4 = .75; k1 = lp - ref = (.5, -1) -> -.5/4 = -.125; entropy 6/4 = 1.5
    assert loss.item() == pytest.approx(0.75 + 0.5 * -0.125 - 0.1 * 1.5, abs=1e-12)
    assert metrics["_pg_loss"].item() == pytest.approx(0.75)
    assert metrics["_kl_loss"].item() == pytest.approx(-0.125)
    loss.backward()
    # d/dlp: pg -1/4 each, kl .5 * 1/4 each
    assert lp.grad[0].tolist() == pytest.approx([-0.25 + 0.125, -0.25 + 0.125])


def test_kl_in_reward_shapes_the_advantage():
    ref = torch.full((4, 2), -1.0, dtype=F64)
    ref[3] = -2.0  # old - ref = 1 on row 3's tokens
    t = TrainSection(kl_coef=0.5, kl_in_reward=True, kl_estimator="k1", advantage="dr_grpo")
    tg = build_targets(t, **base_inputs(ref_logprobs=ref))
    plain = build_targets(TrainSection(advantage="dr_grpo"), **base_inputs())
    assert not torch.allclose(tg.advantages, plain.advantages)
    assert tg.metrics["train/kl_in_reward"] == pytest.approx(2 / 7)


def test_rollout_mismatch_by_hand():
    # d = old - rollout on the sampled tokens: 0.5, 0, -0.25 (the padded slot is ignored)
    old = torch.tensor([[-1.0, -2.0], [-3.0, 9.0]], dtype=F64)
    rollout = torch.tensor([[-1.5, -2.0], [-2.75, 0.0]], dtype=F64)
    m = rollout_mismatch(old, rollout, response_mask_of([2, 1]))
    assert m["train/rollout_lp_diff_mean"] == pytest.approx(0.25, abs=1e-12)
    assert m["train/rollout_lp_diff_max"] == pytest.approx(0.5, abs=1e-12)
    # k3 = exp(d) - d - 1: 0.1487212707, 0, 0.0288007831; mean 0.0591740179
    assert m["train/rollout_kl"] == pytest.approx(0.0591740179, abs=1e-9)
    empty = rollout_mismatch(old, rollout, torch.zeros(2, 2, dtype=torch.bool))
    assert set(empty.values()) == {0.0}


def test_a_mini_batch_without_signal_is_the_one_whose_advantages_are_all_zero():
    """train.skip_no_signal_steps steps such a mini-batch at learning rate 0
    (components/train/update.py): group 0 (rewards 1, 1) has none, group 1 (0, 1) has."""
    from components.train.update import _Iteration

    tg = build_targets(TrainSection(), **base_inputs())
    it = object.__new__(_Iteration)  # no_signal reads only the train section
    it.t = TrainSection(skip_no_signal_steps=True)
    assert it.no_signal([0, 1], tg) and it.no_signal([], tg)
    assert not it.no_signal([1, 2], tg) and not it.no_signal([3], tg)
    it.t = TrainSection(skip_no_signal_steps=True, kl_coef=0.01)  # the KL term still pulls
    assert not it.no_signal([0, 1], tg)
    it.t = TrainSection(skip_no_signal_steps=True, entropy_coef=0.01)
    assert not it.no_signal([0, 1], tg)
