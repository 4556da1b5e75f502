"""docs/config.md is the config reference generated from the pydantic models: it is current,
and every key has a type, a default and a meaning."""

from __future__ import annotations

from pathlib import Path

from components.core.config_reference import render, sections, user_keys

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


def test_the_first_tier_is_short_and_a_newcomers_config_needs_no_other():
    """docs/config.md opens with the keys most runs set (declared tier user): at most 25, and
    the README's newcomer config (`my_run.yaml`) sets only those."""
    import re

    import yaml

    keys = [k for k, *_ in user_keys()]
    assert 0 < len(keys) <= 25, keys
    readme = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```yaml\n(# my_run\.yaml.*?)```", readme, re.S)

    def leaves(node: dict, path: str = "") -> list[str]:
        out = []
        for k, v in node.items():
            key = f"{path}.{k}".lstrip(".")
            if key in keys or not isinstance(v, dict | list):
                out.append(key)
            elif isinstance(v, list):
                out += [leaf for item in v for leaf in leaves(item, key + "[]")]
            else:
                out += leaves(v, key)
        return out

    used = leaves(yaml.safe_load(block))
    assert used and set(used) <= set(keys), set(used) - set(keys)


def test_the_readme_says_the_defaults_that_change_a_run_and_how_to_turn_them_off():
    readme = " ".join((ROOT / "README.md").read_text().split())
    for said in (
        "`health.stop_after: 3`",
        "`health.stop_after: 0` never stops",
        "`retention.keep_last: 2`",
        "`retention.enabled: false` keeps every checkpoint",
    ):
        assert said in readme, said
