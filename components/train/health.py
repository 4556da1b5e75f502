"""Run health: is the run still learning, and if not, why (docs/health.md). The record and the
stop it decides are components/core/run_control.py's.

Train judges every iteration, after its update and before it commits the checkpoint, from
figures the stages already commit (components/core/figures.py): the iteration's rollout and
verify figures and train's own. :func:`fold` is a pure step from the health after iteration
i - 1 (the previous checkpoint's manifest holds it) and iteration i's figures to the health
after i, so the verdict costs two manifest reads per iteration whatever the run's length, and
the same fold over a recorded run's dynamics (report/dynamics.csv) gives the same verdicts
(tests pin the thresholds that way).

Symptoms, each raised once when it appears (an :class:`Event`):

* **no signal**: at least `health.no_signal_share` of the groups had equal rewards, so
  GRPO-family advantages are zero. Two such iterations in a row give the verdict:
  *collapsed* (every group wrong, after groups carried signal), *saturated* (every group
  right: nothing left to learn from these prompts) or *no signal* (from the start, or equal
  partial rewards). `health.stop_after` of them in a row stop the run.
* **truncation surge**: the share of responses cut at max_new_tokens rose past
  `health.truncation` and `health.truncation_rise` times iteration 0's.
* **update too large**: train/approx_kl or train/ppo_kl above `health.update_kl` (the first
  update's size is the usual cause of a collapse).
* **logprob gap**: the sampler's and the trainer's logprobs disagree (train/rollout_kl above
  `health.logprob_gap`).
* **reward fell**: two iterations at or below `health.reward_drop` of the best two-iteration
  reward mean so far.
* **entropy** (a note, not a warning: it falls in runs that learn well too): train/entropy
  below a tenth of iteration 0's.
* **moving without signal** (a cause in a verdict): the policy still moved (ppo_kl) in an
  iteration whose gradient was zero: Adam's momentum.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from components.core.config import HealthSection, RunConfig
from components.core.run_control import FAILING, Event, Health, Verdict, recorded_health
from components.train.algorithms import ADVANTAGES

log = logging.getLogger("rlvr.health")

__all__ = ["fold", "fold_run", "judge"]


def group_relative_estimator(name: str) -> bool:
    """Whether advantage estimator `name` gives a group whose rewards are equal zero advantage,
    as it declared when registered (``ADVANTAGES.register(name, group_relative=...)``). Others
    (REINFORCE++'s batch whitening, W-REINFORCE's raw reward) learn from such groups, so "no
    signal" is not judged for them. An unregistered name is judged: the config check names it."""
    return bool(ADVANTAGES.trait(name, "group_relative", True))


#: The figures a verdict reads (components/core/figures.py names).
NO_SIGNAL = "verify/zero_signal_share"


ALL_WRONG = "verify/all_wrong_share"


ALL_RIGHT = "verify/all_correct_share"


REWARD = "verify/reward_mean"


TRUNCATED = "rollout/truncated_fraction"


LENGTH = "rollout/response_length_mean"


ENTROPY = "train/entropy"


APPROX_KL = "train/approx_kl"


PPO_KL = "train/ppo_kl"


ROLLOUT_KL = "train/rollout_kl"


GRAD_NORM = "train/grad_norm"


#: How many events a health record keeps (the newest): a record rides in every manifest.
MAX_EVENTS = 32


#: The verdict needs this many no-signal iterations in a row (one can be chance), or
#: `health.stop_after` when that is fewer.
VERDICT_AFTER = 2


#: A verdict names the symptoms that appeared from this many iterations before its streak.
CAUSE_WINDOW = 3


#: Iterations folded again where a run's previous checkpoint holds no health record.
REFOLD = 8


