"""The curriculum prompt sampler: the Beta weights, retirement, determinism, and the stages
that commit per-prompt stats and read them (components/generate/curriculum.py,
components/generate/prompt_sampler.py; the stats themselves: tests/core/test_prompt_stats.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.config import CurriculumSection, load_config
from components.core.layout import RunLayout, store_for
from components.core.prompt_stats import prompt_stats_table
from components.generate.curriculum import (
    History,
    _weights,
    beta_signal,
    curriculum_indices,
    group_keys,
)
from tests.support.runs import write_config


def test_beta_signal_is_the_expected_bernoulli_variance():
    # E[p(1-p)] = ab / ((a+b)(a+b+1)): Beta(1,1) -> 1/6, Beta(2,3) -> 6/30, Beta(1,9) -> 9/110.
    got = beta_signal(np.array([1.0, 2.0, 1.0]), np.array([1.0, 3.0, 9.0]))
    np.testing.assert_allclose(got, [1 / 6, 0.2, 9 / 110], rtol=1e-15)
    # Monte Carlo check of the closed form (loose: 200k draws, standard error ~ 2e-4).
    p = np.random.default_rng(0).beta(2.0, 3.0, 200_000)
    assert abs((p * (1 - p)).mean() - 0.2) < 2e-3


def _stats(rows: dict[int, tuple[int, int]], iteration: int) -> pa.Table:
    ids, sources, rewards = [], [], []
    for row, (attempts, successes) in rows.items():
        ids += [f"train-{row:07d}"] * attempts
        sources += ["s"] * attempts
        rewards += [1.0] * successes + [0.0] * (attempts - successes)
    return prompt_stats_table(ids, sources, rewards, iteration, 0.5)


def test_history_folds_attempts_streaks_and_retirement():
    h = History(4)
    h.fold(_stats({0: (4, 4), 1: (4, 2)}, 0), 0, retire_after=2)
    h.fold(_stats({0: (4, 4), 2: (4, 0)}, 1), 1, retire_after=2)
    h.fold(_stats({1: (4, 4)}, 2), 2, retire_after=2)
    assert h.attempts.tolist() == [8, 8, 4, 0]
    assert h.successes.tolist() == [8, 6, 0, 0]
    assert h.last_seen.tolist() == [1, 2, 1, -1]
    assert h.retired_at.tolist() == [1, -1, -1, -1]  # row 0: solved twice in a row
    assert h.streak.tolist() == [0, 1, 0, 0]  # reset on retirement; row 1 solved once
    with pytest.raises(ValueError, match="fold iteration 5 after 2"):
        h.fold(_stats({}, 5), 5, retire_after=2)
    with pytest.raises(ValueError, match="train set changed"):
        h.fold(_stats({9: (1, 1)}, 3), 3, retire_after=2)


def test_weights_use_the_group_pass_rate_as_prior():
    # Rows 0-1 in group 0, rows 2-3 in group 1. Group 0 pooled: 6 successes of 8 attempts.
    h = History(4)
    h.fold(_stats({0: (4, 4), 1: (4, 2)}, 0), 0, retire_after=9)
    c = CurriculumSection(prior_strength=4.0, sharpness=1.0)
    w = _weights(h, np.array([0, 0, 1, 1]), c)
    p0 = (1 + 6) / (2 + 8)  # 0.7
    p1 = 0.5  # group 1 never seen: Beta(1, 1) mean
    expected = [
        beta_signal(4 * p0 + 4, 4 * (1 - p0) + 0),
        beta_signal(4 * p0 + 2, 4 * (1 - p0) + 2),
        beta_signal(4 * p1, 4 * (1 - p1)),
        beta_signal(4 * p1, 4 * (1 - p1)),
    ]
    np.testing.assert_allclose(w, expected, rtol=1e-12)
    c2 = CurriculumSection(prior_strength=4.0, sharpness=2.0)
    np.testing.assert_allclose(_weights(h, np.array([0, 0, 1, 1]), c2), np.square(expected))


def test_draws_are_distinct_deterministic_and_explore_unseen_rows():
    h = History(100)
    h.fold(_stats({r: (4, 2) for r in range(60)}, 0), 0, retire_after=2)
    c = CurriculumSection(explore_share=0.25)
    groups = np.zeros(100, np.int64)
    rows, figures = curriculum_indices(h, groups, 20, seed=3, iteration=1, c=c)
    assert rows == curriculum_indices(h, groups, 20, seed=3, iteration=1, c=c)[0]
    assert rows != curriculum_indices(h, groups, 20, seed=3, iteration=2, c=c)[0]
    assert len(set(rows)) == 20
    assert all(r >= 60 for r in rows[:5])  # round(0.25 * 20) = 5 never-seen rows first
    assert figures["explored"] == 5 and figures["seen_share"] == 0.6
    assert figures["retired"] == 0
    with pytest.raises(ValueError, match="exceeds the 100 rows"):
        curriculum_indices(h, groups, 101, 0, 1, c)


def test_draws_prefer_prompts_with_signal():
    # 50 rows solved half the time, 50 never solved (4 attempts each). With no exploration,
    # sharpness 2 and a flat prior (group_by None), the weight ratio is
    # (E[p(1-p)] under Beta(3,3) / under Beta(1,5)) ** 2 = (3/14 / 5/42) ** 2 = 3.24.
    h = History(100)
    h.fold(
        _stats({**{r: (4, 2) for r in range(50)}, **{r: (4, 0) for r in range(50, 100)}}, 0),
        0,
        retire_after=2,
    )
    c = CurriculumSection(explore_share=0.0, sharpness=2.0, prior_strength=2.0)
    groups = np.zeros(100, np.int64)
    # Every row's prior: the pooled pass rate (1 + 100) / (2 + 400) ~ 0.25 worth 2 samples.
    w = _weights(h, groups, c)
    assert w[:50].min() > 3 * w[50:].max()
    counts = Counter()
    for it in range(1, 201):
        counts.update(r < 50 for r in curriculum_indices(h, groups, 10, 0, it, c)[0])
    share = counts[True] / 2000
    # Draws without replacement of 10 of 100 barely deplete either half: the share is close to
    # w1 / (w1 + w0) per draw; 2000 draws give a standard error of ~0.01.
    expected = w[0] / (w[0] + w[50])
    assert abs(share - expected) < 0.04, (share, expected)


def test_retired_rows_return_after_a_while_and_fill_a_short_draw():
    h = History(6)
    h.fold(_stats({r: (2, 2) for r in range(4)}, 0), 0, retire_after=1)  # rows 0-3 retire at 0
    c = CurriculumSection(explore_share=0.0, return_after=3)
    groups = np.zeros(6, np.int64)
    rows, figures = curriculum_indices(h, groups, 2, 0, 1, c)
    assert sorted(rows) == [4, 5] and figures["retired"] == 4
    # Rows 4-5 were never sampled: their prior is the group's (1 + 8) / (2 + 8) = 0.9 worth 4
    # samples, Beta(3.6, 0.4): expected pass rate 0.9, E[p(1-p)] = 3.6 * 0.4 / (4 * 5).
    assert figures["expected_pass_rate"] == pytest.approx(0.9, rel=1e-12)
    assert figures["expected_signal"] == pytest.approx(0.072, rel=1e-12)
    rows, _ = curriculum_indices(h, groups, 4, 0, 1, c)  # 2 eligible: 2 retired fill the draw
    assert sorted(rows)[2:] == [4, 5] and len(set(rows)) == 4
    rows, figures = curriculum_indices(h, groups, 6, 0, 3, c)  # 3 - 0 >= return_after
    assert sorted(rows) == list(range(6)) and figures["retired"] == 0


def test_the_stats_horizon_waits_for_nothing_generate_does_not():
    from components.core.config import RunConfig
    from components.core.layout import RunLayout
    from components.core.lineages import sampler_config, stats_horizon
    from components.generate.prompt_sampler import PromptSampler

    cfg = RunConfig(model={"base": "b"}, data={"train": "t", "sampler": "curriculum"})
    cfg.train.max_staleness = 1
    # Generate of iteration 3 samples with checkpoint 2, trained on scored(1): its stats are
    # the newest it may fold. Iterations 0 and 1 fold none.
    assert [stats_horizon(cfg, i) for i in range(4)] == [-2, -1, 0, 1]
    sampler = PromptSampler(cfg, None, RunLayout("/r"))  # type: ignore[arg-type]
    assert sampler.needs(3) == ["/r/iterations/00001/scored"]
    assert sampler.needs(0) == [] and sampler.needs(1) == []
    cfg.train.max_staleness = 0
    assert sampler.needs(1) == ["/r/iterations/00000/scored"]
    cfg.data.sampler = "uniform"
    assert sampler.needs(5) == [] and sampler_config(cfg) == {}


def test_rows_generate_skipped_are_not_drawn_again():
    h = History(10)
    h.fold(_stats({0: (2, 1)}, 0), 0, retire_after=2, skipped=[1, 2, 3])
    assert h.excluded.tolist() == [False, True, True, True] + [False] * 6
    c = CurriculumSection(explore_share=0.5)
    groups = np.zeros(10, np.int64)
    for it in range(1, 30):
        rows, figures = curriculum_indices(h, groups, 6, 0, it, c)
        assert not {1, 2, 3} & set(rows) and figures["excluded"] == 3
    rows, _ = curriculum_indices(h, groups, 8, 0, 1, c)  # 7 others: one skipped row fills in
    assert len(set(rows)) == 8 and len({1, 2, 3} & set(rows)) == 1


def test_group_keys():
    t = pa.table(
        {
            "data_source": ["a", "b", "a"],
            "extra_info": [{"level": 1}, {"level": 3}, {"level": None}],
        }
    )
    assert group_keys(t, "data_source").tolist() == [0, 1, 0]
    assert group_keys(t, "extra_info.level").tolist() == [0, 1, -1]
    assert group_keys(t, None).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="no column 'level'.*extra_info.<field>"):
        group_keys(t, "level")
    with pytest.raises(ValueError, match="has no field 'difficulty'"):
        group_keys(t, "extra_info.difficulty")


PLUGIN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)  # a mix of 0 and 1 within most groups
"""


