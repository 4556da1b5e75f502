"""Verifiable arithmetic problems for the RLVR demo, written in verl's Parquet dataset format.

Every problem is a short integer expression such as ``23+45=``; its ground truth is the exact
integer result as a string (``"68"``). Problems come in difficulty levels:

* level 1: ``a+b`` with one single-digit operand and one operand below 100;
* level 2: ``a+b`` and ``a-b`` with two-digit operands (``a >= b`` for subtraction);
* level 3: ``a*b`` with one operand in 2..9 and the other in 2..99.

Every level has hundreds of distinct problems or more, so a held-out eval split of a few hundred
problems leaves most of each level for training.

Generation is deterministic given the seed. The eval split is held out: expressions are deduplicated
by a normalized form (whitespace removed, operands of ``+`` and ``*`` sorted) and no normalized
expression of the eval split appears in the train split.

Each row has the columns verl expects:

* ``data_source`` (string): ``"arithmetic"``;
* ``prompt`` (list<struct<role, content>>): a single user message whose content is the expression;
* ``reward_model`` (struct<ground_truth, style>): the answer string and ``"rule"``;
* ``extra_info`` (struct<index, level, split, expression>).

Run it on its own to write ``train.parquet`` and ``eval.parquet``::

    python -m examples.arithmetic.data --out /tmp/arith --seed 0 --n-train 20000 --n-eval 500
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "arithmetic"

#: Problems held out of both files for the base policy's stop rule (see ``prepare``).
N_DEV = 300

#: Relative share of each level in both splits.
LEVEL_WEIGHTS: dict[int, float] = {1: 0.3, 2: 0.5, 3: 0.2}

PROMPT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
REWARD_MODEL_TYPE = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])
EXTRA_INFO_TYPE = pa.struct(
    [
        ("index", pa.int64()),
        ("level", pa.int64()),
        ("split", pa.string()),
        ("expression", pa.string()),
    ]
)


def verl_schema(extra_info: pa.DataType) -> pa.Schema:
    """verl's dataset columns, with an example's own `extra_info` struct."""
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", PROMPT_TYPE),
            ("reward_model", REWARD_MODEL_TYPE),
            ("extra_info", extra_info),
        ]
    )


SCHEMA = verl_schema(EXTRA_INFO_TYPE)


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem: ``a op b`` with its integer answer."""

    a: int
    op: str
    b: int
    level: int

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def prompt_text(self) -> str:
        """The user message: the expression followed by ``=``."""
        return f"{self.expression}="

    @property
    def answer(self) -> str:
        if self.op == "+":
            return str(self.a + self.b)
        if self.op == "-":
            return str(self.a - self.b)
        if self.op == "*":
            return str(self.a * self.b)
        raise ValueError(f"unknown operator {self.op!r}")


def normalize_expression(expression: str) -> str:
    """Canonical form used to dedupe: no whitespace, operands of ``+``/``*`` sorted."""
    expr = "".join(expression.split()).rstrip("=")
    for op in "+*":
        if op in expr:
            left, right = expr.split(op, 1)
            a, b = sorted((int(left), int(right)))
            return f"{a}{op}{b}"
    return expr


def level_pool(level: int) -> list[Problem]:
    """All problems of one level, in a fixed order."""
    if level == 1:
        pairs = [(a, b) for a in range(10) for b in range(100)]
        return [Problem(a, "+", b, 1) for a, b in pairs] + [
            Problem(b, "+", a, 1) for a, b in pairs if b >= 10
        ]
    if level == 2:
        two = range(10, 100)
        adds = [Problem(a, "+", b, 2) for a in two for b in two]
        subs = [Problem(a, "-", b, 2) for a in two for b in two if a >= b]
        return adds + subs
    if level == 3:
        pairs = [(a, b) for a in range(2, 10) for b in range(2, 100)]
        return [Problem(a, "*", b, 3) for a, b in pairs] + [
            Problem(b, "*", a, 3) for a, b in pairs if b >= 10
        ]
    raise ValueError(f"unknown level {level}")


def _level_counts(n: int, weights: dict[int, float]) -> dict[int, int]:
    """Split ``n`` into per-level counts proportional to ``weights`` (largest remainder)."""
    total = sum(weights.values())
    raw = {lvl: n * w / total for lvl, w in weights.items()}
    counts = {lvl: int(x) for lvl, x in raw.items()}
    rest = n - sum(counts.values())
    for lvl in sorted(raw, key=lambda k: (counts[k] - raw[k], k))[:rest]:
        counts[lvl] += 1
    return counts


