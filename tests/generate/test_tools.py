"""Tools for multi-turn rollouts (components/generate/tools.py): signatures from callables,
the Hermes / Qwen tool-call format, and every failure as an observation, never an exception."""

from __future__ import annotations

import time

import pytest

from components.generate.tools import (
    ToolBox,
    ToolCall,
    ToolError,
    parse_tool_calls,
    python_tool,
    tool_from_callable,
)


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    More text the schema leaves out."""
    return a + b


def test_a_tool_is_described_from_its_signature_and_docstring():
    tool = tool_from_callable(add)
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a"],
            },
        },
    }

    def untyped(x):
        """Doc."""

    with pytest.raises(ToolError, match="parameter 'x' needs a type hint"):
        tool_from_callable(untyped)

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolError, match="has no docstring"):
        tool_from_callable(undocumented)


def test_tool_calls_are_parsed_in_order_and_bad_ones_carry_their_error():
    text = (
        'I will compute. <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
        '</tool_call> and <tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("add", {"a": 2, "b": 3})
    assert calls[1] == ToolCall("add", {"a": 1})  # JSON-encoded arguments are decoded
    assert calls[2].error.startswith("the tool call is not valid JSON")
    assert calls[3].error.startswith("a tool call needs")
    assert parse_tool_calls("no call here") == []


def test_every_failure_is_an_observation():
    def slow(x: int) -> int:
        """Sleep."""
        time.sleep(5)
        return x

    def boom(x: int) -> int:
        """Raise."""
        raise RuntimeError("nope")

    def big(x: int) -> str:
        """Print a lot."""
        return "y" * 100

    box = ToolBox(
        {
            "add": tool_from_callable(add),
            "slow": tool_from_callable(slow, timeout_s=0.2),
            "boom": tool_from_callable(boom),
            "big": tool_from_callable(big, max_output_chars=10),
        }
    )
    try:
        assert box.call(ToolCall("add", {"a": 2, "b": 3})) == ("5", True)
        assert box.call(ToolCall("sub", {})) == (
            "Error: no tool named 'sub' (tools: add, slow, boom, big)",
            False,
        )
        assert box.call(ToolCall("add", {"c": 1}))[0] == (
            "Error: add takes no argument 'c' (its arguments: a, b)"
        )
        assert box.call(ToolCall("add", {}))[0] == "Error: add needs the argument 'a'"
        assert (
            box.call(ToolCall("add", {"a": "2"}))[0] == "Error: add: argument 'a' must be a integer"
        )
        assert box.call(ToolCall("add", {"a": True}))[1] is False  # a bool is no integer
        assert box.call(ToolCall(None, {}, "bad json")) == ("Error: bad json", False)
        t0 = time.perf_counter()
        assert box.call(ToolCall("slow", {"x": 1})) == ("Error: slow took longer than 0.2 s", False)
        assert time.perf_counter() - t0 < 2
        assert box.call(ToolCall("boom", {"x": 1})) == (
            "Error: boom raised RuntimeError: nope",
            False,
        )
        assert box.call(ToolCall("big", {"x": 1})) == ("yyyyyyyyyy... [truncated at 10]", True)
    finally:
        box.close()


def test_the_python_tool_runs_in_the_sandbox():
    from components.sandbox import capabilities

    if not capabilities().available:
        pytest.skip(f"no sandbox here: {capabilities().reason}")
    box = ToolBox({"python": python_tool(timeout_s=2.0)})
    try:
        out, ok = box.call(ToolCall("python", {"code": "print(123456789 * 987654321)"}))
        assert (out, ok) == ("121932631112635269\n", True)
        out, ok = box.call(ToolCall("python", {"code": "1/0"}))
        assert not ok and out.startswith("Error:") and "ZeroDivisionError" in out
        out, _ = box.call(ToolCall("python", {"code": "while True: pass"}))
        assert out == "Error: the code ran past 2 s and was stopped"
        out, _ = box.call(
            ToolCall(
                "python", {"code": "import socket; socket.create_connection(('1.1.1.1', 80), 1)"}
            )
        )
        assert out.startswith("Error:")  # no network in the sandbox
    finally:
        box.close()
