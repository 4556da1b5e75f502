"""The code demo's task: its rows, and the code verifier on its responses (the warm-up's
format, a program that computes the answer, wrong and malformed ones)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from components import sandbox
from components.verify.code import compute_score
from examples.arithmetic.data import Problem
from examples.arithmetic_code.task import (
    DATA_SOURCE,
    grade_literal,
    ground_truth,
    response,
    write_table,
)

CAPS = sandbox.capabilities()
P = Problem(23, "+", 45, 2)


def test_rows_carry_asserts_as_ground_truth(tmp_path) -> None:
    path = write_table([P, Problem(7, "*", 6, 3)], "train", tmp_path / "t.parquet")
    rows = pq.read_table(path).to_pylist()
    assert [r["data_source"] for r in rows] == [DATA_SOURCE] * 2
    assert json.loads(rows[1]["reward_model"]["ground_truth"]) == {"asserts": ["assert f() == 42"]}
    assert rows[0]["prompt"] == [{"role": "user", "content": "23+45="}]


def test_warm_up_stop_rule() -> None:
    texts = [
        "def f():return 68",
        " def f(): return 68 ",
        "def f():return 67",
        "68",
        "def f():return 23+45",
    ]
    assert grade_literal(texts, [P] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.skipif(
    not (CAPS.available and CAPS.network_isolated), reason=f"no sandbox: {CAPS.reason}"
)
def test_the_reward_runs_the_program() -> None:
    gt = ground_truth(P)
    assert compute_score(response(P), gt)["score"] == 1.0
    assert compute_score("def f():return 23+45", gt)["score"] == 1.0  # computed, not recalled
    assert compute_score("def f():return 67", gt)["score"] == 0.0
    assert compute_score("def f(:return", gt)["score"] == 0.0


def test_prepare_keeps_the_tasks_own_defaults(monkeypatch) -> None:
    # the code task's responses need 20 new tokens; a flag-less default must not fall back
    # to the arithmetic task's 12 (the warm-up's stop rule would then never see an answer)
    from examples.arithmetic import prepare as arith
    from examples.arithmetic_code import prepare as code

    seen = {}
    monkeypatch.setattr(arith, "prepare", lambda out, cfg, task: seen.update(cfg=cfg, task=task))
    code.main(["--out", "/nonexistent", "--max-steps", "7"])
    assert seen["cfg"].max_new_tokens == 20 and seen["cfg"].max_steps == 7
    assert seen["task"] is code.CODE
