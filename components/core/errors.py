"""The exceptions that mean "bad input", as opposed to a bug: CLIs turn them into a one-line
message and exit status 2."""

from __future__ import annotations

from components.core.checkpoint import CheckpointError
from components.core.commit import NotCommittedError
from components.core.config import ConfigError
from components.core.schemas import SchemaError
from components.core.store import StoreError


class StageError(ValueError):
    """A stage refuses its inputs (the message says which and how to fix them)."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    SchemaError,
    CheckpointError,
    NotCommittedError,
    StoreError,
    StageError,
    ValueError,
    FileNotFoundError,
)
