"""Run health (components/train/health.py): each symptom's threshold on hand-made figures, and
the verdicts on recorded runs (tests/data/health/*.csv: report/dynamics.csv of real `rlvr run`s
on this project's examples, the columns health reads).

The recorded runs: the demo (12 iterations, pass@1 0.149 -> 0.517), the code example (6
iterations, 0.083 -> 0.285), the SmolLM2-135M example (12 iterations), and two that collapse:
the code example at lr 1e-2 (12 iterations, stopping off: 0.083 -> 0.000) and the demo at lr
3e-2 (stopped by the rule after iteration 3)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from components.core.config import HealthSection
from components.core.run_control import Health, StopRecord
from components.train.health import fold, fold_run

DATA = Path(__file__).parent.parent / "data" / "health"
RULE = HealthSection()


def recorded(name: str) -> dict[int, dict[str, float]]:
    with open(DATA / f"{name}.csv") as f:
        return {
            int(row.pop("step")): {k: float(v) for k, v in row.items() if v != ""}
            for row in csv.DictReader(f)
        }


def signal(share: float = 0.2, wrong: float | None = None, right: float = 0.0, **more) -> dict:
    """One iteration's figures: 32 groups of 8 samples, `share` of them with equal rewards."""
    return {
        "verify/zero_signal_share": share,
        "verify/all_wrong_share": share if wrong is None else wrong,
        "verify/all_correct_share": right,
        "verify/groups": 32.0,
        "verify/samples": 256.0,
        "verify/reward_mean": 0.3,
        **more,
    }


def run(*iterations: dict, rule: HealthSection = RULE) -> list[Health]:
    return fold_run(dict(enumerate(iterations)), rule)


def symptoms(h: Health, level: str | None = None) -> list[tuple[int, str]]:
    return [(e.iteration, e.symptom) for e in h.events if level is None or e.level == level]


# --- no signal, the verdicts and the stop ---


def test_no_signal_starts_at_the_configured_share() -> None:
    assert run(signal(0.2), signal(0.94))[-1].streak == 0  # 30 of 32 groups: still a signal
    h = run(signal(0.2), signal(0.95))[-1]
    assert (h.streak, h.streak_start, h.streak_kind) == (1, 1, "wrong")
    assert symptoms(h) == [(1, "no_signal")]
    assert h.verdict == "warning"  # one iteration can be chance: no verdict yet


def test_two_iterations_without_signal_after_signal_are_a_collapse() -> None:
    h = run(signal(0.2), signal(1.0), signal(1.0))[-1]
    assert h.verdict == "collapsed"
    assert h.summary.startswith("collapsed at iteration 1: no signal for 2 iterations")
    assert "100% of groups all wrong" in h.summary and "lower train.lr" in h.summary
    assert symptoms(h, "verdict") == [(2, "collapsed")]
    assert h.markers() == [(1, "collapsed")]
    assert not h.stop  # stop_after 3


def test_all_correct_is_saturation_and_none_from_the_start_is_named_so() -> None:
    right = signal(1.0, wrong=0.0, right=1.0)
    assert run(signal(0.2), right, right)[-1].verdict == "saturated"
    dead = run(signal(1.0), signal(1.0))[-1]
    assert dead.verdict == "no_signal"
    assert "since iteration 0 (none from the start)" in dead.summary
    equal = signal(1.0, wrong=0.2, right=0.1)  # most groups agree on a partial reward
    assert run(signal(0.2), equal, equal)[-1].verdict == "no_signal"
    mostly = signal(1.0, wrong=0.94, right=0.06)  # 30 groups wrong, 2 right: still a collapse
    hs = run(signal(0.2), signal(1.0), mostly, signal(1.0))
    assert [h.streak for h in hs] == [0, 1, 2, 3] and hs[-1].verdict == "collapsed"
    assert hs[-1].stop


def test_estimators_that_learn_from_equal_rewards_are_not_judged_for_signal() -> None:
    rows = dict(enumerate([signal(0.2), signal(1.0), signal(1.0), signal(1.0)]))
    hs = fold_run(rows, RULE, group_relative=False)  # REINFORCE++, W-REINFORCE
    assert hs[-1].streak == 0 and hs[-1].verdict == "healthy" and not hs[-1].stop


def test_a_verdict_names_the_causes_near_its_streak_and_its_recovery() -> None:
    kl = {"train/approx_kl": 0.9}
    early = run(signal(**kl), *[signal(0.2)] * 5, signal(1.0), signal(1.0))[-1]
    assert "KL 0.90" not in early.summary  # iteration 0's update, 6 iterations before
    near = run(signal(0.2, **kl), signal(1.0), signal(1.0))[-1]
    assert "the first update moved the policy far (KL 0.90" in near.summary
    back = run(signal(0.2), signal(1.0), signal(1.0), signal(0.2))[-1]
    assert "collapsed at iteration 1, signal returned at iteration 3" in back.summary


def test_stop_after_one_gives_the_verdict_at_once() -> None:
    h = run(signal(0.2), signal(1.0), rule=HealthSection(stop_after=1))[-1]
    assert h.stop and h.verdict == "collapsed" and "for 1 iteration (" in h.summary


def test_the_run_stops_after_stop_after_iterations_without_signal() -> None:
    hs = run(signal(0.2), signal(1.0), signal(1.0), signal(1.0), signal(1.0))
    assert [h.stop for h in hs] == [False, False, False, True, True]
    never = HealthSection(stop_after=0)
    assert not any(h.stop for h in run(signal(0.2), *[signal(1.0)] * 6, rule=never))


