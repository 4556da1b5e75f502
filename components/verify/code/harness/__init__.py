"""What runs inside the code verifier's sandboxes (stdlib only), as source text.

``wire.py`` (framing and the plain-data codec) is also imported by the parent. The
others are never imported here: they are copied into a sandbox next to a small
``main.py`` that puts the sandbox's directory on ``sys.path`` and calls ``main(fd)``.
"""

from __future__ import annotations

import functools
import importlib.util
import marshal
from pathlib import Path

_HERE = Path(__file__).parent


def _source(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


WIRE = _source("wire.py")
SERVER = _source("server.py")
RUNNER = _source("runner.py")
IN_PROCESS = _source("in_process.py")


def _main(module: str) -> str:
    return (
        "import os, sys\n"
        "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\n"
        f"import {module}\n"
        f"{module}.main(int(sys.argv[1]))\n"
    )


SERVER_MAIN = _main("rlvr_server")
RUNNER_MAIN = _main("rlvr_runner")


@functools.cache
def _pyc(module: str, source: str) -> bytes:
    """``source`` compiled for *this* interpreter, as a sourceless ``.pyc``: the
    sandbox imports it without compiling it again on every run."""
    code = compile(source, f"{module}.py", "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") * 3
    return header + marshal.dumps(code)


def _modules(modules: dict[str, str], precompiled: bool) -> dict[str, str | bytes]:
    if precompiled:
        return {f"{name}.pyc": _pyc(name, src) for name, src in modules.items()}
    return {f"{name}.py": src for name, src in modules.items()}


def server_files(solution: str, precompiled: bool = False) -> dict[str, str | bytes]:
    """Files of the solution's sandbox. ``precompiled`` only where the sandbox runs
    the same interpreter as this process (the default ``SandboxConfig.python``)."""
    mods = _modules({"rlvr_wire": WIRE, "rlvr_server": SERVER}, precompiled)
    return {"solution.py": solution, **mods}


def runner_files(tests_json: str, precompiled: bool = False) -> dict[str, str | bytes]:
    """Files of the tests' sandbox."""
    mods = _modules({"rlvr_wire": WIRE, "rlvr_runner": RUNNER}, precompiled)
    return {"tests.json": tests_json, **mods}
