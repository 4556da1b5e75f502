"""Errors that mean "bad input", as opposed to a bug, and the list that collects them.

A `UserError` says what is wrong with the user's input (the file, row, column or config field)
and how to fix it. The stage CLIs, warm workers and `rlvr` turn a UserError, or a StoreError (the
store's own failure: unreachable, denied, not committed), into a one-line message and exit
status 2. Anything else is a bug or an environment failure and keeps its traceback and a
non-2 exit status: a bare ValueError (pyarrow's ArrowInvalid is one) is not the user's fault.

`Problems` gathers every problem a check finds (where, what, the fix); `raise_if_any` turns its
errors into one `PreflightError`.

This module imports nothing of the project's but the store, so every layer can raise these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.core.store import StoreError


class UserError(ValueError):
    """Bad input; the message names where (file, row, field) and the fix. Exit status 2.

    A ValueError subclass, so callers that catch ValueError for bad values still do."""


class StageError(UserError):
    """A stage refuses its inputs (the message says which and how to fix them)."""


#: What the CLIs report as a message and exit status 2, without a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, StoreError)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is the user's to fix (exit 2, no traceback) rather than a bug."""
    return isinstance(error, USER_ERRORS)


@dataclass
class Problem:
    where: str
    what: str
    fix: str = ""
    warning: bool = False

    def __str__(self) -> str:
        text = f"{self.where}: {self.what}"
        return f"{text}; {self.fix}" if self.fix else text


@dataclass
class Problems:
    items: list[Problem] = field(default_factory=list)

    def error(self, where: str, what: str, fix: str = "") -> None:
        self.items.append(Problem(where, what, fix))

    def warn(self, where: str, what: str, fix: str = "") -> None:
        self.items.append(Problem(where, what, fix, warning=True))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.items if not p.warning]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.items if p.warning]

    def render(self) -> str:
        lines = [f"error: {p}" for p in self.errors]
        lines += [f"warning: {p}" for p in self.warnings]
        return "\n".join(lines)

    def raise_if_any(self, context: str = "") -> None:
        if self.errors:
            raise PreflightError(self, context)


class PreflightError(StageError):
    """One or more problems found before any work; the message lists every one."""

    def __init__(self, problems: Problems, context: str = "") -> None:
        self.problems = problems
        errors = problems.errors
        head = f"{context}: " if context else ""
        if len(errors) == 1:
            super().__init__(f"{head}{errors[0]}")
        else:
            body = "\n".join(f"  - {p}" for p in errors)
            super().__init__(f"{head}{len(errors)} problems\n{body}")
