"""Prepare the code demo: the arithmetic problems with test cases as ground truth, and a
tiny policy warmed to answer with a one-line program (``def f():return 68``). Offline,
deterministic in ``--seed``, about a minute on 2 CPU cores::

    python -m examples.arithmetic_code.prepare --out /tmp/arith-code
"""

from __future__ import annotations

from collections.abc import Sequence

from examples.arithmetic.prepare import Task, WarmupConfig
from examples.arithmetic.prepare import main as prepare_main
from examples.arithmetic_code.task import grade_literal, response, write_table

CODE = Task(response=response, grade=grade_literal, write_table=write_table)
# the code demo keeps the stop rule it was measured with (README: 0.083 -> 0.285)
DEFAULTS = WarmupConfig(max_new_tokens=20, max_steps=1500, target=0.15, threads=2)


def main(argv: Sequence[str] | None = None) -> None:
    prepare_main(argv, task=CODE, defaults=DEFAULTS, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
