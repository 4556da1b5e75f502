"""Tests for components.report.plots and components.report.markdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.report.markdown import format_value, render_markdown
from components.report.plots import plot_history, plot_pass_at_k

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CURVES = {
    "base (00000)": {1: 0.20, 2: 0.31, 4: 0.42, 8: 0.51},
    "previous (00004)": {1: 0.35, 2: 0.45, 4: 0.55, 8: 0.62},
    "this (00005)": {8: 0.66, 1: 0.40, 2: 0.50, 4: 0.59},
}

HISTORY = [
    {"checkpoint": 5, "pass@1": 0.40, "mean@n": 0.41, "pass@1_ci95": [0.35, 0.45], "reward": 0.5},
    {"checkpoint": 0, "pass@1": 0.20, "mean@n": 0.22, "pass@1_ci95": [0.16, 0.24]},
    {"checkpoint": 4, "pass@1": 0.35, "mean@n": 0.36, "pass@1_ci95": [0.30, 0.40], "reward": 0.45},
]


def _assert_png(path: Path) -> bytes:
    assert path.is_file()
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE
    return data


def test_plot_pass_at_k_writes_deterministic_png(tmp_path: Path) -> None:
    first = plot_pass_at_k(CURVES, tmp_path / "a" / "pass_at_k.png", "pass@k")
    second = plot_pass_at_k(CURVES, tmp_path / "b.png", "pass@k")
    assert first == tmp_path / "a" / "pass_at_k.png"
    assert _assert_png(first) == _assert_png(second)


def test_plot_pass_at_k_single_point(tmp_path: Path) -> None:
    _assert_png(plot_pass_at_k({"only": {1: 0.5}}, tmp_path / "one.png", "one point"))


def test_plot_pass_at_k_rejects_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "bad.png"
    with pytest.raises(ValueError, match="empty"):
        plot_pass_at_k({}, out, "t")
    with pytest.raises(ValueError, match="empty"):
        plot_pass_at_k({"x": {}}, out, "t")
    with pytest.raises(ValueError, match="positive integer"):
        plot_pass_at_k({"x": {0: 0.1}}, out, "t")
    with pytest.raises(ValueError, match="finite"):
        plot_pass_at_k({"x": {1: float("nan")}}, out, "t")
    assert not out.exists()


def test_plot_history_writes_png(tmp_path: Path) -> None:
    first = _assert_png(plot_history(HISTORY, tmp_path / "history.png"))
    second = _assert_png(plot_history(list(reversed(HISTORY)), tmp_path / "history2.png"))
    assert first == second  # rows are sorted by checkpoint


def test_plot_history_minimal_rows(tmp_path: Path) -> None:
    _assert_png(plot_history([{"checkpoint": 0, "pass@1": 0.1, "mean@n": 0.1}], tmp_path / "a.png"))
    rows = [{"checkpoint": 0, "pass@1": 0.1, "mean@n": 0.1, "pass@1_ci95": [0.05, 0.15]}]
    _assert_png(plot_history(rows, tmp_path / "b.png"))
    rows = [
        {"checkpoint": 0, "pass@1": 0.1, "mean@n": 0.1},
        {"checkpoint": 1, "pass@1": 0.2, "mean@n": 0.2, "reward": 0.3},
    ]
    _assert_png(plot_history(rows, tmp_path / "c.png"))


def test_plot_history_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        plot_history([], tmp_path / "x.png")
    with pytest.raises(ValueError, match="mean@n"):
        plot_history([{"checkpoint": 0, "pass@1": 0.1}], tmp_path / "x.png")
    row = {"checkpoint": 0, "pass@1": 0.1, "mean@n": 0.1}
    with pytest.raises(ValueError, match="repeated"):
        plot_history([row, row], tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"\[lo, hi\]"):
        plot_history([{**row, "pass@1_ci95": [0.1]}], tmp_path / "x.png")


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

OVERALL = {
    "n": 4,
    "num_problems": 2,
    "pass@1": 0.25,
    "pass@2": 5 / 12,
    "mean@4": 0.25,
    "maj@2": 1 / 3,
    "response_length/mean": 15.0,
    "pass@1_ci95": [0.0, 0.5],
    "mean@4_ci95": [0.0, 0.5],
}
BY_SOURCE = {
    "math": {"n": 4, "num_problems": 1, "pass@1": 0.5, "pass@1_ci95": [0.5, 0.5]},
    "gsm8k": {"n": 4, "num_problems": 1, "pass@1": 0.0, "pass@1_ci95": [0.0, 0.0]},
}
IMAGES = {"pass@k": "pass_at_k.png", "history": "plots/history.png"}


def test_format_value() -> None:
    assert format_value(0.123456) == "0.1235"
    assert format_value(3) == "3"
    assert format_value([0.1, 0.25]) == "[0.1000, 0.2500]"
    assert format_value(None) == "-"
    assert format_value("a|b") == "a\\|b"


def test_render_markdown_contains_tables_and_links() -> None:
    metrics = {"overall": OVERALL, "by_data_source": BY_SOURCE, "checkpoint": 5}
    text = render_markdown(metrics, HISTORY, IMAGES)
    assert text.startswith("# Evaluation report\n")
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert "- **checkpoint**: 5" in text
    # overall table: value and CI on the same row, CI keys not repeated as rows
    assert "| pass@1 | 0.2500 | [0.0000, 0.5000] |" in text
    assert "| pass@2 | 0.4167 | - |" in text
    assert "| maj@2 | 0.3333 | - |" in text
    assert "| mean@4 | 0.2500 | [0.0000, 0.5000] |" in text
    assert "| response_length/mean | 15.0000 | - |" in text
    assert "| n | 4 | - |" in text
    assert "\n| pass@1_ci95 |" not in text
    # per-data_source table, sources sorted
    assert "| data_source | n | num_problems | pass@1 | pass@1_ci95 |" in text
    assert text.index("| gsm8k | 4 | 1 | 0.0000 | [0.0000, 0.0000] |") < text.index(
        "| math | 4 | 1 | 0.5000 | [0.5000, 0.5000] |"
    )
    # history sorted by checkpoint, missing reward shown as '-'
    assert "| checkpoint | pass@1 | pass@1_ci95 | mean@n | reward |" in text
    assert "| 0 | 0.2000 | [0.1600, 0.2400] | 0.2200 | - |" in text
    assert "| 5 | 0.4000 | [0.3500, 0.4500] | 0.4100 | 0.5000 |" in text
    assert text.index("| 0 | 0.2000") < text.index("| 4 | 0.3500") < text.index("| 5 | 0.4000")
    # relative image links
    assert "![pass@k](pass_at_k.png)" in text
    assert "![history](plots/history.png)" in text
    # deterministic
    assert render_markdown(metrics, HISTORY, IMAGES) == text


def test_render_markdown_bare_summary_and_empty_sections() -> None:
    text = render_markdown(OVERALL, [], {})
    assert "| pass@1 | 0.2500 | [0.0000, 0.5000] |" in text
    assert "## By data source" not in text
    assert "## History" not in text
    assert "## Plots" not in text


def test_render_markdown_rejects_absolute_image_paths() -> None:
    with pytest.raises(ValueError, match="relative"):
        render_markdown({"overall": OVERALL}, [], {"pass@k": "/tmp/pass_at_k.png"})
