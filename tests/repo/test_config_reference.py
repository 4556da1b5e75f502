"""docs/config.md is the config reference generated from the pydantic models: it is current,
and every key has a type, a default and a meaning."""

from __future__ import annotations

from pathlib import Path

from components.core.config_reference import render, sections

ROOT = Path(__file__).resolve().parents[2]


def test_the_config_reference_is_current():
    assert (ROOT / "docs/config.md").read_text() == render(), (
        "docs/config.md is stale: python -m components.core.config_reference > docs/config.md"
    )


def test_every_key_has_a_type_a_default_and_a_meaning():
    rows = [(path, *row) for path, _, rows in sections() for row in rows]
    assert len(rows) > 200  # every section reached, nested ones included
    missing = [f"{p}.{k}".lstrip(".") for p, k, t, d, m in rows if not (t and d and m)]
    assert not missing, f"keys without a type, default or docstring: {missing}"
    paths = {p for p, *_ in rows}
    assert {"train.handoff", "retention", "cluster.stages.<name>", "data.eval[]"} <= paths