FIXES = {
    "update_kl": "a lower train.lr, a KL term (train.kl_coef), or a tighter clip",
    "truncation": "train.overlong_filter (truncated responses out of the loss) or "
    "generate.overlong_penalty, or a larger generate.max_new_tokens",
    "logprob_gap": "train.rollout_correction: tis, and the sampler's dtype (generate.dtype)",
    "collapsed": "a lower train.lr, a KL term (train.kl_coef), train.overlong_filter, "
    "train.dynamic_sampling",
    "saturated": "harder prompts, or a curriculum (data.sampler) that skips solved ones",
    "no_signal": "easier prompts or a stronger base model; more samples per prompt (generate.n)",
    "reward": "a lower train.lr, or a KL term (train.kl_coef)",
}


def _get(figures: Mapping[str, float], name: str) -> float | None:
    value = figures.get(name)
    return None if value is None else float(value)


def _no_signal(figures: Mapping[str, float], rule: HealthSection) -> str | None:
    """What most groups agreed on when the iteration carried no signal: 'wrong', 'right' or
    'equal' (a partial reward); None when it had signal (or no groups of more than one sample
    to judge)."""
    share = _get(figures, NO_SIGNAL)
    groups, samples = _get(figures, "verify/groups"), _get(figures, "verify/samples")
    if share is None or (groups and samples is not None and samples <= groups):
        return None  # no figure, or one sample per prompt: no groups to agree
    if share < rule.no_signal_share:
        return None
    wrong, right = _get(figures, ALL_WRONG) or 0.0, _get(figures, ALL_RIGHT) or 0.0
    if max(wrong, right) < share / 2:  # most groups agree on a partial reward
        return "equal"
    return "wrong" if wrong >= right else "right"


def _symptoms(h: Health, i: int, f: Mapping[str, float], rule: HealthSection) -> dict:
    """{symptom: (level, message)} present at iteration i (no_signal aside)."""
    out: dict[str, tuple[str, str]] = {}
    first_t = h.first.get(TRUNCATED)
    t = _get(f, TRUNCATED)
    if t is not None and first_t is not None and i > 0:
        if t >= rule.truncation and t >= rule.truncation_rise * max(first_t, 0.01):
            out["truncation"] = (
                "warning",
                f"truncation rose {first_t:.0%} -> {t:.0%} (responses cut at max_new_tokens "
                f"get no reward): {FIXES['truncation']}",
            )
    kl = max((x for x in (_get(f, APPROX_KL), _get(f, PPO_KL)) if x is not None), default=None)
    if kl is not None and kl > rule.update_kl:
        which = "the first update" if i == 0 else f"update {i}"
        out["update_kl"] = (
            "warning",
            f"{which} moved the policy far (KL {kl:.2f} > {rule.update_kl}): {FIXES['update_kl']}",
        )
    gap = _get(f, ROLLOUT_KL)
    if gap is not None and gap > rule.logprob_gap:
        out["logprob_gap"] = (
            "warning",
            f"the sampler's and the trainer's logprobs disagree (rollout_kl {gap:.3f} > "
            f"{rule.logprob_gap}): {FIXES['logprob_gap']}",
        )
    ent, first_e = _get(f, ENTROPY), h.first.get(ENTROPY)
    noted = any(e.symptom == "entropy" for e in h.events)  # once a run: it hovers near the line
    if ent is not None and first_e and i > 0 and ent < 0.1 * first_e and not noted:
        out["entropy"] = (
            "note",
            f"entropy fell {first_e:.3f} -> {ent:.3f}: sampling is nearly deterministic, so "
            "groups will agree more often (an entropy bonus or a higher temperature keeps "
            "exploring)",
        )
    if h.low_reward >= 2 and h.best_reward2 is not None and not h.streak:  # else: no signal
        out["reward"] = (
            "warning",
            f"the reward fell to {h.last_reward:.3f} from a best of {h.best_reward2:.3f}: "
            f"{FIXES['reward']}",
        )
    return out


def _track_reward(h: Health, reward: float | None, rule: HealthSection) -> None:
    if reward is None:
        return
    best = h.best_reward2
    if best is not None and best >= 0.1 and reward <= rule.reward_drop * best:
        h.low_reward += 1
    else:
        h.low_reward = 0
    if h.last_reward is not None:
        pair = (h.last_reward + reward) / 2
        h.best_reward2 = pair if best is None else max(best, pair)
    h.last_reward = reward


