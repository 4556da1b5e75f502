"""Render the evaluate stage's ``report.md`` from metrics, the checkpoint history and plot paths.

The output is a pure function of the inputs (no I/O, no timestamps), so re-rendering the same
evaluation gives the same bytes. Floats are written with 4 decimals, confidence intervals as
``[lo, hi]`` and missing values as ``-``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath, PureWindowsPath

__all__ = ["format_value", "render_markdown"]

_CI_SUFFIX = "_ci95"
_HISTORY_COLUMNS = ("checkpoint", "pass@1", "pass@1_ci95", "mean@n", "reward")
_MISSING = "-"


def format_value(value: object) -> str:
    """Format one table cell: ints as is, floats with 4 decimals, ``[lo, hi]`` pairs, ``-``."""
    if value is None:
        return _MISSING
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return _escape(str(value))


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(_escape(h) for h in header) + " |",
        "|" + "|".join(["---"] * len(header)) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _split(metrics: Mapping[str, object]) -> tuple[Mapping[str, object], Mapping[str, Mapping]]:
    by_source = metrics.get("by_data_source") or {}
    if not isinstance(by_source, Mapping):
        raise ValueError("metrics['by_data_source'] must be a {data_source: summary} mapping")
    overall = metrics.get("overall")
    if overall is None:
        overall = {k: v for k, v in metrics.items() if k != "by_data_source"}
    if not isinstance(overall, Mapping):
        raise ValueError("metrics['overall'] must be a summary mapping")
    return overall, by_source


def _metric_rows(summary: Mapping[str, object]) -> list[list[str]]:
    rows = []
    for key, value in summary.items():
        if key.endswith(_CI_SUFFIX):
            continue
        ci = summary.get(key + _CI_SUFFIX)
        rows.append([_escape(key), format_value(value), format_value(ci)])
    return rows


def _source_columns(by_source: Mapping[str, Mapping]) -> list[str]:
    columns: list[str] = []
    for summary in by_source.values():
        for key in summary:
            if key not in columns:
                columns.append(key)
    return columns


def _check_relative(name: str, path: str) -> None:
    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        raise ValueError(f"image {name!r} path must be relative to report.md, got {path!r}")


def render_markdown(
    metrics: Mapping[str, object],
    history: Sequence[Mapping[str, object]],
    images: Mapping[str, str],
) -> str:
    """Render ``report.md``.

    Args:
        metrics: ``{"overall": summarize(...), "by_data_source": summarize_by(...)}``; optional
            ``"checkpoint"`` and ``"model"`` entries are shown in the header. A bare
            :func:`~components.evaluate.metrics.summarize` dict (no ``"overall"`` key) is taken
            as the overall summary.
        history: rows ``{"checkpoint", "pass@1", "pass@1_ci95"?, "mean@n", "reward"?}``, shown
            sorted by checkpoint.
        images: ``{caption: relative path}``, linked in the given order.

    Returns:
        The markdown text, ending with a newline.

    Raises:
        ValueError: on an absolute image path or malformed ``metrics``.
    """
    overall, by_source = _split(metrics)
    lines = ["# Evaluation report", ""]
    for key in ("model", "checkpoint"):
        if metrics.get(key) is not None:
            lines.append(f"- **{key}**: {format_value(metrics[key])}")
    if lines[-1] != "":
        lines.append("")

    lines += ["## Overall", ""]
    if overall:
        lines += _table(["metric", "value", "95% CI"], _metric_rows(overall))
    else:
        lines.append("_No metrics._")
    lines.append("")

    if by_source:
        lines += ["## By data source", ""]
        columns = _source_columns(by_source)
        rows = [
            [_escape(str(source))] + [format_value(by_source[source].get(c)) for c in columns]
            for source in sorted(by_source)
        ]
        lines += _table(["data_source", *columns], rows)
        lines.append("")

    if history:
        lines += ["## History", ""]
        ordered = sorted(history, key=lambda r: int(r.get("checkpoint", 0)))  # type: ignore[call-overload]
        rows = [[format_value(row.get(c)) for c in _HISTORY_COLUMNS] for row in ordered]
        lines += _table(list(_HISTORY_COLUMNS), rows)
        lines.append("")

    if images:
        lines += ["## Plots", ""]
        for caption, path in images.items():
            _check_relative(caption, path)
            target = f"<{path}>" if any(ch.isspace() for ch in path) else path
            lines += [f"![{_escape(caption)}]({target})", ""]

    return "\n".join(lines).rstrip("\n") + "\n"
