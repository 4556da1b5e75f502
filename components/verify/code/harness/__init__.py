"""What runs inside the code verifier's sandboxes (stdlib only), as source text.

``wire.py`` (framing and the plain-data codec) is also imported by the parent. The
others are never imported here: they are copied into a sandbox next to a small
``main.py`` that puts the sandbox's directory on ``sys.path`` and calls ``main(fd)``.
"""

from __future__ import annotations

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


def server_files(solution: str) -> dict[str, str]:
    """Files of the solution's sandbox."""
    return {"solution.py": solution, "rlvr_wire.py": WIRE, "rlvr_server.py": SERVER}


def runner_files(tests_json: str) -> dict[str, str]:
    """Files of the tests' sandbox."""
    return {"tests.json": tests_json, "rlvr_wire.py": WIRE, "rlvr_runner.py": RUNNER}
