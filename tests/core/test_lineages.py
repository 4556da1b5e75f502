"""Each stage's lineage as data (components/core/lineages.py): what the planner reads instead of
building the stages. The digests are pinned: a change to them recomputes every finished run,
which must be a decision, not an accident of a refactor."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.core import commit, lineages
from components.core.config import RunConfig, load_config
from components.core.layout import RunLayout

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples/arithmetic/config.yaml"


def _digests(cfg: RunConfig) -> dict[str, str]:
    layout = RunLayout("/store/run")
    return {
        "generate": commit.config_digest(lineages.generate(cfg, layout, 3).config),
        "verify": commit.config_digest(lineages.verify(cfg, layout, 3).config),
        "train": commit.config_digest(lineages.train(cfg, layout, 3).config),
        "evaluate": commit.config_digest(lineages.evaluate(cfg, layout, 2).config),
    }


def test_the_demos_lineage_digests_are_the_ones_recorded_by_earlier_runs():
    # Computed by the stages themselves before their lineage moved to the core.
    assert _digests(load_config(DEMO)) == {
        "generate": "bd1ae35448e682f4",
        "verify": "1d505755e37f28ba",
        "train": "4d0e8a72653c4270",
        "evaluate": "f40e2970b119ee42",
    }


@pytest.mark.parametrize(
    ("change", "moved"),
    [
        ({"data": {"sampler": "curriculum"}, "train": {"max_staleness": 1}}, {"generate", "train"}),
        ({"data": {"curriculum": {"success_threshold": 0.7}}}, {"verify"}),
        ({"model": {"lora": {"rank": 4}}}, {"train"}),
        # how the policy is kept and moved is not what is trained
        ({"train": {"state_every": 3, "handoff": {"dtype": "float32"}}}, set()),
        # nor how a decode step is launched (CUDA graphs: the same samples up to rounding)
        ({"generate": {"transformers": {"cuda_graphs": False}}}, set()),
        ({"generate": {"temperature": 0.5}}, {"generate", "evaluate"}),
    ],
)
def test_a_setting_moves_the_lineage_of_the_stages_that_read_it(change, moved):
    base = load_config(DEMO)
    data = base.model_dump(mode="json")
    for section, values in change.items():
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(data[section].get(key), dict):
                data[section][key].update(value)
            else:
                data[section][key] = value
    before, after = _digests(base), _digests(RunConfig.model_validate(data))
    assert {k for k in before if before[k] != after[k]} == moved


def test_inputs_follow_the_policy_version_and_the_curriculum_horizon():
    cfg = load_config(DEMO)
    layout = RunLayout("/r")
    assert lineages.generate(cfg, layout, 3).inputs == ("/r/checkpoints/00003", "/r/data/train")
    assert lineages.train(cfg, layout, 3).inputs == (
        "/r/iterations/00003/scored",
        "/r/checkpoints/00003",
    )
    cfg.data.sampler, cfg.train.max_staleness = "curriculum", 1
    # iteration 3 samples with checkpoint 2 and folds the prompt stats scored up to 1
    assert lineages.generate(cfg, layout, 3, shard=1, num_shards=2).inputs == (
        "/r/checkpoints/00002",
        "/r/data/train",
        "/r/iterations/00001/scored",
    )
    assert (
        lineages.generate(cfg, layout, 3, 1, 2).uri
        == "/r/iterations/00003/rollouts/shard-00001-of-00002"
    )
    with pytest.raises(ValueError, match="no iteration output"):
        lineages.current(cfg, None, layout, "evaluate", 0)  # type: ignore[arg-type]
