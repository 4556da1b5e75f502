"""Hand-computed checks for components.train.algorithms (float64, tolerance 1e-6).

Expected values are written out from the formulas with plain Python arithmetic (the arithmetic
is in the comments); they never call the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from components.train import algorithms as alg

D = torch.float64
TOL = 1e-6


def t(values, dtype=D) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected) -> None:
    """|actual - expected| <= 1e-6 elementwise, same shape (NaN never matches)."""
    expected = expected if isinstance(expected, torch.Tensor) else t(expected)
    expected = expected.to(actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=TOL, rtol=0), f"\n{actual}\n!=\n{expected}"


def mask_from_lengths(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(-1)


def broadcast(per_seq: list[float], lengths: list[int], width: int) -> torch.Tensor:
    rows = [
        [v if j < n else 0.0 for j in range(width)] for v, n in zip(per_seq, lengths, strict=True)
    ]
    return t(rows)


# ----------------------------------------------------------------------------------------------
# Registries
# ----------------------------------------------------------------------------------------------

ALL_REGISTRIES = [
    alg.ADVANTAGES,
    alg.POLICY_LOSSES,
    alg.LOSS_AGGREGATIONS,
    alg.KL_ESTIMATORS,
]


def test_registered_names():
    assert alg.ADVANTAGES.names() == [
        "dr_grpo",
        "grpo",
        "grpo_passk",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "rloo",
        "w_reinforce",
    ]
    assert alg.POLICY_LOSSES.names() == ["cispo", "gspo", "ppo_clip", "reinforce"]
    assert alg.LOSS_AGGREGATIONS.names() == [
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
    ]
    assert alg.KL_ESTIMATORS.names() == [
        "abs",
        "k1",
        "k1+",
        "k2",
        "k3",
        "k3+",
        "kl",
        "low_var_kl",
        "mse",
    ]


@pytest.mark.parametrize("registry", ALL_REGISTRIES, ids=lambda r: r.family)
def test_unknown_name_lists_all_valid_names_sorted(registry):
    with pytest.raises(KeyError) as info:
        registry.get("definitely-not-registered")
    message = str(info.value)
    assert "definitely-not-registered" in message
    assert ", ".join(sorted(registry.names())) in message
    # Catchable as ValueError too.
    with pytest.raises(ValueError):
        registry.get("nope")


@pytest.mark.parametrize(
    "lookup",
    [alg.get_advantage_fn, alg.get_policy_loss_fn, alg.get_kl_fn],
    ids=lambda f: f.__name__,
)
def test_public_lookups_raise_with_names(lookup):
    with pytest.raises(KeyError, match="valid names: "):
        lookup("grpo_typo")


def test_aggregate_and_kl_estimate_bad_names():
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(KeyError, match="seq-mean-token-mean, seq-mean-token-sum, "):
        alg.aggregate_loss(torch.zeros(1, 2), m, "mean")
    with pytest.raises(ValueError, match="abs, k1, k1\\+, k2, k3, k3\\+, kl, low_var_kl, mse"):
        alg.kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), "k4")


def test_registry_register_get_duplicate_and_aliases():
    reg = alg.Registry("demo")

    @reg.register("b")
    @reg.register("a")
    def fn() -> int:
        return 1

    assert reg.names() == ["a", "b"]
    assert reg.get("a") is fn and reg.get("b") is fn
    assert "a" in reg and len(reg) == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(fn)
    with pytest.raises(ValueError):
        reg.register("")


# ----------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------

# Groups interleaved on purpose, non-contiguous ids:
#   group 10: indices 0, 2, 4, 6 with rewards 1, 0, 0, 1
#   group  3: indices 1, 5       with rewards 2, 0
#   group  7: index 3 (singleton) with reward 3
ADV_REWARDS = [1.0, 2.0, 0.0, 3.0, 0.0, 0.0, 1.0]
ADV_GROUPS = [10, 3, 10, 7, 10, 3, 10]
ADV_LENGTHS = [3, 2, 1, 3, 0, 2, 1]  # row 4 fully masked -> all-zero advantages
L = 3
EPS = 1e-6


def adv_inputs():
    return t(ADV_REWARDS), torch.tensor(ADV_GROUPS), mask_from_lengths(ADV_LENGTHS, L)


def test_grpo():
    # group 10: mean = 2/4 = 0.5; unbiased var = 4 * 0.5^2 / 3 = 1/3; std = sqrt(1/3)
    # group  3: mean = 1; var = (1^2 + 1^2) / 1 = 2; std = sqrt(2)
    # group  7: singleton -> mean 0, std 1 (verl) -> A = 3 / (1 + eps)
    s10, s3 = math.sqrt(1 / 3), math.sqrt(2.0)
    per_seq = [
        0.5 / (s10 + EPS),
        1.0 / (s3 + EPS),
        -0.5 / (s10 + EPS),
        3.0 / (1.0 + EPS),
        -0.5 / (s10 + EPS),
        -1.0 / (s3 + EPS),
        0.5 / (s10 + EPS),
    ]
    adv = alg.get_advantage_fn("grpo")(*adv_inputs())
    close(adv, broadcast(per_seq, ADV_LENGTHS, L))
    # norm_by_std=False == Dr.GRPO
    adv_nostd = alg.get_advantage_fn("grpo")(*adv_inputs(), norm_by_std=False)
    close(adv_nostd, broadcast([0.5, 1.0, -0.5, 3.0, -0.5, -1.0, 0.5], ADV_LENGTHS, L))


def test_grpo_matches_torch_std_convention():
    # Unbiased std like torch.std: rewards 0, 1, 5 -> mean 2, var = (4 + 1 + 9) / 2 = 7
    adv = alg.grpo_advantage(
        t([0.0, 1.0, 5.0]), torch.zeros(3, dtype=torch.long), torch.ones(3, 1, dtype=torch.bool)
    )
    close(
        adv[:, 0],
        [(-2) / (math.sqrt(7) + EPS), (-1) / (math.sqrt(7) + EPS), 3 / (math.sqrt(7) + EPS)],
    )


def test_dr_grpo():
    # r - group mean: 1-0.5, 2-1, 0-0.5, 3-0 (singleton mean 0), 0-0.5, 0-1, 1-0.5
    adv = alg.get_advantage_fn("dr_grpo")(*adv_inputs())
    close(adv, broadcast([0.5, 1.0, -0.5, 3.0, -0.5, -1.0, 0.5], ADV_LENGTHS, L))


def test_rloo():
    # group 10: 1 - (0+0+1)/3 = 2/3;  0 - (1+0+1)/3 = -2/3 (twice);  1 - 1/3 = 2/3
    # group  3: 2 - 0 = 2;  0 - 2 = -2;   singleton group 7 -> 0
    adv = alg.get_advantage_fn("rloo")(*adv_inputs())
    close(adv, broadcast([2 / 3, 2.0, -2 / 3, 0.0, -2 / 3, -2.0, 2 / 3], ADV_LENGTHS, L))


def test_reinforce_plus_plus_gamma_one():
    # rewards 1, 0, 2 with lengths 2, 1, 3; gamma = 1 -> every valid token's return = r
    # valid values 1,1 | 0 | 2,2,2: n = 6, mean = 8/6 = 4/3
    # squared deviations: (1/3)^2*2 + (4/3)^2 + (2/3)^2*3 = 2/9 + 16/9 + 12/9 = 10/3
    # unbiased var = (10/3) / 5 = 2/3
    mask = mask_from_lengths([2, 1, 3], 3)
    adv = alg.get_advantage_fn("reinforce_plus_plus")(t([1.0, 0.0, 2.0]), torch.arange(3), mask)
    d = math.sqrt(2 / 3 + 1e-8)
    m = 4 / 3
    close(adv, [[(1 - m) / d, (1 - m) / d, 0], [(0 - m) / d, 0, 0], [(2 - m) / d] * 3])


def test_reinforce_plus_plus_discounted():
    # gamma = 0.5: returns row0 (last=1): [0.5*1, 1]; row1: [0]; row2 (last=2): [0.25*2, 0.5*2, 2]
    # values 0.5, 1, 0, 0.5, 1, 2: mean = 5/6; sq. dev = 1/9+1/36+25/36+1/9+1/36+49/36 = 7/3
    # var = (7/3)/5 = 7/15
    mask = mask_from_lengths([2, 1, 3], 3)
    adv = alg.reinforce_plus_plus_advantage(t([1.0, 0.0, 2.0]), torch.arange(3), mask, gamma=0.5)
    d, m = math.sqrt(7 / 15 + 1e-8), 5 / 6
    close(
        adv,
        [
            [(0.5 - m) / d, (1 - m) / d, 0],
            [(0 - m) / d, 0, 0],
            [(0.5 - m) / d, (1 - m) / d, (2 - m) / d],
        ],
    )


def test_reinforce_plus_plus_baseline():
    # a = r - group mean = [0.5, 1, -0.5, 3, -0.5, -1, 0.5]; tokens (lengths 3,2,1,3,0,2,1):
    # 0.5 x3, 1 x2, -0.5 x1, 3 x3, (none), -1 x2, 0.5 x1 -> n = 12, sum = 10.5, mean = 0.875
    # sq. dev: 0.140625*4 + 0.015625*2 + 1.890625 + 4.515625*3 + 3.515625*2 = 23.0625
    # unbiased var = 23.0625 / 11
    m, d = 0.875, math.sqrt(23.0625 / 11 + 1e-8)
    per_seq = [(a - m) / d for a in [0.5, 1.0, -0.5, 3.0, -0.5, -1.0, 0.5]]
    adv = alg.get_advantage_fn("reinforce_plus_plus_baseline")(*adv_inputs())
    close(adv, broadcast(per_seq, ADV_LENGTHS, L))


def test_grpo_passk():
    # group 0: rewards 0.2, 0.9, 0.5 -> best idx 1, gap = 0.9 - 0.5 = 0.4
    #   mean = 1.6/3; sq. dev = (0.2-m)^2 + (0.9-m)^2 + (0.5-m)^2 = 0.24666..; std = sqrt(0.12333..)
    # group 1: rewards 1.0, 1.0, 0.0 -> tie: first index (3) is best, gap = 1 - 1 = 0 -> all 0
    # group 2: singleton -> 0 (verl would raise)
    rewards = t([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, 4.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    mask = mask_from_lengths([2, 2, 2, 2, 2, 2, 2], 2)
    m = 1.6 / 3
    std = math.sqrt(((0.2 - m) ** 2 + (0.9 - m) ** 2 + (0.5 - m) ** 2) / 2)
    adv = alg.get_advantage_fn("grpo_passk")(rewards, groups, mask)
    close(adv[:, 0], [0.0, 0.4 / (std + EPS), 0, 0, 0, 0, 0])
    close(adv[:, 1], adv[:, 0])
    adv_raw = alg.grpo_passk_advantage(rewards, groups, mask, norm_by_std=False)
    close(adv_raw[:, 0], [0.0, 0.4, 0, 0, 0, 0, 0])


def test_grpo_passk_tie_picks_first_index():
    # group: 3, 1, 3, 2 -> best is index 0 (first of the tied 3s); gap = 3 - 3 = 0.
    # group: 1, 5, 5 -> best index 5 (global 5), gap 0. group: 7, 2 -> best idx 7, gap 5.
    rewards = t([3.0, 1.0, 3.0, 2.0, 1.0, 5.0, 5.0, 7.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    adv = alg.grpo_passk_advantage(
        rewards, groups, torch.ones(9, 1, dtype=torch.bool), norm_by_std=False
    )
    close(adv[:, 0], [0, 0, 0, 0, 0, 0, 0, 5.0, 0])


def test_w_reinforce():
    # rewards in {-1, +1}: positives scaled by lambda = 0.1, negatives unchanged
    mask = mask_from_lengths([1, 2, 2, 1, 0], 2)
    rewards, groups = t([1.0, -1.0, 1.0, -1.0, 1.0]), torch.zeros(5, dtype=torch.long)
    adv = alg.get_advantage_fn("w_reinforce")(rewards, groups, mask)
    close(adv, [[0.1, 0], [-1, -1], [0.1, 0.1], [-1, 0], [0, 0]])
    nsr = alg.w_reinforce_advantage(rewards, groups, mask, positive_weight=0.0)
    close(nsr, [[0.0, 0], [-1, -1], [0, 0], [-1, 0], [0, 0]])


def test_token_level_rewards_are_summed_for_group_estimators():
    # [B, L] token rewards: sequence score = masked token sum (verl: token_level_rewards.sum(-1))
    mask = mask_from_lengths([2, 1], 2)
    token_rewards = t([[0.25, 0.75], [2.0, 99.0]])  # 99 sits on a masked position: ignored
    adv = alg.dr_grpo_advantage(token_rewards, torch.zeros(2, dtype=torch.long), mask)
    # scores 1.0, 2.0 -> mean 1.5 -> -0.5, +0.5
    close(adv, [[-0.5, -0.5], [0.5, 0.0]])


# ----------------------------------------------------------------------------------------------
# Policy losses
# ----------------------------------------------------------------------------------------------

LOGP = [[-0.5, -1.0, -2.0], [-0.3, -0.7, -1.1]]
RATIO = [[1.5, 0.5, 1.1], [0.5, 4.0, 1.1]]
PL_MASK = [[True, True, True], [True, True, False]]
PL_ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]


def pl_inputs():
    logp = t(LOGP).requires_grad_(True)
    old = t(LOGP) - torch.log(t(RATIO))  # so that exp(logp - old) == RATIO
    return logp, old, t(PL_ADV), torch.tensor(PL_MASK)


def masked(rows):
    return t(
        [
            [v if m else 0.0 for v, m in zip(r, mr, strict=True)]
            for r, mr in zip(rows, PL_MASK, strict=True)
        ]
    )


def check_common_metrics(metrics):
    assert set(metrics) == set(alg.POLICY_LOSS_METRICS)
    log_r = [[math.log(r) for r in row] for row in RATIO]
    close(metrics["ppo_kl"], masked([[-x for x in row] for row in log_r]))
    close(metrics["approx_kl"], masked([[0.5 * x * x for x in row] for row in log_r]))
    for value in metrics.values():
        assert not value.requires_grad


def test_ppo_clip_default():
    logp, old, adv, mask = pl_inputs()
    loss, metrics = alg.get_policy_loss_fn("ppo_clip")(logp, old, adv, mask)
    # row0 (A=+1): r=1.5 -> max(-1.5, -1.2) = -1.2 (clip high); r=0.5 -> max(-0.5, -0.8) = -0.5;
    #              r=1.1 -> -1.1
    # row1 (A=-2): r=0.5 -> max(1.0, 2*0.8=1.6) = 1.6 (clip low); r=4 -> max(8, 2.4) = 8; masked 0
    close(loss, [[-1.2, -0.5, -1.1], [1.6, 8.0, 0.0]])
    check_common_metrics(metrics)
    close(metrics["ratio"], masked(RATIO))
    close(metrics["clipfrac_high"], [[1, 0, 0], [0, 0, 0]])
    close(metrics["clipfrac_low"], [[0, 0, 0], [1, 0, 0]])
    close(metrics["clipfrac"], [[1, 0, 0], [1, 0, 0]])
    close(metrics["dual_clipfrac"], [[0, 0, 0], [0, 0, 0]])
    # d l / d logp = -A * r on the unclipped branch, 0 where clipped or masked:
    # row0: [0, -0.5, -1.1]; row1: [0, -(-2)*4 = 8, 0]
    loss.sum().backward()
    close(logp.grad, [[0.0, -0.5, -1.1], [0.0, 8.0, 0.0]])


def test_ppo_clip_dual_clip_and_clip_higher():
    logp, old, adv, mask = pl_inputs()
    loss, metrics = alg.ppo_clip_loss(logp, old, adv, mask, clip_high=0.6, dual_clip=3.0)
    # clip_high 0.6: r=1.5 < 1.6 -> unclipped -1.5. dual clip c=3 for A<0: min(8, -(-2)*3 = 6) = 6
    close(loss, [[-1.5, -0.5, -1.1], [1.6, 6.0, 0.0]])
    close(metrics["clipfrac_high"], [[0, 0, 0], [0, 0, 0]])
    close(metrics["dual_clipfrac"], [[0, 0, 0], [0, 1, 0]])
    loss.sum().backward()
    # dual-clipped token is a constant -> gradient 0; row0 tok0 now unclipped -> -1.5
    close(logp.grad, [[-1.5, -0.5, -1.1], [0.0, 0.0, 0.0]])


def test_ppo_clip_rejects_bad_options():
    logp, old, adv, mask = pl_inputs()
    with pytest.raises(ValueError):
        alg.ppo_clip_loss(logp, old, adv, mask, dual_clip=1.0)
    with pytest.raises(ValueError):
        alg.ppo_clip_loss(logp, old, adv, mask, clip_low=-0.1)
    with pytest.raises(TypeError):
        alg.ppo_clip_loss(logp, old, adv, mask, cliprange=0.2)


def gspo_inputs():
    logp = t(LOGP).requires_grad_(True)
    # log-ratios row0 [0.1, 0.3, (5.0 masked)] -> mean 0.2; row1 [-0.1, 0.1, 0.0] -> mean 0
    old = (t(LOGP) - t([[0.1, 0.3, 5.0], [-0.1, 0.1, 0.0]])).requires_grad_(True)
    adv = t([[1.0] * 3, [-1.0] * 3])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return logp, old, adv, mask


def test_gspo_default_clip():
    logp, old, adv, mask = gspo_inputs()
    loss, metrics = alg.get_policy_loss_fn("gspo")(logp, old, adv, mask)
    s0 = math.exp(0.2)  # 1.2214 > 1 + 4e-4 with A > 0 -> clipped: loss = -(1 + 4e-4)
    # row1: s = exp(0) = 1 inside [1 - 3e-4, 1 + 4e-4] -> loss = -(-1) * 1 = 1
    close(loss, [[-1.0004, -1.0004, 0.0], [1.0, 1.0, 1.0]])
    close(metrics["ratio"], [[s0, s0, 0.0], [1.0, 1.0, 1.0]])
    close(metrics["clipfrac_high"], [[1, 1, 0], [0, 0, 0]])
    close(metrics["clipfrac_low"], [[0, 0, 0], [0, 0, 0]])
    loss.sum().backward()
    # clipped row -> 0; row1: d l_t / d logp_t = -A * s = 1
    close(logp.grad, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert old.grad is None  # the sequence ratio is stop-gradient


def test_gspo_token_level_stop_gradient():
    logp, old, adv, mask = gspo_inputs()
    loss, _ = alg.gspo_loss(logp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    s0 = math.exp(0.2)
    close(loss, [[-s0, -s0, 0.0], [1.0, 1.0, 1.0]])
    # Backprop a single token's loss: only that token's logprob receives gradient (-A * s0),
    # which is the GSPO sg trick (without it every token of row 0 would get -A*s0/|y|).
    (grad,) = torch.autograd.grad(loss[0, 0], logp)
    close(grad, [[-s0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_cispo():
    logp, old, adv, mask = pl_inputs()
    old.requires_grad_(True)
    loss, metrics = alg.get_policy_loss_fn("cispo")(logp, old, adv, mask)
    # w = sg(clip(r, 1 - 1.0, 1 + 0.28)) = [[1.28, 0.5, 1.1], [0.5, 1.28, (masked)]]
    # l = -w * A * logp: row0 (A=1): -1.28*-0.5 = 0.64, -0.5*-1.0 = 0.5, -1.1*-2.0 = 2.2
    #                    row1 (A=-2): -0.5*-2*-0.3 = -0.3, -1.28*-2*-0.7 = -1.792, 0
    close(loss, [[0.64, 0.5, 2.2], [-0.3, -1.792, 0.0]])
    check_common_metrics(metrics)
    close(metrics["clipfrac_high"], [[1, 0, 0], [0, 1, 0]])
    close(metrics["clipfrac_low"], [[0, 0, 0], [0, 0, 0]])
    loss.sum().backward()
    # gradient -w * A on every valid token (none dropped), no gradient through the weight
    close(logp.grad, [[-1.28, -0.5, -1.1], [1.0, 2.56, 0.0]])
    assert old.grad is None


def test_cispo_lower_clip():
    logp, old, adv, mask = pl_inputs()
    loss, metrics = alg.cispo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # r = 0.5 now clipped up to 0.8: row0 tok1: -0.8*1*-1.0 = 0.8; row1 tok0: -0.8*-2*-0.3 = -0.48
    close(loss, [[0.64, 0.8, 2.2], [-0.48, -1.792, 0.0]])
    close(metrics["clipfrac_low"], [[0, 1, 0], [1, 0, 0]])
    close(metrics["clipfrac"], [[1, 1, 0], [1, 1, 0]])


def test_reinforce():
    logp, old, adv, mask = pl_inputs()
    loss, metrics = alg.get_policy_loss_fn("reinforce")(logp, old, adv, mask)
    # -A * logp: row0: 0.5, 1.0, 2.0; row1: -(-2)(-0.3) = -0.6, -1.4, masked 0
    close(loss, [[0.5, 1.0, 2.0], [-0.6, -1.4, 0.0]])
    check_common_metrics(metrics)
    close(metrics["clipfrac"], [[0, 0, 0], [0, 0, 0]])
    loss.sum().backward()
    close(logp.grad, [[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]])


@pytest.mark.parametrize("name", alg.POLICY_LOSSES.names())
def test_policy_loss_ignores_garbage_in_padding(name):
    logp, old, adv, mask = pl_inputs()
    logp = logp.detach().clone()
    logp[1, 2] = float("nan")
    old = old.clone()
    old[1, 2] = float("inf")
    logp.requires_grad_(True)
    loss, metrics = alg.get_policy_loss_fn(name)(logp, old, adv, mask)
    assert torch.isfinite(loss).all() and loss[1, 2] == 0
    assert all(torch.isfinite(v).all() for v in metrics.values())
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 2] == 0


# ----------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------


def test_aggregate_hand_values():
    loss = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])  # valid: 1, 2 | 4
    close(alg.aggregate_loss(loss, mask, "token-mean"), 7 / 3)  # (1+2+4)/3
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-sum"), 3.5)  # (3 + 4)/2
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-mean"), 2.75)  # (1.5 + 4)/2
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-sum-norm"), 7 / 6)  # 7/(2*3)
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-sum-norm", horizon=7), 0.5)  # 7/(2*7)
    close(alg.aggregate_loss(loss, mask, "token-mean", num_tokens=10), 0.7)
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-sum", num_seqs=torch.tensor(7)), 1.0)


def test_aggregate_defaults_skip_empty_sequences_and_all_masked_is_zero():
    loss = t([[1.0, 2.0], [9.0, 9.0]])
    mask = torch.tensor([[True, True], [False, False]])
    close(alg.aggregate_loss(loss, mask, "seq-mean-token-mean"), 1.5)  # one non-empty sequence
    empty = torch.zeros(2, 2, dtype=torch.bool)
    for mode in alg.LOSS_AGGREGATIONS.names():
        close(alg.aggregate_loss(loss, empty, mode), 0.0)


def _random_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(7, 6, generator=gen, dtype=D)
    mask = mask_from_lengths([6, 0, 3, 1, 5, 2, 4], 6)
    return loss, mask


@pytest.mark.parametrize("mode", alg.LOSS_AGGREGATIONS.names())
@pytest.mark.parametrize("micro", [1, 3, 7])
def test_aggregate_micro_batch_exactness(mode, micro):
    loss, mask = _random_batch()
    counts = {
        "num_tokens": mask.sum(),
        "num_seqs": mask.any(-1).sum(),
        "horizon": mask.shape[-1],
    }
    whole = alg.aggregate_loss(loss, mask, mode, **counts)
    # The whole batch with global counts == the whole batch with its own (default) counts.
    close(whole, alg.aggregate_loss(loss, mask, mode))
    parts = [
        alg.aggregate_loss(loss[i : i + micro], mask[i : i + micro], mode, **counts)
        for i in range(0, loss.shape[0], micro)
    ]
    close(torch.stack(parts).sum(), whole)
    # Also exact when each micro-batch is trimmed to its own padded width (horizon is fixed).
    trimmed = []
    for i in range(0, loss.shape[0], micro):
        m = mask[i : i + micro]
        width = max(int(m.sum(-1).max()), 1)  # test-side only; the library never does this
        trimmed.append(
            alg.aggregate_loss(loss[i : i + micro, :width], m[:, :width], mode, **counts)
        )
    close(torch.stack(trimmed).sum(), whole)


def test_aggregate_local_defaults_are_not_exact():
    # Why the caller must pass global counts: per-micro-batch token means do not add up.
    loss, mask = _random_batch()
    whole = alg.aggregate_loss(loss, mask, "token-mean")
    parts = sum(
        alg.aggregate_loss(loss[i : i + 3], mask[i : i + 3], "token-mean") for i in (0, 3, 6)
    )
    assert abs(float(parts - whole)) > 1e-3


def test_aggregate_gradient():
    loss, mask = _random_batch()
    loss.requires_grad_(True)
    alg.aggregate_loss(loss, mask, "token-mean").backward()
    # d/dl_{i,t} = 1/num_tokens on valid tokens (21 valid), 0 on padding
    close(loss.grad, mask.to(D) / 21)


# ----------------------------------------------------------------------------------------------
# KL
# ----------------------------------------------------------------------------------------------


def test_kl_estimators():
    logp, ref = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])  # d = logp - ref = [0.5, -1.0]
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]  # exp(ref-logp) - (ref-logp) - 1
    expected = {
        "k1": [0.5, -1.0],
        "kl": [0.5, -1.0],
        "abs": [0.5, 1.0],
        "k2": [0.125, 0.5],  # 0.5 * d^2
        "mse": [0.125, 0.5],
        "k3": k3,
        "low_var_kl": k3,
        "k1+": [0.5, -1.0],
        "k3+": k3,
    }
    assert sorted(expected) == alg.KL_ESTIMATORS.names()
    for kind, values in expected.items():
        close(alg.kl_estimate(logp, ref, kind), [values])
        close(alg.get_kl_fn(kind)(logp, ref), [values])


def test_kl_k3_clamps_like_verl():
    logp, ref = t([[0.0, 0.0]]), t([[30.0, -30.0]])
    # ref - logp clamped to +-20: exp(20) - 21 -> clamp 10;  exp(-20) + 20 - 1 ~ 19 -> clamp 10
    close(alg.kl_estimate(logp, ref, "k3"), [[10.0, 10.0]])


@pytest.mark.parametrize(
    "kind,grad",
    [
        ("k1", [1.0, 1.0]),
        ("k2", [0.5, -1.0]),  # d
        ("k3", [1 - math.exp(-0.5), 1 - math.exp(1.0)]),  # 1 - exp(ref - logp)
        ("k1+", [0.5, -1.0]),  # straight-through: k2's gradient
        ("k3+", [0.5, -1.0]),
    ],
)
def test_kl_gradients(kind, grad):
    logp = t([[-1.0, -2.0]]).requires_grad_(True)
    alg.kl_estimate(logp, t([[-1.5, -1.0]]), kind).sum().backward()
    close(logp.grad, [grad])


def test_kl_estimate_mask():
    mask = torch.tensor([[True, False]])
    close(
        alg.kl_estimate(t([[-1.0, -2.0]]), t([[-1.5, -1.0]]), "abs", response_mask=mask), [[0.5, 0]]
    )


def test_kl_in_reward():
    # outcome reward on the last valid token, minus coef * kl on every valid token
    rewards = t([1.0, 2.0])
    mask = mask_from_lengths([2, 3], 3)
    kl = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]).requires_grad_(True)
    out = alg.kl_in_reward(rewards, kl, mask, 0.5)
    # row0: [-0.05, 1 - 0.1, 0 (pad)]; row1: [-0.2, -0.25, 2 - 0.3]
    close(out, [[-0.05, 0.9, 0.0], [-0.2, -0.25, 1.7]])
    assert not out.requires_grad
    # REINFORCE++ on token-level rewards: returns (gamma=1) row0 [0.85, 0.9]; row1 [1.25, 1.45, 1.7]
    adv = alg.reinforce_plus_plus_advantage(out, torch.arange(2), mask)
    vals = [0.85, 0.9, 1.25, 1.45, 1.7]
    m = sum(vals) / 5  # 6.15 / 5 = 1.23
    d = math.sqrt(sum((v - m) ** 2 for v in vals) / 4 + 1e-8)
    close(
        adv, [[(0.85 - m) / d, (0.9 - m) / d, 0.0], [(1.25 - m) / d, (1.45 - m) / d, (1.7 - m) / d]]
    )


def test_outcome_to_token_rewards_non_contiguous_and_empty():
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]])
    close(alg.outcome_to_token_rewards(t([3.0, 4.0]), mask), [[0, 0, 3.0, 0], [0, 0, 0, 0]])


# ----------------------------------------------------------------------------------------------
# Logits
# ----------------------------------------------------------------------------------------------


def test_entropy_from_logits_hand_values():
    # uniform over 4 -> ln 4; logits (1, 2, 3) -> -sum p ln p with p = e^k / (e + e^2 + e^3)
    z = math.e + math.e**2 + math.e**3
    p = [math.e / z, math.e**2 / z, math.e**3 / z]
    h = -sum(q * math.log(q) for q in p)
    logits = t([[[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, -math.inf]]])
    close(alg.entropy_from_logits(logits), [[math.log(4), h]])


def test_logprobs_from_logits_hand_values():
    # log p(token) = z_token - ln(sum exp z)
    z = math.e + math.e**2 + math.e**3
    logits = t([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]])
    tokens = torch.tensor([[2, 0]])
    close(alg.logprobs_from_logits(logits, tokens), [[3 - math.log(z), 1 - math.log(z)]])


def test_logits_chunking_precision_and_gradients():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 5, 11, generator=gen, dtype=D) * 4).requires_grad_(True)
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    ref_lp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ref_h = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    for chunk in (None, 1, 4, 1024):
        close(alg.logprobs_from_logits(logits, tokens, chunk_size=chunk), ref_lp)
        close(alg.entropy_from_logits(logits, chunk_size=chunk), ref_h)
    # d log p(y) / d z = onehot(y) - softmax(z)
    alg.logprobs_from_logits(logits, tokens, chunk_size=4).sum().backward()
    expected = torch.nn.functional.one_hot(tokens, 11).to(D) - torch.softmax(logits.detach(), -1)
    close(logits.grad, expected)
    # low precision is upcast to float32
    bf = logits.detach().to(torch.bfloat16)
    assert alg.logprobs_from_logits(bf, tokens).dtype == torch.float32
    assert alg.entropy_from_logits(bf).dtype == torch.float32
    with pytest.raises(ValueError):
        alg.entropy_from_logits(logits, chunk_size=0)


# ----------------------------------------------------------------------------------------------
# Seed-paper techniques
# ----------------------------------------------------------------------------------------------


def test_weight_positive_samples():
    adv = t([[1.0, -1.0], [0.5, 0.0]])
    # by advantage sign: positives x0.1
    close(alg.weight_positive_samples(adv, 0.1), [[0.1, -1.0], [0.05, 0.0]])
    # by sequence reward: only row 1 (reward 1 > 0) is positive
    close(alg.weight_positive_samples(adv, 0.1, rewards=t([0.0, 1.0])), [[1.0, -1.0], [0.05, 0.0]])
    close(alg.weight_positive_samples(adv, 1.0), adv)  # lambda = 1 -> unchanged
    close(alg.weight_positive_samples(t([2.0, -3.0]), 0.0), [0.0, -3.0])  # pure NSR, [B] input
    with pytest.raises(ValueError):
        alg.weight_positive_samples(adv, -0.5)


def test_forking_token_mask():
    entropy = t([[0.5, 0.9, 0.1, 5.0], [0.9, 0.3, 0.7, 2.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])  # 5.0 is padding
    # 7 valid tokens by entropy: 2.0 (1,3), 0.9 (0,1), 0.9 (1,0), 0.7 (1,2), 0.5, 0.3, 0.1
    m = alg.forking_token_mask(entropy, mask, 0.5)  # k = ceil(3.5) = 4
    assert m.tolist() == [[False, True, False, False], [True, False, True, True]]
    m = alg.forking_token_mask(entropy, mask, 0.2)  # k = ceil(1.4) = 2: tie at 0.9 -> (0,1)
    assert m.tolist() == [[False, True, False, False], [False, False, False, True]]
    assert alg.forking_token_mask(entropy, mask, 1.0).equal(mask)
    assert not alg.forking_token_mask(entropy, mask, 0.0).any()
    # float slack: 0.7 * 10 = 7.000000000000001 must keep 7, not 8
    ten = torch.ones(1, 10, dtype=torch.bool)
    assert int(alg.forking_token_mask(torch.arange(10, dtype=D)[None], ten, 0.7).sum()) == 7
    with pytest.raises(ValueError):
        alg.forking_token_mask(entropy, mask, 1.5)


def test_noisy_reward_backward_correction():
    rho0, rho1 = 0.1, 0.2  # FP, FN
    r_hat = alg.noisy_reward_backward_correction(t([1.0, 0.0]), rho0, rho1)
    # (1 - 0.1) / 0.7 = 1.285714...,  (0 - 0.1) / 0.7 = -0.142857...
    close(r_hat, [0.9 / 0.7, -0.1 / 0.7])
    # unbiased: E[r_hat | r=1] = 0.8*r_hat(1) + 0.2*r_hat(0) = 1;  E[r_hat | r=0] = 0
    close((1 - rho1) * r_hat[0] + rho1 * r_hat[1], 1.0)
    close(rho0 * r_hat[0] + (1 - rho0) * r_hat[1], 0.0)
    for fp, fn in [(0.5, 0.5), (0.7, 0.4), (-0.1, 0.2), (0.1, 1.2)]:
        with pytest.raises(ValueError):
            alg.noisy_reward_backward_correction(t([1.0]), fp, fn)


def test_noisy_reward_forward_correction():
    rho0, rho1 = 0.1, 0.2
    w = alg.noisy_reward_forward_correction(t([1.0, 0.0]), rho1)
    close(w, [0.2, -0.8])  # w1 = rho1, w0 = rho1 - 1
    # E[w | r=1] = 0.8*0.2 + 0.2*(-0.8) = 0;  E[w | r=0] = 0.1*0.2 + 0.9*(-0.8) = -0.7
    # i.e. (1 - rho0 - rho1) * (r - 1)
    close((1 - rho1) * w[0] + rho1 * w[1], 0.0)
    close(rho0 * w[0] + (1 - rho0) * w[1], -(1 - rho0 - rho1))
    with pytest.raises(ValueError):
        alg.noisy_reward_forward_correction(t([1.0]), 1.0)


# ----------------------------------------------------------------------------------------------
# Rollout correction
# ----------------------------------------------------------------------------------------------

RO_MASK = [[True, True, True], [True, True, False]]


def ro_inputs():
    ratios = t([[2.0, 0.5, 3.0], [1.5, 1.2, 9.0]])  # rho = exp(old - rollout)
    rollout = t([[-1.0, -2.0, -0.5], [-0.3, -0.4, -0.6]])
    return rollout + torch.log(ratios), rollout, torch.tensor(RO_MASK)


def test_rollout_is_token_level():
    old, rollout, mask = ro_inputs()
    w, m = alg.rollout_is_weights(old, rollout, mask, mode="tis", cap=2.5)
    close(w, [[2.0, 0.5, 2.5], [1.5, 1.2, 0.0]])  # min(rho, 2.5); masked 0
    close(m["tis_clipped"], [[0, 0, 1], [0, 0, 0]])
    close(m["is_ratio"], [[2.0, 0.5, 3.0], [1.5, 1.2, 0.0]])
    w, m = alg.rollout_is_weights(old, rollout, mask, mode="mis", cap=2.5)
    close(w, [[2.0, 0.5, 0.0], [1.5, 1.2, 0.0]])  # rho * [rho <= 2.5]
    close(m["tis_clipped"], [[0, 0, 1], [0, 0, 0]])


def test_rollout_is_sequence_level():
    old, rollout, mask = ro_inputs()
    # row0: 2 * 0.5 * 3 = 3 > 2.5;  row1: 1.5 * 1.2 = 1.8 (masked 9 excluded)
    w, m = alg.rollout_is_weights(old, rollout, mask, mode="tis", cap=2.5, level="sequence")
    close(w, [[2.5, 2.5, 2.5], [1.8, 1.8, 0.0]])
    close(m["tis_clipped"], [[1, 1, 1], [0, 0, 0]])
    w, _ = alg.rollout_is_weights(old, rollout, mask, mode="mis", cap=2.5, level="sequence")
    close(w, [[0.0, 0.0, 0.0], [1.8, 1.8, 0.0]])


def test_rollout_is_validation_and_no_grad():
    old, rollout, mask = ro_inputs()
    old.requires_grad_(True)
    w, _ = alg.rollout_is_weights(old, rollout, mask, mode="tis", cap=2.0)
    assert not w.requires_grad
    for kwargs in [
        {"mode": "is", "cap": 2.0},
        {"mode": "tis", "cap": 0.0},
        {"mode": "tis", "cap": 2.0, "level": "batch"},
    ]:
        with pytest.raises(ValueError):
            alg.rollout_is_weights(old, rollout, mask, **kwargs)


# ----------------------------------------------------------------------------------------------
# DAPO
# ----------------------------------------------------------------------------------------------


def test_zero_variance_group_mask():
    # group 0: 1, 1 (equal -> drop); group 1: 0, 1 (keep); group 2: 2, 2 (drop); group 3: single
    rewards = t([1.0, 0.0, 1.0, 2.0, 1.0, 2.0, 5.0])
    groups = torch.tensor([0, 1, 0, 2, 1, 2, 3])
    keep = alg.zero_variance_group_mask(rewards, groups)
    assert keep.tolist() == [False, True, False, False, True, False, False]


def test_overlong_mask():
    mask = mask_from_lengths([2, 3], 3)
    out = alg.overlong_mask(mask, torch.tensor([False, True]))
    assert out.tolist() == [[True, True, False], [False, False, False]]


# ----------------------------------------------------------------------------------------------
# Purity: no_grad friendly, inputs untouched
# ----------------------------------------------------------------------------------------------


def _assert_unchanged(fn, *args, **kwargs):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    snapshots = [a.clone() for a in tensors]
    with torch.no_grad():
        out = fn(*args, **kwargs)
    for before, after in zip(snapshots, tensors, strict=True):
        assert torch.equal(before, after)
    leaves = out if isinstance(out, tuple) else (out,)
    flat = []
    for leaf in leaves:
        flat.extend(leaf.values() if isinstance(leaf, dict) else [leaf])
    for value in flat:
        assert isinstance(value, torch.Tensor) and not value.requires_grad
        assert torch.isfinite(value.to(D)).all()
    return out


@pytest.mark.parametrize("name", alg.ADVANTAGES.names())
def test_purity_advantages(name):
    rewards, groups, mask = adv_inputs()
    adv = _assert_unchanged(alg.get_advantage_fn(name), rewards, groups, mask)
    assert adv.shape == mask.shape and (adv[~mask] == 0).all()


@pytest.mark.parametrize("name", alg.POLICY_LOSSES.names())
def test_purity_policy_losses(name):
    logp, old, adv, mask = pl_inputs()
    loss, metrics = _assert_unchanged(alg.get_policy_loss_fn(name), logp, old, adv, mask)
    assert (loss[~mask] == 0).all() and all((v[~mask] == 0).all() for v in metrics.values())


@pytest.mark.parametrize("name", alg.KL_ESTIMATORS.names())
def test_purity_kl(name):
    _assert_unchanged(alg.kl_estimate, t([[-1.0, -2.0]]), t([[-1.5, -1.0]]), name)


@pytest.mark.parametrize("mode", alg.LOSS_AGGREGATIONS.names())
def test_purity_aggregation(mode):
    loss, mask = _random_batch()
    _assert_unchanged(alg.aggregate_loss, loss, mask, mode, num_tokens=torch.tensor(21))


def test_purity_helpers():
    rewards, groups, mask = adv_inputs()
    entropy = torch.rand(mask.shape, dtype=D)
    logits = torch.randn(2, 3, 5, dtype=D)
    old, rollout, ro_mask = ro_inputs()
    _assert_unchanged(alg.kl_in_reward, rewards, torch.rand(mask.shape, dtype=D), mask, 0.1)
    _assert_unchanged(alg.entropy_from_logits, logits)
    _assert_unchanged(alg.logprobs_from_logits, logits, torch.zeros(2, 3, dtype=torch.long))
    _assert_unchanged(alg.weight_positive_samples, rewards, 0.1)
    _assert_unchanged(alg.forking_token_mask, entropy, mask, 0.2)
    _assert_unchanged(alg.noisy_reward_backward_correction, rewards.clamp(max=1), 0.1, 0.1)
    _assert_unchanged(alg.noisy_reward_forward_correction, rewards.clamp(max=1), 0.1)
    _assert_unchanged(alg.rollout_is_weights, old, rollout, ro_mask, mode="mis", cap=2.0)
    _assert_unchanged(alg.zero_variance_group_mask, rewards, groups)
    _assert_unchanged(alg.overlong_mask, mask, torch.tensor([True] + [False] * 6))
    _assert_unchanged(alg.masked_whiten, rewards[:, None].expand(mask.shape).clone(), mask)
    _assert_unchanged(alg.discounted_returns, torch.rand(mask.shape, dtype=D), mask, 0.9)


def test_no_host_sync_on_meta_device():
    # Meta tensors carry shapes but no data: any .item(), float(tensor), .tolist(), Python
    # branch on a tensor value or data-dependent output shape (torch.unique, nonzero) raises.
    meta = torch.device("meta")
    lp, old, adv = (torch.empty(4, 5, device=meta) for _ in range(3))
    mask = torch.empty(4, 5, dtype=torch.bool, device=meta)
    rewards, groups = torch.empty(4, device=meta), torch.empty(4, dtype=torch.long, device=meta)
    for name in alg.ADVANTAGES.names():
        assert alg.get_advantage_fn(name)(rewards, groups, mask).shape == (4, 5)
    alg.reinforce_plus_plus_advantage(rewards, groups, mask, gamma=0.9)
    for name in alg.POLICY_LOSSES.names():
        alg.get_policy_loss_fn(name)(lp, old, adv, mask)
    for mode in alg.LOSS_AGGREGATIONS.names():
        alg.aggregate_loss(lp, mask, mode)
        alg.aggregate_loss(lp, mask, mode, num_tokens=torch.empty((), device=meta), num_seqs=3)
    for kind in alg.KL_ESTIMATORS.names():
        alg.kl_estimate(lp, old, kind, response_mask=mask)
    logits = torch.empty(4, 5, 7, device=meta)
    alg.entropy_from_logits(logits, chunk_size=3)
    alg.logprobs_from_logits(logits, torch.empty(4, 5, dtype=torch.long, device=meta), chunk_size=3)
    alg.kl_in_reward(rewards, lp, mask, 0.1)
    alg.weight_positive_samples(adv, 0.1, rewards=rewards)
    alg.forking_token_mask(lp, mask, 0.2)
    alg.noisy_reward_backward_correction(rewards, 0.1, 0.2)
    alg.noisy_reward_forward_correction(rewards, 0.2)
    for mode in ("tis", "mis"):
        for level in ("token", "sequence"):
            alg.rollout_is_weights(lp, old, mask, mode=mode, cap=2.0, level=level)
    alg.zero_variance_group_mask(rewards, groups)
    alg.overlong_mask(mask, torch.empty(4, dtype=torch.bool, device=meta))
