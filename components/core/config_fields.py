"""What each config key means to a run, declared on the key itself: its lineage role (whether
it enters the lineage of the stages that read its section) and its tier (what a user sets, or
what tunes the machinery). `lineage_dump` is the one function that turns the declarations into
the config a stage's lineage digests (components/core/lineages.py); docs/config.md shows the
tiers (components/core/config_reference.py). A test fails when a key of a section that enters
a lineage has no role (tests/core/test_config_fields.py), so a new key cannot go unclassified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

RunConfig = Any
"""components.core.config.RunConfig, the predicates' argument (that module imports this one,
so the type is not imported here)."""

ALWAYS = "always"
"""The key changes what the stage computes: it always enters the lineage."""
NEVER = "never"
"""Machinery: how the work is done, launched or kept, never what it computes."""
OWN = "own"
"""How the section's own stage lays out its work (shards, batches, workers): in that stage's
lineage, not in the lineage of another stage that reads the section (evaluate samples and
scores with its own layout)."""
INLINE = "inline"
"""A sub-section that groups keys of one backend (`generate.transformers`): its keys enter in its
place, flat, each by its own role, as if the section held them itself."""
WHEN = "when:"
"""Prefix of a role `when:<name>`: the key enters only when the run uses its feature, the
predicate `USED[name]`, so a run that does not use a feature is not invalidated by it."""

#: Predicates on the run config, by name: whether a run uses a feature (roles `when:<name>`).
USED: dict[str, Callable[[RunConfig], bool]] = {
    "multi_turn": lambda c: bool(c.generate.tools or c.generate.environment),
    "environment": lambda c: c.generate.environment is not None,
    "void_turn_filter": lambda c: c.train.void_turn_filter,
    "multi_node": lambda c: c.train.nodes > 1,
    # auto and recompute train alike to float precision; rollout (off-policy too) changes the
    # update
    "old_logprobs_rollout": lambda c: c.train.old_logprobs == "rollout",
    "vision_trained": lambda c: not c.train.freeze_vision,
    "skip_no_signal_steps": lambda c: c.train.skip_no_signal_steps,
    "lora_vision_tower": lambda c: c.model.lora is not None and c.model.lora.vision_tower,
}

Tier = Literal["user", "advanced"]
USER: Tier = "user"
"""A key most runs set: docs/config.md lists it first."""
ADVANCED: Tier = "advanced"
"""A key that tunes the machinery or a rarer choice (the default)."""


def when(name: str) -> str:
    """The role of a key that enters a lineage only when the run uses feature `name`."""
    if name not in USED:
        raise KeyError(f"no feature predicate {name!r}; known: {sorted(USED)}")
    return WHEN + name


def setting(
    default: Any = PydanticUndefined,
    *,
    lineage: str | None = None,
    tier: Tier = ADVANCED,
    **field: Any,
) -> Any:
    """A config field (pydantic's `Field`, same keywords) with its lineage role and its tier
    declared in its `json_schema_extra`."""
    extra: dict[str, str] = {"tier": tier}
    if lineage is not None:
        extra["lineage"] = lineage
    return Field(default, json_schema_extra=extra, **field)


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def lineage_role(info: FieldInfo) -> str | None:
    """A field's declared lineage role (None: undeclared)."""
    role = _extra(info).get("lineage")
    return role if isinstance(role, str) else None


def tier(info: FieldInfo) -> Tier:
    """A field's declared tier (advanced unless declared user)."""
    return USER if _extra(info).get("tier") == USER else ADVANCED


def enters(role: str | None, cfg: RunConfig, *, own: bool) -> bool:
    """Whether a key of this role enters the lineage of the run `cfg` (`own`: the lineage of
    the stage the section configures). An undeclared or unknown role is an error."""
    if role == ALWAYS:
        return True
    if role == NEVER:
        return False
    if role in (OWN, INLINE):
        return own if role == OWN else True
    if role is not None and role.startswith(WHEN) and role[len(WHEN) :] in USED:
        return USED[role[len(WHEN) :]](cfg)
    raise ValueError(f"lineage role {role!r} is none of always, never, own, inline, when:<feature>")


def lineage_dump(section: BaseModel, cfg: RunConfig, *, own: bool = True) -> dict[str, Any]:
    """The section as a stage's lineage digests it: the keys whose declared role enters for
    this run, in the section's field order (a nested section whole)."""
    out: dict[str, Any] = {}
    for name, info in type(section).model_fields.items():
        role = lineage_role(info)
        if role == INLINE:
            out.update(lineage_dump(getattr(section, name), cfg, own=own))
        elif enters(role, cfg, own=own):
            out[name] = section.model_dump(mode="json", include={name})[name]
    return out
