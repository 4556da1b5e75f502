"""The arithmetic problems as a code task: the policy answers with a program, and the
code verifier runs it against asserts in two sandboxes (the solution's process and the
tests' process, see docs/verifiers.md).

A response is a one-line function, ``def f():return 68``; the ground truth is
``{"asserts": ["assert f() == 68"]}``, so the reward needs the program to run and the
test, in a process that never loads it, to see the right value come back. The policy may
equally write ``def f():return 23+45``: the verifier credits whatever computes 68.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from examples.arithmetic import data as arithmetic
from examples.arithmetic.data import Problem

DATA_SOURCE = "arithmetic_code"
_RETURN = re.compile(r"def f\(\):\s*return\s*(-?\d+)")


def response(problem: Problem) -> str:
    """What the warm-up teaches (the answer computed in the head, as a literal)."""
    return f"def f():return {problem.answer}"


def ground_truth(problem: Problem) -> str:
    return json.dumps({"asserts": [f"assert f() == {problem.answer}"]})


def grade_literal(texts: Sequence[str], problems: Sequence[Problem]) -> list[float]:
    """The warm-up's stop rule only: the literal a one-line ``f`` returns. (Running every
    sampled dev response in the sandbox would make the warm-up minutes longer; the RL
    reward and the evaluation do run them.)"""
    scores = []
    for text, problem in zip(texts, problems, strict=True):
        m = _RETURN.fullmatch(text.strip())
        scores.append(1.0 if m and m.group(1) == problem.answer else 0.0)
    return scores


def write_table(problems: Iterable[Problem], split: str, path: Path) -> Path:
    """The arithmetic problems' rows, with test cases as the ground truth."""
    return arithmetic.write_table(
        problems, split, path, data_source=DATA_SOURCE, ground_truth=ground_truth
    )