def _moving_without_signal(f: Mapping[str, float]) -> str | None:
    kl, g = _get(f, PPO_KL), _get(f, GRAD_NORM)
    if kl is not None and g is not None and g < 1e-6 and abs(kl) > 1e-3:
        return (
            f"the policy kept moving without a gradient (ppo_kl {kl:.3f} at grad_norm 0, "
            "from Adam's momentum)"
        )
    return None


def _verdict_sentence(h: Health, i: int, f: Mapping[str, float]) -> tuple[Verdict, str]:
    kind, start, k = h.streak_kind, h.streak_start, h.streak
    share = {"wrong": ALL_WRONG, "right": ALL_RIGHT}.get(kind, NO_SIGNAL)
    agree = {"wrong": "all wrong", "right": "all correct", "equal": "with equal rewards"}[kind]
    reward = _get(f, REWARD)
    what = (
        f"no signal for {_count(k, 'iteration')} ({(_get(f, share) or 0.0):.0%} of groups {agree}"
        + (f", reward {reward:.3f})" if reward is not None else ")")
    )
    if kind == "wrong" and h.had_signal:
        verdict: Verdict = "collapsed"
    elif kind == "right":
        verdict = "saturated"
    else:
        verdict = "no_signal"
    causes = [  # as they first appeared, from CAUSE_WINDOW iterations before the streak on
        e.message
        for e in h.events
        if e.symptom in ("truncation", "update_kl", "logprob_gap")
        and e.iteration >= start - CAUSE_WINDOW
    ]
    if moving := _moving_without_signal(f):
        causes.append(moving)
    head = {
        "collapsed": f"collapsed at iteration {start}",
        "saturated": f"saturated at iteration {start}",
        "no_signal": f"no signal since iteration {start}"
        + ("" if h.had_signal else " (none from the start)"),
    }[verdict]
    cause = ("; after " + "; ".join(c.split(": ")[0] for c in causes)) if causes else ""
    return verdict, f"{head}: {what}{cause}. Usual fixes: {FIXES[verdict]}"


def _raise(
    h: Health, i: int, symptom: str, level: str, message: str, since: int | None = None
) -> None:
    h.events.append(Event(iteration=i, symptom=symptom, level=level, message=message, since=since))
    h.events = h.events[-MAX_EVENTS:]


def fold(
    h: Health | None,
    i: int,
    figures: Mapping[str, float],
    rule: HealthSection,
    *,
    group_relative: bool = True,
) -> Health:
    """The health after iteration `i` from the health after i - 1 (None: before iteration 0)
    and iteration i's figures (rollout/…, verify/… and train/… names). `group_relative`: the
    run's advantage estimator gives equal-reward groups zero advantage (the estimator's
    `group_relative` declaration)."""
    h = Health() if h is None else h.model_copy(deep=True)
    if i == 0 or not h.first:
        h.first = {k: float(figures[k]) for k in (TRUNCATED, LENGTH, ENTROPY) if k in figures}
    _track_reward(h, _get(figures, REWARD), rule)
    kind = _no_signal(figures, rule) if group_relative else None
    previous = set(h.active)
    present = _symptoms(h, i, figures, rule)
    if kind is None:
        if h.verdict in FAILING:
            _raise(h, i, "recovered", "note", f"signal returned at iteration {i}")
        h.streak, h.streak_start, h.streak_kind = 0, None, ""
        if _get(figures, NO_SIGNAL) is not None:
            h.had_signal = True
    else:
        if h.streak == 0:
            h.streak_start = i
        h.streak, h.streak_kind = h.streak + 1, kind
        present["no_signal"] = ("warning", _no_signal_message(i, kind, figures))
    for symptom, (level, message) in present.items():
        if symptom not in previous:
            _raise(h, i, symptom, level, message)
    h.active = sorted(present)
    h.iteration = i
    _judge(h, i, figures, rule)
    return h


