"""Cost of the code verifier's sandbox (a script, not a test).

Measured side by side, interleaved round by round so that drift on the machine hits every
variant alike:

* ``bare``: ``python -I -S -B -c pass`` started with ``subprocess`` -- the baseline: the
  least any fresh-process verifier pays per run;
* ``sandbox``: an empty program through ``run_python`` (namespaces, new root, limits,
  seccomp, deadline, reaping);
* one trivial test case through ``compute_score``: ``stdio`` (one sandbox), ``fn`` (the
  solution's process answers one call), ``assert`` (the solution's process and the tests'
  process, two sandboxes, queries relayed), and ``assert`` in the in-process mode.

For each: the median wall time per run and its ratio to ``bare`` (goal for a trivial test
case: < 2.5x), and runs per second per core, from the CPU time the run costs this process
and its children (``getrusage``): what a verify pod with N cores sustains is about N times
that. Prints the mode (``root`` or ``userns``).

Usage: ``python benchmarks/code_sandbox.py [--rounds 200]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.verify import sandbox  # noqa: E402
from components.verify.code import compute_score  # noqa: E402


def _py(code: str) -> str:
    return "```python\n" + code + "\n```"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def variants() -> dict[str, Callable[[], object]]:
    exe = sandbox._plan.interpreter(sandbox.SandboxConfig())[0]
    add = _py("def add(a, b):\n    return a + b")

    def check(out: dict) -> dict:
        assert out["score"] == 1.0, out
        return out

    return {
        "bare": lambda: subprocess.run([exe, "-I", "-S", "-B", "-c", "pass"], check=True),
        "sandbox": lambda: sandbox.run_python("pass"),
        "stdio case": lambda: check(
            compute_score(_py("print(int(input()) + 1)"), {"inputs": ["1"], "outputs": ["2"]})
        ),
        "fn case": lambda: check(
            compute_score(add, {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]})
        ),
        "assert case": lambda: check(compute_score(add, {"asserts": ["assert add(1, 2) == 3"]})),
        "assert case, in-process": lambda: check(
            compute_score(add, {"asserts": ["assert add(1, 2) == 3"], "isolation": "in_process"})
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    caps = sandbox.check_available()
    runs = variants()
    for fn in runs.values():  # warm up (the probe, page cache)
        fn()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, float] = dict.fromkeys(runs, 0.0)
    for _ in range(args.rounds):
        for name, fn in runs.items():
            c0, t0 = _cpu(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name] += _cpu() - c0
    bare = statistics.median(wall["bare"])
    print(
        f"mode: {sandbox.mode()}, network isolated: {caps.network_isolated}, rounds: {args.rounds}"
    )
    print(f"{'variant':<26}{'median ms':>10}{'x bare':>9}{'runs/s/core':>13}")
    for name in runs:
        med = statistics.median(wall[name])
        per_core = args.rounds / cpu[name] if cpu[name] > 0 else float("nan")
        print(f"{name:<26}{med * 1e3:>10.1f}{med / bare:>9.2f}{per_core:>13.1f}")


if __name__ == "__main__":
    main()
