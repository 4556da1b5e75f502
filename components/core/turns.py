"""The multi-turn wire format shared by generate (which writes turns) and train (which reads
them): a tool call is `<tool_call>{json}</tool_call>` in a policy turn (docs/tools.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def has_void_turn(turns: Iterable[Mapping[str, Any]], answer: re.Pattern[str]) -> bool:
    """SimpleTIR's void turn: a policy turn with neither a tool call nor an answer (`answer`
    found in its text), such as a turn cut by the token budget or one that stops with nothing
    to act on."""
    return any(
        t["role"] == "assistant"
        and not TOOL_CALL.search(t["content"] or "")
        and not answer.search(t["content"] or "")
        for t in turns
    )