def test_signal_that_returns_ends_the_streak_and_the_verdict() -> None:
    hs = run(signal(0.2), signal(1.0), signal(1.0), signal(0.3))
    assert (hs[-1].streak, hs[-1].verdict) == (0, "warning")  # the warnings stay listed
    assert (3, "recovered") in symptoms(hs[-1], "note")


def test_one_sample_per_prompt_has_no_groups_to_judge() -> None:
    single = {**signal(1.0), "verify/samples": 32.0}  # every group of one: always "equal"
    assert run(single, single, single, single)[-1].streak == 0


# --- the other symptoms ---


def test_truncation_surge_needs_both_the_share_and_the_rise() -> None:
    t = "rollout/truncated_fraction"
    assert symptoms(run(signal(**{t: 0.15}), signal(**{t: 0.64}))[-1]) == [(1, "truncation")]
    assert symptoms(run(signal(**{t: 0.15}), signal(**{t: 0.49}))[-1]) == []  # under 50%
    assert symptoms(run(signal(**{t: 0.40}), signal(**{t: 0.59}))[-1]) == []  # under 1.5x
    h = run(signal(**{t: 0.15}), signal(**{t: 0.64}))[-1]
    assert "truncation rose 15% -> 64%" in h.events[0].message
    assert "train.overlong_filter" in h.events[0].message


def test_a_large_update_is_named_the_first_when_it_is() -> None:
    first = run(signal(**{"train/approx_kl": 0.62}))[-1]
    assert first.events[0].message.startswith("the first update moved the policy far (KL 0.62")
    assert symptoms(run(signal(**{"train/ppo_kl": 0.30}))[-1]) == []  # at the bound: fine
    later = run(signal(), signal(**{"train/ppo_kl": 0.31}))[-1]
    assert later.events[0].message.startswith("update 1 moved")


def test_logprob_gap_and_reward_drop_and_entropy() -> None:
    gap = run(signal(**{"train/rollout_kl": 0.06}))[-1]
    assert symptoms(gap) == [(0, "logprob_gap")] and "rollout_correction" in gap.summary
    r = "verify/reward_mean"
    # best two-iteration mean 0.5; 0.25 is at the drop's bound (0.5 x 0.5), twice in a row
    hs = run(signal(**{r: 0.5}), signal(**{r: 0.5}), signal(**{r: 0.25}), signal(**{r: 0.25}))
    assert symptoms(hs[2]) == [] and symptoms(hs[3]) == [(3, "reward")]
    e = "train/entropy"
    note = run(signal(**{e: 1.0}), signal(**{e: 0.11}), signal(**{e: 0.09}))[-1]
    assert symptoms(note) == [(2, "entropy")] and note.verdict == "healthy"  # a note only


def test_a_symptom_is_raised_once_while_it_lasts() -> None:
    kl = {"train/approx_kl": 0.5}
    h = run(signal(**kl), signal(**kl), signal(), signal(**kl))[-1]
    assert symptoms(h) == [(0, "update_kl"), (3, "update_kl")]


def test_momentum_without_gradient_is_a_cause_in_the_verdict() -> None:
    dead = signal(1.0, **{"train/ppo_kl": 0.25, "train/grad_norm": 0.0})
    h = run(signal(0.2), dead, dead)[-1]
    assert "kept moving without a gradient (ppo_kl 0.250 at grad_norm 0" in h.summary


def test_fold_is_a_pure_step_and_survives_its_manifest_round_trip() -> None:
    figures = [signal(0.2), signal(1.0, **{"rollout/truncated_fraction": 0.9}), signal(1.0)]
    h = None
    for i, f in enumerate(figures):
        h = Health.model_validate_json(fold(h, i, f, RULE).model_dump_json())
    assert h == run(*figures)[-1]


def test_stop_record_is_past_by_stage() -> None:
    r = StopRecord(after_iteration=3, verdict="collapsed", summary="", rule="", at=0.0)
    assert not r.beyond("generate", 3) and r.beyond("generate", 4) and r.beyond("train", 4)
    assert not r.beyond("evaluate", 4) and r.beyond("evaluate", 5)  # checkpoint 4 is iteration 3's


# --- recorded runs ---


@pytest.mark.parametrize("name", ["demo", "code_example", "smollm2"])
def test_runs_that_learn_raise_no_alarm(name: str) -> None:
    hs = fold_run(recorded(name), RULE)
    assert [(e.iteration, e.symptom) for h in hs for e in h.warnings()] == []
    assert hs[-1].verdict == "healthy" and not any(h.stop for h in hs)


@pytest.mark.parametrize(
    ("name", "causes"),
    [
        ("code_example_lr1e-2", ["truncation rose 35% -> 94%", "the first update", "KL 1.52"]),
        ("demo_lr3e-2", ["the first update moved the policy far (KL 14.09", "Adam's momentum"]),
    ],
)
def test_collapses_are_flagged_within_two_iterations_and_stopped(name, causes) -> None:
    rows = recorded(name)
    hs = fold_run(rows, RULE)
    first_dead = min(i for i, f in rows.items() if f["verify/zero_signal_share"] >= 0.95)
    assert first_dead == 1
    warned = min(e.iteration for e in hs[-1].events if e.symptom == "no_signal")
    assert warned == first_dead  # warned at once
    collapsed = next(i for i, h in enumerate(hs) if h.verdict == "collapsed")
    assert collapsed <= first_dead + 2
    assert hs[collapsed].summary.startswith("collapsed at iteration 1: no signal for 2 ")
    for cause in causes:
        assert cause in hs[-1].summary or cause in hs[collapsed].summary
    assert next(i for i, h in enumerate(hs) if h.stop) == first_dead + RULE.stop_after - 1
