"""Tools a policy may call during a multi-turn rollout.

A tool is a Python callable with a JSON-schema signature, as TRL and verl take them: its name,
a description (the docstring's first paragraph) and parameters derived from its type hints. The
policy calls one in the Hermes / Qwen format its chat template teaches:

    <tool_call>
    {"name": "python", "arguments": {"code": "print(123456789 * 987654321)"}}
    </tool_call>

`parse_tool_calls` finds the calls in a turn's text; `ToolBox.call` runs one and always returns
an observation string: an unknown tool, malformed arguments, an exception, a timeout or an
oversized result becomes an observation the policy reads (and learns from), never a crashed
stage. `python` is built in: it runs the code in the code verifier's sandbox (a fresh process
per call, time-, memory- and output-bounded, no network) and returns what it printed.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.core.errors import UserError
from components.core.turns import TOOL_CALL

_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


class ToolError(UserError):
    """A tool that cannot be offered (bad signature or spec); the message names the fix."""


class ToolFailure(Exception):
    """Raised by a tool to report a failure in its own words (the observation is
    `Error: <message>`, and the call counts as failed)."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments, or why the text was no valid call."""

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments (type "object")
    fn: Callable[..., Any]
    timeout_s: float = 10.0
    max_output_chars: int = 2000

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema that chat templates render (`tools=` argument)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def tool_from_callable(fn: Callable[..., Any], *, name: str | None = None, **limits) -> Tool:
    """A Tool from a plain function: every parameter needs a type hint among str, int, float,
    bool, list and dict; parameters without a default are required. The description is the
    docstring's first paragraph."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    if not description:
        raise ToolError(
            f"tool {fn.__name__!r} has no docstring: the policy reads it to know "
            "what the tool does; add one"
        )
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(
                f"tool {fn.__name__!r}: *args/**kwargs cannot be described; name every parameter"
            )
        hint = hints.get(pname)
        if hint not in _JSON_TYPES:
            raise ToolError(
                f"tool {fn.__name__!r}: parameter {pname!r} needs a type hint, one "
                f"of {', '.join(t.__name__ for t in _JSON_TYPES)}"
            )
        properties[pname] = {"type": _JSON_TYPES[hint]}
        if param.default is param.empty:
            required.append(pname)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name or fn.__name__, description, parameters, fn, **limits)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>{...}</tool_call>` in `text`, in order; a block whose body is no JSON
    object with a string `name` and an object `arguments` is a call with an `error`."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
        except ValueError as e:
            calls.append(ToolCall(None, {}, f"the tool call is not valid JSON ({e.msg})"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(None, {}, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some templates emit the arguments JSON-encoded
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], {}, "the tool call's arguments must be an object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


def _check_arguments(tool: Tool, args: dict[str, Any]) -> str | None:
    props = tool.parameters["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        return f"{tool.name} takes no argument {unknown[0]!r} (its arguments: {', '.join(props)})"
    missing = [p for p in tool.parameters["required"] if p not in args]
    if missing:
        return f"{tool.name} needs the argument {missing[0]!r}"
    for pname, value in args.items():
        want = props[pname]["type"]
        ok = {
            "string": isinstance(value, str),
            "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "array": isinstance(value, list),
            "object": isinstance(value, dict),
        }[want]
        if not ok:
            return f"{tool.name}: argument {pname!r} must be a {want}"
    return None


@dataclass
class ToolBox:
    """The tools of a run, by name; `call` turns any call into an observation string."""

    tools: dict[str, Tool] = field(default_factory=dict)
    workers: int = 4
    """Calls that run at once (the python tool's each start a process)."""

    def __post_init__(self) -> None:
        # two pools: `map` runs trajectories' turns side by side, each waiting on its calls in
        # `_pool` (one pool for both could fill with waiters and deadlock)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="rlvr-tool"
        )
        self._turns = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="rlvr-turn"
        )

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """`fn` over `items` on the toolbox's turn threads (in order of `items`)."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        return list(self._turns.map(fn, items))

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def call(self, call: ToolCall) -> tuple[str, bool]:
        """(observation, ok): the tool's result as text, or the error the policy should read."""
        if call.error:
            return f"Error: {call.error}", False
        tool = self.tools.get(call.name or "")
        if tool is None:
            return f"Error: no tool named {call.name!r} (tools: {', '.join(self.tools)})", False
        problem = _check_arguments(tool, call.arguments)
        if problem:
            return f"Error: {problem}", False
        future = self._pool.submit(tool.fn, **call.arguments)
        try:
            result = future.result(timeout=tool.timeout_s)
        except concurrent.futures.TimeoutError:
            return f"Error: {tool.name} took longer than {tool.timeout_s:g} s", False
        except ToolFailure as e:
            return f"Error: {e}", False
        except Exception as e:  # noqa: BLE001 - a tool's failure is the policy's observation
            return f"Error: {tool.name} raised {type(e).__name__}: {e}", False
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        if len(text) > tool.max_output_chars:
            text = text[: tool.max_output_chars] + f"... [truncated at {tool.max_output_chars}]"
        return text, True

    def close(self) -> None:
        self._turns.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000) -> Tool:
    """The built-in `python` tool: the code runs in the code verifier's sandbox, one fresh
    process per call, and the observation is what it printed (stderr's tail after a failure)."""
    from components.sandbox import SandboxConfig, run_python

    config = SandboxConfig(
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max(4 * max_output_chars, 4096)
    )

    def python(code: str) -> str:
        """Run Python code in a fresh sandbox and return what it prints to stdout. Use
        print() to see a value; no network, no files kept between calls."""
        result = run_python(code, config=config)
        if result.timed_out:
            raise ToolFailure(f"the code ran past {timeout_s:g} s and was stopped")
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-3:]
            raise ToolFailure("\n".join(tail) or f"exit status {result.returncode}")
        return result.stdout

    # the sandbox enforces its own deadline; the toolbox's is a little longer as a backstop
    return tool_from_callable(python, timeout_s=timeout_s + 5.0, max_output_chars=max_output_chars)


