"""The SmolLM2 example's task: short arithmetic word problems answered in ``\\boxed{}``.

A problem is one sentence about a person and some objects (``Anna has 7 coins and finds 5 more.
How many coins does Anna have now?``) followed by the instruction ``Put the final answer in
\\boxed{}.``; its ground truth is the integer answer. Families:

* ``add``: a + b with a, b in 2..9 (gets, finds, buys more);
* ``sub``: a - b with a in 6..19, b < a (gives away, eats, loses);
* ``mul``: a groups of b with a, b in 2..5 (bags of, boxes of).

The base (SmolLM2-135M-Instruct, 4-bit weights dequantized) answers these correctly about one
time in four at temperature 1.0, wordily and seldom in a box; the reward
(`examples.smollm2.task:boxed_reward`) credits a right answer only inside ``\\boxed{}``, as the
prompt asks. Every problem is a (family, a, b, name, object) combination; the held-out set takes
whole (family, a, b) combinations, so no eval problem's numbers appear in train.

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

from components.verify.math import compute_score, extract_answer
from examples.arithmetic.data import PROMPT_TYPE, REWARD_MODEL_TYPE

DATA_SOURCE = "smollm2_arith"
INSTRUCTION = "Put the final answer in \\boxed{}."
NAMES = ("Anna", "Tom", "Lily", "Sam", "Maya", "Ben", "Zoe", "Leo")
OBJECTS = ("apples", "coins", "books", "pens", "stickers", "marbles", "cards", "shells")
ADD_VERBS = ("gets {b} more", "finds {b} more", "buys {b} more")
SUB_VERBS = ("gives away {b}", "loses {b}", "gives {b} to a friend")
MUL_HOLDERS = ("bags", "boxes", "jars")

EXTRA_INFO_TYPE = pa.struct(
    [
        ("index", pa.int64()),
        ("family", pa.string()),
        ("a", pa.int64()),
        ("b", pa.int64()),
        ("split", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT_TYPE),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
    ]
)


@dataclass(frozen=True)
class WordProblem:
    family: str
    a: int
    b: int
    name: str
    obj: str
    verb: int

    @property
    def answer(self) -> int:
        return {"add": self.a + self.b, "sub": self.a - self.b, "mul": self.a * self.b}[self.family]

    @property
    def question(self) -> str:
        n, o = self.name, self.obj
        if self.family == "add":
            act = ADD_VERBS[self.verb % len(ADD_VERBS)].format(b=self.b)
            return f"{n} has {self.a} {o} and {act}. How many {o} does {n} have now?"
        if self.family == "sub":
            act = SUB_VERBS[self.verb % len(SUB_VERBS)].format(b=self.b)
            return f"{n} has {self.a} {o} and {act}. How many {o} does {n} have left?"
        holder = MUL_HOLDERS[self.verb % len(MUL_HOLDERS)]
        return f"{n} has {self.a} {holder} with {self.b} {o} in each. How many {o} does {n} have?"

    @property
    def prompt_text(self) -> str:
        return f"{self.question} {INSTRUCTION}"


def number_pairs(family: str) -> list[tuple[int, int]]:
    if family == "add":
        return [(a, b) for a in range(2, 10) for b in range(2, 10)]
    if family == "sub":
        return [(a, b) for a in range(6, 20) for b in range(1, a)]
    if family == "mul":
        return [(a, b) for a in range(2, 6) for b in range(2, 6)]
    raise ValueError(f"unknown family {family!r}")


FAMILY_WEIGHTS = {"add": 0.45, "sub": 0.4, "mul": 0.15}


def make_splits(seed: int, n_train: int, n_eval: int) -> dict[str, list[WordProblem]]:
    """Eval: `n_eval` problems on distinct (family, a, b) combinations held out of train; train:
    `n_train` problems drawn from the remaining combinations (names, objects and wording vary)."""
    rng = random.Random(seed)
    held: dict[str, list[tuple[int, int]]] = {}
    rest: dict[str, list[tuple[int, int]]] = {}
    splits: dict[str, list[WordProblem]] = {"eval": [], "train": []}

    def draw(family: str, a: int, b: int) -> WordProblem:
        return WordProblem(family, a, b, rng.choice(NAMES), rng.choice(OBJECTS), rng.randrange(6))

    for family, weight in FAMILY_WEIGHTS.items():
        pairs = number_pairs(family)
        rng.shuffle(pairs)
        k = min(round(n_eval * weight), len(pairs) // 4)  # at most a quarter held out
        held[family], rest[family] = pairs[:k], pairs[k:]
        splits["eval"] += [draw(family, a, b) for a, b in held[family]]
    families = list(FAMILY_WEIGHTS)
    weights = [FAMILY_WEIGHTS[f] for f in families]
    for _ in range(n_train):
        family = rng.choices(families, weights)[0]
        splits["train"].append(draw(family, *rng.choice(rest[family])))
    rng.shuffle(splits["eval"])
    return splits


def write_table(problems: list[WordProblem], split: str, path: Path) -> Path:
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


def boxed_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> dict[str, Any]:
    """1.0 when the last ``\\boxed{}`` holds the right answer (math equivalence), else 0.0: the
    prompt asks for a box, so an unboxed right number earns nothing (verl's strict GSM8K reward
    does the same with ``####``). verl's reward signature, named in the config as
    ``verify.rewards: {smollm2_arith: examples.smollm2.task:boxed_score}``."""
    answer, rule = extract_answer(solution_str)
    if rule != "boxed":
        return {"score": 0.0, "extracted_answer": answer}
    return compute_score(solution_str, ground_truth)