@pytest.fixture
def curriculum_cfg(tmp_path, tiny_assets):
    plugin = tmp_path / "odd_length.py"
    plugin.write_text(PLUGIN)
    path = write_config(
        tmp_path,
        tiny_assets,
        data={
            "sampler": "curriculum",
            "prompts_per_iteration": 8,
            "curriculum": {"group_by": "extra_info.level", "explore_share": 0.5},
        },
        verify={"rewards": {"arithmetic": f"{plugin}:compute_score"}},
        train={"lr": 1e-3, "micro_batch_tokens": 512},
        run={"iterations": 3},
    )
    return load_config(path)


@pytest.mark.slow
def test_stages_commit_stats_and_draw_from_them(curriculum_cfg):
    from components.generate.prompt_sampler import PromptSampler
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import run as train
    from components.verify.stage import run as verify

    cfg = curriculum_cfg
    store, layout = store_for(cfg), RunLayout.of(cfg)
    run_setup.run(cfg)
    for i in range(3):
        generate(cfg, i)
        verify(cfg, i)
        if i < 2:
            result = train(cfg, i)
            # What the step returns (and the trackers log) is what its manifest committed.
            manifest = json.loads(Path(layout.checkpoint(i + 1), "_SUCCESS").read_text())
            assert result["stats"]["train/checkpoint_bytes"] > 0
            assert {k: v for k, v in manifest["stats"].items() if k.startswith("train/")} == {
                k: v for k, v in result["stats"].items() if k.startswith("train/")
            }

    # verify commits per-prompt stats beside the scored rollouts, and the group shares.
    stats = pq.read_table(Path(layout.prompt_stats(1), "part-00000.parquet"))
    scored = pq.read_table(Path(layout.scored(1), "part-00000.parquet"))
    assert stats.num_rows == 8 and set(stats.column("attempts").to_pylist()) == {4}
    by_prompt = Counter(
        p
        for p, r in zip(
            scored.column("prompt_id").to_pylist(), scored.column("reward").to_pylist(), strict=True
        )
        if r > 0.5
    )
    assert {p: by_prompt[p] for p in stats.column("prompt_id").to_pylist()} == dict(
        zip(
            stats.column("prompt_id").to_pylist(),
            stats.column("successes").to_pylist(),
            strict=True,
        )
    )
    manifest = json.loads(Path(layout.scored(1), "_SUCCESS").read_text())["stats"]
    assert manifest["groups"] == 8
    assert manifest["zero_signal_share"] == pytest.approx(
        float(np.mean(np.array(stats.column("reward_min")) == np.array(stats.column("reward_max"))))
    )

    # generate of iteration 2 drew from iterations 0 and 1 and records it.
    gen = json.loads(Path(layout.rollouts(2), "_SUCCESS").read_text())
    assert "iterations/00001/scored" in gen["inputs"]  # the newest stats folded (horizon 1)
    assert gen["stats"]["sampler"]["explored"] == 4  # half of 8, from never-seen rows
    assert gen["stats"]["sampler"]["seen_share"] == pytest.approx(16 / 120)

    # A cold sampler (a resumed run) draws what the warm worker drew, and shards split it.
    drawn = pq.read_table(Path(layout.rollouts(2), "part-00000.parquet")).column("prompt_id")
    from components.core.schemas import read_dataset
    from components.generate.rollouts import dataset_uri

    table = read_dataset(store, dataset_uri(store, layout.train_data))
    rows, _ = PromptSampler(cfg, store, layout).indices(table, 2)
    assert {f"train-{r:07d}" for r in rows} == set(drawn.to_pylist())

    warm = PromptSampler(cfg, store, layout)
    folds = []
    warm_stats = warm._stats
    warm._stats = lambda i: folds.append(i) or warm_stats(i)  # type: ignore[method-assign]
    for i in range(3):
        assert warm.indices(table, i)[0] == PromptSampler(cfg, store, layout).indices(table, i)[0]
    assert folds == [0, 1]  # warm: each iteration's stats folded once, not again at every draw

    # The warm sampler refolds from 0 when the newest scored rollouts it folded changed.
    folded = warm._history
    warm._folded = {1: "another digest"}
    assert warm.indices(table, 2)[0] == rows and warm._history is not folded

    # A run scored before prompt stats existed: verify counts it current, the sampler derives
    # the stats from the scored rollouts, and a verify that skips backfills them, identical.
    import shutil

    from components.train.stage import TrainStage
    from components.verify.stage import VerifyStage

    original = pq.read_table(Path(layout.prompt_stats(0), "part-00000.parquet"))
    shutil.rmtree(layout.prompt_stats(0))
    assert VerifyStage(cfg).up_to_date(0)
    from components.core.warm import segment
    from pipelines.plan import first_out_of_date

    assert first_out_of_date(cfg, segment(cfg, 0)) == (2, "train", "missing")  # not verify 0
    assert PromptSampler(cfg, store, layout).indices(table, 2)[0] == rows
    warm = PromptSampler(cfg, store, layout)  # and warm, draw after draw, without the stats
    assert [warm.indices(table, i)[0] for i in (1, 2, 2)][1:] == [rows, rows]
    assert verify(cfg, 0)["skipped"]
    assert pq.read_table(Path(layout.prompt_stats(0), "part-00000.parquet")).equals(original)

    # train.kl_metric only adds a figure: it is not part of train's lineage.
    with_kl = cfg.model_copy(deep=True)
    with_kl.train.kl_metric = True
    assert TrainStage(with_kl)._plan(0)[1] == TrainStage(cfg)._plan(0)[1]

    sharded = cfg.model_copy(deep=True)
    sharded.generate.num_shards = 2
    for s in range(2):
        generate(sharded, 2, shard=s, num_shards=2)
    union = set()
    for s in range(2):
        part = Path(layout.rollouts(2), f"shard-{s:05d}-of-00002", "part-00000.parquet")
        if part.exists():
            union |= set(pq.read_table(part).column("prompt_id").to_pylist())
    assert union == set(drawn.to_pylist())


def test_a_bad_group_by_is_caught_by_check(tmp_path, tiny_assets):
    from components.core.errors import Problems
    from components.generate.checks import check_curriculum

    path = write_config(
        tmp_path, tiny_assets, data={"sampler": "curriculum", "curriculum": {"group_by": "level"}}
    )
    problems = Problems()
    check_curriculum(load_config(path), problems)
    assert "data.curriculum.group_by='level'" in str(problems.items)


def test_a_return_after_within_the_lag_warns(tmp_path, tiny_assets):
    from components.core.errors import Problems
    from components.generate.checks import check_curriculum

    path = write_config(
        tmp_path,
        tiny_assets,
        train={"max_staleness": 1},
        data={"sampler": "curriculum", "curriculum": {"return_after": 2}},
    )
    problems = Problems()
    check_curriculum(load_config(path), problems)
    assert not problems.errors and "set it above 2" in str(problems.warnings)
