"""The config reference (docs/config.md), generated from the config's pydantic models: every
key a run's config takes, with its type, default and meaning (the field's docstring).

    python -m components.core.config_reference > docs/config.md

A test fails when docs/config.md is not what this renders, so the reference never drifts from
the code.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from components.core.config import RunConfig
from components.core.config_fields import ADVANCED, USER, tier

HEADER = """# Config reference

Every key of a run's config (`rlvr run CONFIG`, `--set key=value`), with its type, default and
meaning: first the keys most runs set, then every other key (what tunes the machinery, and
rarer choices), section by section. A key's tier is declared on its field
(`components/core/config_fields.py`). Generated from the pydantic models in
`components/core/config*.py` by `python -m components.core.config_reference > docs/config.md`;
a test fails when this file is stale. Unknown keys are errors. Relative paths in `model`, `data` and `prepare` resolve
against the config file's directory; `run.store` and reward plugin files (`file.py:fn`) against
the directory `rlvr` runs in. See
`examples/arithmetic/config.yaml` for a whole config, and [index.md](index.md) for the rest of
the docs.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models inside an annotation (`X`, `X | None`, `list[X]`, `dict[str, X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def type_name(annotation: Any) -> str:
    """A type as a reader of YAML needs it: `int`, `"a" | "b"`, `list[str]`, `x | null`."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(
            "null" if a is type(None) else type_name(a) for a in typing.get_args(annotation)
        )
    if origin in (list, tuple, dict):
        args = ", ".join(type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{origin.__name__}[{args}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field) -> str:
    if field.is_required():
        return "required"
    value = field.default if field.default_factory is None else field.default_factory()
    if isinstance(value, BaseModel):
        return "(section)"
    if value is PydanticUndefined:
        return ""
    if isinstance(value, dict) and any(isinstance(v, BaseModel) for v in value.values()):
        return "one per " + ", ".join(f"`{k}`" for k in value)  # cluster.stages
    return f"`{json.dumps(to_jsonable_python(value))}`".replace("|", "\\|")


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def meaning(field) -> str:
    text = field.description or ""
    if not text:
        models = _models(field.annotation)
        text = _first_paragraph(models[0].__doc__) if models else ""
    return " ".join(text.split()).replace("|", "\\|")


Row = tuple[str, str, str, str]
"""(key, type, default, meaning) of one key."""


def sections(
    path: str = "", model: type[BaseModel] = RunConfig, *, only: str | None = None
) -> typing.Iterator[tuple[str, type[BaseModel], list[Row]]]:
    """(dotted path, model, rows) of every section of the config, each before the sections
    nested in it; `only`: the rows of keys of that tier alone."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        if only is None or tier(field) == only:
            rows.append((name, type_name(field.annotation), default_text(field), meaning(field)))
        origin = typing.get_origin(field.annotation)
        for sub in _models(field.annotation):
            suffix = "[]" if origin is list else ".<name>" if origin is dict else ""
            nested.append((f"{path}.{name}{suffix}".lstrip("."), sub))
    yield path, model, rows
    for sub_path, sub in nested:
        yield from sections(sub_path, sub, only=only)


def user_keys() -> list[Row]:
    """The keys most runs set (tier user), each by its dotted path."""
    return [
        (f"{path}.{k}".lstrip("."), t, d, m)
        for path, _, rows in sections(only=USER)
        for k, t, d, m in rows
    ]


TIERS = """## The keys most runs set

A run names its base policy, its data and its reward; these keys are the choices most runs
make. A newcomer's config needs no other (the README's `my_run.yaml`). Two defaults change a
run's course: `health.stop_after` ends a run whose groups have carried no learning signal for
3 iterations in a row (`health.stop_after: 0` never stops), and `retention.keep_last` deletes the files of all but
the 2 newest checkpoints once nothing reads them (`retention.enabled: false` keeps every one).
"""


def render() -> str:
    out = [HEADER.rstrip(), "", TIERS.rstrip(), ""]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    out += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in user_keys()]
    out += ["", "## Every other key", "", "What tunes the machinery, and rarer choices."]
    for path, model, rows in sections(only=ADVANCED):
        if not rows:
            continue
        out += ["", f"### `{path}`" if path else "### Top level", ""]
        doc = _first_paragraph(model.__doc__)
        if doc and model is not RunConfig:
            out += [doc, ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in rows]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
