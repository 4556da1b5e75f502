"""The SmolLM2 example's task: small sums and differences, answered in ``\\boxed{}``.

A problem is ``What is 7 + 5? Put the final answer in \\boxed{}.``; its ground truth is the
integer answer. Families:

* ``add``: a + b with a, b in 1..9;
* ``sub``: a - b with a in 2..18, b < a, the difference at most 9;
* ``add2``: a + b with a in 10..40, b in 1..9.

Calibrated on the packaged base (SmolLM2-135M-Instruct, its 4-bit weights dequantized): at
temperature 0.8 it answers about one time in eight (held-out pass@1 0.123), wordily, and
truncated answers earn nothing; word problems ("Anna has 7 coins and finds 5 more...") were
tried first and are hopeless for it (1.5% at temperature 1.0). The reward is the math verifier
(`math`: the last box, else an answer phrase or the last line, by math equivalence). The
held-out set takes whole (family, a, b) combinations: no eval problem appears in train as
written, but a held-out sum of one digit may have its commuted twin there (3 + 5 held out,
5 + 3 trained on: 12 of the 20 held-out `add` problems); `sub` and `add2` have no twins.

Rows are in verl's format: ``data_source`` "smollm2_arith", ``prompt`` a one-message chat,
``reward_model.ground_truth`` the answer, ``extra_info`` the family and numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from examples.arithmetic.data import verl_schema

DATA_SOURCE = "smollm2_arith"
INSTRUCTION = "Put the final answer in \\boxed{}."
OPS = {"add": "+", "sub": "-", "add2": "+"}

EXTRA_INFO_TYPE = pa.struct(
    [
        ("index", pa.int64()),
        ("family", pa.string()),
        ("a", pa.int64()),
        ("b", pa.int64()),
        ("split", pa.string()),
    ]
)
SCHEMA = verl_schema(EXTRA_INFO_TYPE)


@dataclass(frozen=True)
class Problem:
    family: str
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a - self.b if self.family == "sub" else self.a + self.b

    @property
    def prompt_text(self) -> str:
        return f"What is {self.a} {OPS[self.family]} {self.b}? {INSTRUCTION}"


def number_pairs(family: str) -> list[tuple[int, int]]:
    if family == "add":
        return [(a, b) for a in range(1, 10) for b in range(1, 10)]
    if family == "sub":
        return [(a, b) for a in range(2, 19) for b in range(1, a) if a - b <= 9]
    if family == "add2":
        return [(a, b) for a in range(10, 41) for b in range(1, 10)]
    raise ValueError(f"unknown family {family!r}")


FAMILY_WEIGHTS = {"add": 0.4, "sub": 0.3, "add2": 0.3}


def make_splits(seed: int, n_train: int, n_eval: int) -> dict[str, list[Problem]]:
    """Eval: `n_eval` problems on distinct (family, a, b) combinations held out of train; train:
    `n_train` problems drawn with replacement from the remaining combinations."""
    rng = random.Random(seed)
    held: dict[str, list[tuple[int, int]]] = {}
    rest: dict[str, list[tuple[int, int]]] = {}
    splits: dict[str, list[Problem]] = {"eval": [], "train": []}

    for family, weight in FAMILY_WEIGHTS.items():
        pairs = number_pairs(family)
        rng.shuffle(pairs)
        k = min(round(n_eval * weight), len(pairs) // 4)  # at most a quarter held out
        held[family], rest[family] = pairs[:k], pairs[k:]
        splits["eval"] += [Problem(family, a, b) for a, b in held[family]]
    families = list(FAMILY_WEIGHTS)
    weights = [FAMILY_WEIGHTS[f] for f in families]
    for _ in range(n_train):
        family = rng.choices(families, weights)[0]
        splits["train"].append(Problem(family, *rng.choice(rest[family])))
    rng.shuffle(splits["eval"])
    return splits


def write_table(problems: list[Problem], split: str, path: Path) -> Path:
    rows: dict[str, list[Any]] = {
        "data_source": [DATA_SOURCE] * len(problems),
        "prompt": [[{"role": "user", "content": p.prompt_text}] for p in problems],
        "reward_model": [{"ground_truth": str(p.answer), "style": "rule"} for p in problems],
        "extra_info": [
            {"index": i, "family": p.family, "a": p.a, "b": p.b, "split": split}
            for i, p in enumerate(problems)
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pydict(rows, schema=SCHEMA), path)
    return path
