"""Pure policy-gradient math for the train stage (GRPO family, PPO-style losses, KL, filters).

Every public function here is a pure function of tensors and scalar hyperparameters: it reads no
config object, does no I/O, never mutates its inputs and never synchronises with the device
(no ``.item()``, ``float(tensor)``, ``.tolist()`` or Python branching on tensor values). Raising
``ValueError`` on a bad *scalar hyperparameter* is the only validation performed. Values at
masked (padding) positions are ignored: outputs are zero there and NaN/inf in padding reaches
neither the result nor a gradient.

Vocabulary and shapes (used in every docstring)::

    B  number of sequences (responses) in the tensors passed in
    L  number of response positions (responses are right-padded)
    V  vocabulary size
    logprobs       [B, L] float  log pi_theta(y_t | x, y_<t) under the current policy (has grad)
    old_logprobs   [B, L] float  log-probs under the policy that is being improved (no grad)
    ref_logprobs   [B, L] float  log-probs under the frozen reference policy
    advantages     [B, L] float  per-token advantage (zero where the mask is False)
    response_mask  [B, L] bool   True means the token counts
    rewards        [B]    float  outcome reward per sequence
    group_ids      [B]    int64  sequences sharing a prompt share an id (the GRPO "group")

Four registries map names to functions: ``ADVANTAGES``, ``POLICY_LOSSES``,
``LOSS_AGGREGATIONS`` and ``KL_ESTIMATORS``. Where verl (``verl/trainer/ppo/core_algos.py``)
defines the same quantity the semantics match verl's; docstrings name the verl equivalent and
any deliberate departure.
"""

from __future__ import annotations

# The library's families, one module each; importing them registers every name.
from components.train.algorithms._core import (
    ADVANTAGES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    broadcast_to_tokens,
    discounted_returns,
    get_advantage_fn,
    get_kl_fn,
    get_policy_loss_fn,
    group_mean_std,
    masked_mean,
    masked_sum,
    masked_whiten,
    outcome_to_token_rewards,
)
from components.train.algorithms.advantages import (
    dr_grpo_advantage,
    grpo_advantage,
    grpo_passk_advantage,
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    rloo_advantage,
    w_reinforce_advantage,
)
from components.train.algorithms.aggregation import (
    Count,
    aggregate_loss,
)
from components.train.algorithms.filters import (
    forking_token_mask,
    noisy_reward_backward_correction,
    noisy_reward_forward_correction,
    overlong_mask,
    rollout_is_weights,
    weight_positive_samples,
    zero_variance_group_mask,
)
from components.train.algorithms.kl import (
    kl_abs,
    kl_estimate,
    kl_in_reward,
    kl_k1,
    kl_k1_plus,
    kl_k2,
    kl_k3,
    kl_k3_plus,
)
from components.train.algorithms.logits import (
    entropy_from_logits,
    logprobs_from_hidden,
    logprobs_from_logits,
)
from components.train.algorithms.losses import (
    POLICY_LOSS_METRICS,
    cispo_loss,
    gspo_loss,
    ppo_clip_loss,
    reinforce_loss,
)

__all__ = [
    "ADVANTAGES",
    "Count",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "POLICY_LOSS_METRICS",
    "Registry",
    "UnknownNameError",
    "aggregate_loss",
    "broadcast_to_tokens",
    "cispo_loss",
    "discounted_returns",
    "dr_grpo_advantage",
    "entropy_from_logits",
    "forking_token_mask",
    "get_advantage_fn",
    "get_kl_fn",
    "get_policy_loss_fn",
    "group_mean_std",
    "grpo_advantage",
    "grpo_passk_advantage",
    "gspo_loss",
    "kl_abs",
    "kl_estimate",
    "kl_in_reward",
    "kl_k1",
    "kl_k1_plus",
    "kl_k2",
    "kl_k3",
    "kl_k3_plus",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "noisy_reward_backward_correction",
    "noisy_reward_forward_correction",
    "outcome_to_token_rewards",
    "overlong_mask",
    "ppo_clip_loss",
    "reinforce_loss",
    "reinforce_plus_plus_advantage",
    "reinforce_plus_plus_baseline_advantage",
    "rloo_advantage",
    "rollout_is_weights",
    "w_reinforce_advantage",
    "weight_positive_samples",
    "zero_variance_group_mask",
]