def load_tools(specs: list[str]) -> ToolBox:
    """The run's tools from `generate.tools`: `python` or a `module:function` /
    `path/to/file.py:function` spec of a typed, documented callable."""
    import importlib
    import importlib.util
    import os

    tools: dict[str, Tool] = {}
    for spec in specs:
        if spec == "python":
            tool = python_tool()
        else:
            target, sep, func = spec.rpartition(":")
            if not sep or not target or not func:
                raise ToolError(
                    f"generate.tools: {spec!r} is not 'python', 'module:function' or "
                    "'path/to/file.py:function'"
                )
            try:
                if target.endswith(".py"):
                    path = os.path.abspath(target)
                    mod_spec = importlib.util.spec_from_file_location(
                        f"rlvr_tool_{abs(hash(path)):x}", path
                    )
                    if mod_spec is None or mod_spec.loader is None or not os.path.isfile(path):
                        raise ImportError(f"no file {path}")
                    module = importlib.util.module_from_spec(mod_spec)
                    mod_spec.loader.exec_module(module)
                else:
                    module = importlib.import_module(target)
            except Exception as e:  # noqa: BLE001 - name the spec and the cause
                raise ToolError(
                    f"generate.tools: {spec!r} cannot be imported "
                    f"({type(e).__name__}: {e}); fix the path or module"
                ) from None
            fn = getattr(module, func, None)
            if not callable(fn):
                raise ToolError(f"generate.tools: {spec!r}: {target} has no function {func!r}")
            tool = tool_from_callable(fn)
        if tool.name in tools:
            raise ToolError(f"generate.tools: two tools are named {tool.name!r}; rename one")
        tools[tool.name] = tool
    return ToolBox(tools)