def make_splits(
    *,
    seed: int,
    n_train: int,
    n_eval: int,
    n_dev: int = 0,
    weights: dict[int, float] | None = None,
) -> dict[str, list[Problem]]:
    """Draw the ``eval``, ``dev`` and ``train`` problem lists, deterministic in ``seed``.

    Eval problems are unique (by normalized expression) and held out from dev and train; dev is
    held out from train as well. Train problems are drawn with replacement from what is left, so
    ``n_train`` may exceed the number of distinct problems.
    """
    weights = dict(LEVEL_WEIGHTS if weights is None else weights)
    rng = random.Random(seed)
    # Normalized groups per level, shuffled once: "3+4" and "4+3" share a group.
    groups: dict[int, list[list[Problem]]] = {}
    for level in sorted(weights):
        by_norm: dict[str, list[Problem]] = {}
        for p in level_pool(level):
            by_norm.setdefault(normalize_expression(p.expression), []).append(p)
        keys = sorted(by_norm)
        rng.shuffle(keys)
        groups[level] = [by_norm[k] for k in keys]

    splits: dict[str, list[Problem]] = {"eval": [], "dev": [], "train": []}
    cursor = dict.fromkeys(groups, 0)
    for split, n in (("eval", n_eval), ("dev", n_dev)):
        for level, count in _level_counts(n, weights).items():
            start = cursor[level]
            take = groups[level][start : start + count]
            if len(take) < count:
                raise ValueError(f"level {level} has too few distinct problems for {split}")
            cursor[level] = start + count
            splits[split].extend(rng.choice(g) for g in take)
    for level, count in _level_counts(n_train, weights).items():
        left = [p for g in groups[level][cursor[level] :] for p in g]
        if not left:
            raise ValueError(f"level {level} has no problems left for train")
        splits["train"].extend(rng.choice(left) for _ in range(count))
    for split in splits.values():
        rng.shuffle(split)
    return splits


def to_table(
    problems: Sequence[Problem],
    split: str,
    *,
    data_source: str = DATA_SOURCE,
    ground_truth: Callable[[Problem], str] = lambda p: p.answer,
) -> pa.Table:
    """Rows in verl's dataset format (``ground_truth``: what the verifier is given; another
    task over the same problems, such as the code demo, passes its own)."""
    rows = {
        "data_source": [data_source] * len(problems),
        "prompt": [[{"role": "user", "content": p.prompt_text}] for p in problems],
        "reward_model": [{"ground_truth": ground_truth(p), "style": "rule"} for p in problems],
        "extra_info": [
            {"index": i, "level": p.level, "split": split, "expression": p.expression}
            for i, p in enumerate(problems)
        ],
    }
    return pa.Table.from_pydict(rows, schema=SCHEMA)


def write_table(problems: Iterable[Problem], split: str, path: Path, **rows: Any) -> Path:
    """Write ``to_table(problems, split, **rows)`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(to_table(list(problems), split, **rows), tmp)
    tmp.replace(path)
    return path


def write_datasets(
    out_dir: Path, *, seed: int, n_train: int, n_eval: int, n_dev: int = N_DEV
) -> tuple[Path, Path]:
    """Write ``out_dir/train.parquet`` and ``out_dir/eval.parquet``; return their paths.

    ``n_dev`` problems are held out of both files (``prepare`` uses them to decide when to stop
    warming the base policy); keep the default to get the same files as ``prepare``.
    """
    out_dir = Path(out_dir)
    splits = make_splits(seed=seed, n_train=n_train, n_eval=n_eval, n_dev=n_dev)
    train = write_table(splits["train"], "train", out_dir / "train.parquet")
    evaluation = write_table(splits["eval"], "eval", out_dir / "eval.parquet")
    return train, evaluation


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=20000)
    parser.add_argument("--n-eval", type=int, default=500)
    args = parser.parse_args(argv)
    for path in write_datasets(args.out, seed=args.seed, n_train=args.n_train, n_eval=args.n_eval):
        print(path)


if __name__ == "__main__":
    main()
