"""Lineage roles declared on the config's fields (components/core/config_fields.py): every key
of a section that enters a lineage has one, so a new key cannot go unclassified, and the
roles mean what they say."""

from __future__ import annotations

import pytest

from components.core import config_fields, lineages
from components.core.config import RunConfig
from components.core.config_base import Strict
from components.core.config_fields import ALWAYS, lineage_dump, lineage_role, setting
from components.core.layout import RunLayout

EVERYTHING = {
    "model": {"base": "b", "lora": {"rank": 4}},
    "data": {
        "train": "t.parquet",
        "eval": [{"name": "h", "path": "h.parquet"}],
        "sampler": "curriculum",
        "curriculum": {"success_threshold": 0.7},
    },
    "train": {"max_staleness": 1},
}


def _dumped_sections(monkeypatch) -> set[type]:
    """The section models the lineages dump, for a config that turns every dumped section on."""
    seen: set[type] = set()

    def spy(section, cfg, **kw):
        seen.add(type(section))
        return lineage_dump(section, cfg, **kw)

    monkeypatch.setattr(lineages, "lineage_dump", spy)
    cfg, layout = RunConfig.model_validate(EVERYTHING), RunLayout("/r")
    for describe in (lineages.generate, lineages.verify, lineages.train, lineages.evaluate):
        describe(cfg, layout, 2)
    return seen


def test_every_key_of_a_section_in_a_lineage_declares_its_role(monkeypatch):
    sections = _dumped_sections(monkeypatch)
    names = {s.__name__ for s in sections}
    assert {"GenerateSection", "VerifySection", "TrainSection", "EvaluateSection"} <= names
    assert {"LoraSection", "CurriculumSection", "EvalSetConfig"} <= names
    cfg = RunConfig.model_validate(EVERYTHING)
    bad = []
    for section in sections:
        for name, info in section.model_fields.items():
            try:
                config_fields.enters(lineage_role(info), cfg, own=True)
            except ValueError as e:
                bad.append(f"{section.__name__}.{name}: {e}")
    assert not bad, f"declare each key's lineage role with setting(..., lineage=...): {bad}"


def test_an_undeclared_key_is_an_error_not_a_silent_default():
    class Section(Strict):
        a: int = setting(1, lineage=ALWAYS)
        b: int = 2

    with pytest.raises(ValueError, match="lineage role None"):
        lineage_dump(Section(), RunConfig.model_validate(EVERYTHING))
    with pytest.raises(KeyError, match="no feature predicate"):
        config_fields.when("not_a_feature")


def test_own_keys_enter_their_stages_lineage_only():
    cfg = RunConfig.model_validate(EVERYTHING)
    assert {"num_shards", "batch_size"} <= set(lineage_dump(cfg.generate, cfg))
    assert not {"num_shards", "batch_size"} & set(lineage_dump(cfg.generate, cfg, own=False))
    assert "every" not in lineage_dump(cfg.evaluate, cfg)  # which checkpoints, not how
