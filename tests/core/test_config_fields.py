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
    inline = {  # sub-sections whose keys enter in their place (a backend's keys)
        info.annotation
        for section in seen
        for info in section.model_fields.values()
        if lineage_role(info) == config_fields.INLINE
    }
    return seen | inline


def test_every_key_of_a_section_in_a_lineage_declares_its_role(monkeypatch):
    sections = _dumped_sections(monkeypatch)
    names = {s.__name__ for s in sections}
    assert {"GenerateSection", "VerifySection", "TrainSection", "EvaluateSection"} <= names
    assert {"LoraSection", "CurriculumSection", "EvalSetConfig"} <= names
    assert {"TransformersGenerate", "VLLMGenerate"} <= names
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


def test_backend_keys_enter_flat_where_they_stood():
    """generate.transformers / generate.vllm group a backend's keys; the lineage digests them
    flat, in the section's order, as when they sat in generate itself."""
    cfg = RunConfig.model_validate(
        {
            **EVERYTHING,
            "generate": {"transformers": {"batch_size": 7}, "vllm": {"max_model_len": 9}},
        }
    )
    dumped = lineage_dump(cfg.generate, cfg)
    keys = list(dumped)
    assert dumped["batch_size"] == 7 and dumped["max_model_len"] == 9
    assert "transformers" not in dumped and "vllm" not in dumped
    assert keys.index("stop_token_ids") + 1 == keys.index("batch_size")
    assert keys.index("batch_size") + 1 == keys.index("batch_tokens")
    assert keys.index("num_shards") + 1 == keys.index("tensor_parallel_size")
    assert "cuda_graphs" not in dumped and "continuous_batching" not in dumped  # never
    assert "batch_size" not in lineage_dump(cfg.generate, cfg, own=False)  # own


def test_a_flat_backend_key_names_its_new_place():
    with pytest.raises(ValueError, match=r"generate.batch_size is now generate.transformers"):
        RunConfig.model_validate({**EVERYTHING, "generate": {"batch_size": 8}})
    with pytest.raises(ValueError, match=r"generate.vllm.gpu_memory_utilization"):
        RunConfig.model_validate({**EVERYTHING, "generate": {"gpu_memory_utilization": 0.5}})
