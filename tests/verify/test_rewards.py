"""Tests for the verifier registry, plugin loading and the bounded-time executor."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from components.verify.executor import ScoreItem, ScoreResult, score_batch
from components.verify.math import compute_score
from components.verify.rewards import (
    VERIFIERS,
    exact_match_score,
    get_verifier,
    load_plugin,
    resolve_verifier,
)

PLUGIN_SOURCE = textwrap.dedent(
    """
    import os
    import time


    def as_float(data_source, solution_str, ground_truth, extra_info):
        return float(solution_str.strip() == ground_truth)


    def as_dict(data_source, solution_str, ground_truth, extra_info):
        return {"score": 0.5 if data_source == "half" else 1.0, "extracted_answer": solution_str}


    def as_bool(data_source, solution_str, ground_truth, extra_info):
        return solution_str == ground_truth


    def not_finite(data_source, solution_str, ground_truth, extra_info):
        return float(solution_str)


    def not_a_number(data_source, solution_str, ground_truth, extra_info):
        return {"score": "high"}


    def behave(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "sleep":
            time.sleep(60)
        if solution_str == "raise":
            raise ValueError("boom")
        if solution_str == "crash":
            os._exit(7)
        return {"score": float(solution_str == ground_truth), "extracted_answer": solution_str}
    """
)


@pytest.fixture()
def plugin_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(PLUGIN_SOURCE)
    return path


@pytest.fixture()
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "rlvr_test_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards_mod.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "rlvr_test_pkg.rewards_mod"
    for name in [m for m in sys.modules if m.startswith("rlvr_test_pkg")]:
        del sys.modules[name]


# ------------------------------------------------------------------------------ registry


def test_registry_names() -> None:
    assert set(VERIFIERS) == {"math", "exact", "code", "format"}
    assert get_verifier("math") is compute_score
    assert get_verifier("exact") is exact_match_score


def test_unknown_verifier_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        get_verifier("mathh")
    msg = str(err.value)
    assert "'mathh'" in msg and "'math'" in msg and "'exact'" in msg


def test_exact_match_score() -> None:
    assert exact_match_score("blah \\boxed{Paris}", "Paris")["score"] == 1.0
    assert exact_match_score("  Paris \n", "Paris") == {
        "score": 1.0,
        "extracted_answer": "Paris",
        "rule": None,
    }
    assert exact_match_score("\\boxed{0.5}", "1/2")["score"] == 0.0


# ------------------------------------------------------------------------------- plugins


def test_plugin_by_module(plugin_module: str) -> None:
    fn = load_plugin(f"{plugin_module}:as_float")
    assert fn("4", "4") == {"score": 1.0, "extracted_answer": None}
    assert fn("5", "4")["score"] == 0.0


def test_plugin_by_file(plugin_file: Path) -> None:
    fn = load_plugin(f"{plugin_file}:as_dict")
    assert fn("x", "y") == {"score": 1.0, "extracted_answer": "x"}
    # data_source from the keyword or from extra_info
    assert fn("x", "y", None, data_source="half")["score"] == 0.5
    assert fn("x", "y", {"data_source": "half"})["score"] == 0.5
    assert get_verifier(f"{plugin_file}:as_bool")("a", "a")["score"] == 1.0


def test_plugin_relative_file_path(plugin_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(plugin_file.parent)
    assert load_plugin("my_reward.py:as_float")("1", "1")["score"] == 1.0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_plugin_non_finite_raises(plugin_file: Path, value: str) -> None:
    fn = load_plugin(f"{plugin_file}:not_finite")
    with pytest.raises(ValueError, match="finite"):
        fn(value, "1")


def test_plugin_non_number_raises(plugin_file: Path) -> None:
    with pytest.raises(ValueError, match="finite"):
        load_plugin(f"{plugin_file}:not_a_number")("1", "1")


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("no_colon_here", "package.module:function"),
        ("some.module:", "package.module:function"),
        ("rlvr_definitely_missing_mod:fn", "PYTHONPATH"),
        ("/definitely/missing/file.py:fn", "does not exist"),
    ],
)
def test_bad_plugin_spec(spec: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        load_plugin(spec)
    assert repr(spec) in str(err.value) and hint in str(err.value)


def test_missing_function_names_available(plugin_file: Path) -> None:
    with pytest.raises(ValueError) as err:
        load_plugin(f"{plugin_file}:nope")
    assert "as_float" in str(err.value) and "nope" in str(err.value)


def test_resolve_verifier_is_cached(plugin_file: Path) -> None:
    spec = f"{plugin_file}:as_float"
    assert resolve_verifier(spec) is resolve_verifier(spec)
    assert resolve_verifier("math")("ds", "\\boxed{1}", "1", None)["score"] == 1.0


# ------------------------------------------------------------------------------ executor


def _mixed_items(spec: str) -> list[ScoreItem]:
    sols = ["a", "b", "sleep", "a", "raise", "c", "a"]
    return [ScoreItem(spec, "ds", s, "a") for s in sols] + [
        ScoreItem("math", "ds", "so \\boxed{\\frac{1}{2}}", "0.5"),
        ScoreItem("exact", "ds", "\\boxed{Paris}", "Paris"),
    ]


def test_executor_timeout_and_errors(plugin_file: Path) -> None:
    items = _mixed_items(f"{plugin_file}:behave")
    # chunk_size=4 puts the sleeper in the middle of a chunk with healthy neighbours
    results = score_batch(items, num_workers=2, timeout_s=1.0, chunk_size=4)
    assert [r.reward for r in results] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    sleeper = results[2]
    assert sleeper.timed_out and sleeper.error == "timeout after 1.0s"
    assert results[4].error == "ValueError: boom" and not results[4].timed_out
    assert results[0] == ScoreResult(1.0, "a", None, False)
    assert all(r.error is None for i, r in enumerate(results) if i not in (2, 4))


def test_executor_deterministic_and_ordered(plugin_file: Path) -> None:
    spec = f"{plugin_file}:behave"
    items = [ScoreItem(spec, "ds", str(i % 7), "3") for i in range(60)]
    items += [ScoreItem("math", "ds", f"\\boxed{{{i}}}", str(i % 5)) for i in range(40)]
    first = score_batch(items, num_workers=2, timeout_s=5.0, chunk_size=7)
    second = score_batch(items, num_workers=2, timeout_s=5.0)
    inline = score_batch(items, num_workers=0, timeout_s=5.0)
    assert first == second == inline
    assert [r.extracted_answer for r in first[:60]] == [str(i % 7) for i in range(60)]
    assert [r.reward for r in first[60:]] == [float(i == i % 5) for i in range(40)]


def test_executor_worker_crash(plugin_file: Path) -> None:
    spec = f"{plugin_file}:behave"
    items = [ScoreItem(spec, "ds", s, "a") for s in ["a", "crash", "a", "b"]]
    results = score_batch(items, num_workers=1, timeout_s=5.0, chunk_size=4)
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert results[1].error is not None and "ProcessExpired" in results[1].error
    assert not results[1].timed_out


def test_executor_bad_spec_fails_fast() -> None:
    with pytest.raises(ValueError, match="valid names"):
        score_batch([ScoreItem("nope", "ds", "x", "y")], num_workers=1, timeout_s=1.0)


def test_executor_inline_and_empty(plugin_file: Path) -> None:
    assert score_batch([], num_workers=2, timeout_s=1.0) == []
    items = [ScoreItem(f"{plugin_file}:behave", "ds", s, "a") for s in ["a", "raise"]]
    results = score_batch(items, num_workers=0, timeout_s=1.0)
    assert results == [
        ScoreResult(1.0, "a", None, False),
        ScoreResult(0.0, None, "ValueError: boom", False),
    ]
    with pytest.raises(ValueError):
        score_batch(items, num_workers=-1, timeout_s=1.0)
    with pytest.raises(ValueError):
        score_batch(items, num_workers=1, timeout_s=0)
