"""The base of every config section, the config's error, `--set` overrides and the error
messages of validation (components/core/config.py)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from components.core.errors import UserError


class ConfigError(UserError):
    """A config file or override that cannot be used; the message says what to fix."""


class Strict(BaseModel):
    # attribute docstrings become the fields' descriptions: the config reference (docs/config.md,
    # components/core/config_reference.py) is generated from them
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


def _section_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the section holding ``loc``'s last part accepts (empty when it is not a
    section of known keys): walks the fields of `root`, through lists and optional sections."""
    import typing

    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an item of a list: its model was found with the list's field
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        found = None
        stack = [field.annotation]
        while stack:  # the first model class inside X | None, list[X], ...
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                found = t
                break
            stack.extend(typing.get_args(t))
        if found is None:
            return []
        model = found
    return list(getattr(model, "model_fields", {}))


def _did_you_mean(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(str(loc[-1]), _section_keys(root, loc), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def format_error(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """A validation error as one line per problem, each naming the key; an unknown key gets the
    closest known key of its section (`root`: the config's model)."""
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(
                f"  {key}: unknown key (value {e['input']!r}); {_did_you_mean(root, e['loc'])}"
                "remove it or fix its spelling"
            )
        elif e["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            lines.append(f"  {key}: got {e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)


def _parse_value(text: str) -> Any:
    """Parse an override value as YAML, so `--set train.lr=1e-4` gives a float."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to a raw config mapping (in place) and return it.

    A numeric part indexes a list (`data.eval.0.n=8`); the value is YAML, so a whole list or
    mapping can be given inline (`data.eval=[{name: x, path: y.parquet}]`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        key, _, value = item.partition("=")
        parts = key.strip().split(".")
        node: Any = raw
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not (p.isascii() and p.isdigit()):
                    raise ConfigError(
                        f"override {item!r}: {'.'.join(parts[:i])} is a list; address an item by "
                        f"its index from 0 ({'.'.join(parts[:i])}.0...=...) or give the whole "
                        f"list as YAML ({'.'.join(parts[:i])}=[...])"
                    )
                idx = int(p)
                if idx >= len(node):
                    raise ConfigError(
                        f"override {item!r}: {'.'.join(parts[:i])} has {len(node)} item(s), "
                        f"no index {idx}; give the whole list as YAML ({'.'.join(parts[:i])}=[...])"
                    )
                if last:
                    node[idx] = _parse_value(value)
                else:
                    node = node[idx]
                continue
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[:i])!r} is not a section; give its "
                    f"value as YAML ({'.'.join(parts[:i])}={{...}} or =[...])"
                )
            if p.isascii() and p.isdigit() and p not in node:
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[:i]) or 'the config'} has no list here "
                    f"to index; give the value as YAML ({'.'.join(parts[:i])}=[...])"
                )
            if last:
                node[p] = _parse_value(value)
            else:
                node = node.setdefault(p, {})
    return raw