def _no_signal_message(i: int, kind: str, figures: Mapping[str, float]) -> str:
    agree = {"wrong": "all wrong", "right": "all correct", "equal": "with equal rewards"}[kind]
    share = _get(figures, NO_SIGNAL) or 0.0
    return f"iteration {i}: no signal in {share:.0%} of groups ({agree}): advantages are zero"


def _judge(h: Health, i: int, figures: Mapping[str, float], rule: HealthSection) -> None:
    needed = min(VERDICT_AFTER, rule.stop_after) if rule.stop_after else VERDICT_AFTER
    warnings = [e for e in h.events if e.level == "warning"]
    if h.streak >= needed:
        verdict, sentence = _verdict_sentence(h, i, figures)
        if h.verdict != verdict:
            _raise(h, i, verdict, "verdict", sentence, since=h.streak_start)
        h.verdict, h.summary = verdict, sentence
    elif warnings:
        last = warnings[-1]
        back = ""
        returned = [e for e in h.events if e.symptom == "recovered"]
        verdicts = [e for e in h.events if e.level == "verdict"]
        if returned and verdicts:
            back = (
                f"; {verdicts[-1].symptom} at iteration {verdicts[-1].since}, signal returned "
                f"at iteration {returned[-1].iteration}"
            )
        h.verdict = "warning"
        h.summary = (
            f"{_count(len(warnings), 'warning')}{back}; the latest at iteration "
            f"{last.iteration}: {last.message}"
        )
    else:
        h.verdict, h.summary = "healthy", "healthy"
    h.stop = rule.stop_after > 0 and h.streak >= rule.stop_after


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fold_run(
    rows: Mapping[int, Mapping[str, float]], rule: HealthSection, *, group_relative: bool = True
) -> list[Health]:
    """The health after each iteration of a recorded run ({iteration: figures}, as
    report/dynamics.csv holds them), in order."""
    out: list[Health] = []
    h: Health | None = None
    for i in sorted(rows):
        h = fold(h, i, rows[i], rule, group_relative=group_relative)
        out.append(h)
    return out


def iteration_figures(store, layout, iteration: int) -> dict[str, float]:
    """Iteration `iteration`'s rollout and verify figures, every shard combined, from their
    manifests (as the run dashboard reads them: components/report/dynamics.py)."""
    from components.core.commit import committed_parts, read_manifest
    from components.core.figures import combine_shards, stage_figures

    out: dict[str, float] = {}
    for stage, uri in (
        ("generate", layout.rollouts(iteration)),
        ("verify", layout.scored(iteration)),
    ):
        parts = [
            stage_figures(stage, read_manifest(store, p).get("stats") or {})
            for p in committed_parts(store, uri)
        ]
        out |= combine_shards(parts)
    return out


def _refold(store, layout, iteration: int, rule: HealthSection, group_relative: bool):
    """The health after `iteration - 1`, folded from the run's committed figures where the
    previous checkpoint holds no record (a run recorded before health existed): iteration 0
    (the baselines) and the REFOLD iterations before this one, so the cost stays bounded."""
    from components.core.commit import read_manifest
    from components.core.figures import stage_figures

    h = None
    for j in sorted({0, *range(max(0, iteration - REFOLD), iteration)}):
        train = read_manifest(store, layout.checkpoint(j + 1)).get("stats") or {}
        figures = iteration_figures(store, layout, j) | stage_figures("train", train)
        h = fold(h, j, figures, rule, group_relative=group_relative)
    return h


def judge(cfg: RunConfig, store, layout, iteration: int, train: Mapping[str, float]) -> Health:
    """The health after `iteration`, with train's figures of it (`train/…` names): train calls
    it after its update, before it commits the checkpoint that will hold the result."""
    from components.core.figures import stage_figures

    rule, group_relative = cfg.health, group_relative_estimator(cfg.train.advantage)
    previous = recorded_health(store, layout, iteration)
    if previous is None and iteration > 0:
        previous = _refold(store, layout, iteration, rule, group_relative)
    figures = iteration_figures(store, layout, iteration) | stage_figures("train", dict(train))
    return fold(previous, iteration, figures, rule, group_relative=group_relative)
