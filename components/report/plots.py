"""Deterministic PNG plots for the evaluate stage (matplotlib, Agg canvas, no pyplot state).

Figures are built with :class:`matplotlib.figure.Figure` on an Agg canvas, so nothing depends on
the process-wide pyplot backend or on open figures, and the PNG metadata carries no software
version, so the same input gives the same bytes with the same matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

__all__ = ["plot_history", "plot_pass_at_k"]

_DPI = 100
_FIGSIZE = (7.0, 4.5)


def _save(fig: Figure, out_png: Path) -> Path:
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out_png, format="png", dpi=_DPI, metadata={"Software": None})
    return out_png


def _finite(value: object, what: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a number, got {value!r}") from exc
    if not math.isfinite(x):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return x


def plot_pass_at_k(curves: Mapping[str, Mapping[int, float]], out_png: Path, title: str) -> Path:
    """Plot pass@k against k (log2 x-axis), one line per label, and write ``out_png``.

    Args:
        curves: ``{label: {k: pass@k}}``, e.g. ``{"base (00000)": {1: 0.2, 2: 0.3}, ...}``; lines
            are drawn in the mapping's order.
        out_png: destination PNG path (parent folders are created).
        title: figure title.

    Returns:
        ``out_png`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: if ``curves`` is empty, a curve is empty, a k is not a positive integer, or a
            value is not finite.
    """
    if not curves:
        raise ValueError("curves is empty: pass at least one {label: {k: pass@k}} curve")
    fig = Figure(figsize=_FIGSIZE)
    ax = fig.add_subplot(1, 1, 1)
    all_ks: set[int] = set()
    for label, curve in curves.items():
        if not curve:
            raise ValueError(f"curve {label!r} is empty: it needs at least one (k, pass@k) point")
        points = []
        for k, value in curve.items():
            if isinstance(k, bool) or int(k) != k or int(k) < 1:
                raise ValueError(f"curve {label!r}: k must be a positive integer, got {k!r}")
            points.append((int(k), _finite(value, f"curve {label!r} pass@{k}")))
        points.sort()
        xs = [k for k, _ in points]
        ys = [v for _, v in points]
        all_ks.update(xs)
        ax.plot(xs, ys, marker="o", linewidth=1.5, markersize=4, label=str(label))
    ax.set_xscale("log", base=2)
    ticks = sorted(all_ks)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(k) for k in ticks])
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 2, ticks[0] * 2)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _save(fig, out_png)


def plot_history(history: Sequence[Mapping[str, object]], out_png: Path) -> Path:
    """Plot evaluation metrics over checkpoints and write ``out_png``.

    Each row is ``{"checkpoint": int, "pass@1": float, "mean@n": float}`` with optional
    ``"pass@1_ci95": [lo, hi]`` (drawn as a band over the rows that have it) and optional
    ``"reward"`` (mean train reward, drawn over the rows that have it). Rows are sorted by
    checkpoint.

    Returns:
        ``out_png`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: if ``history`` is empty, a required key is missing, checkpoints repeat, or a
            value is not finite.
    """
    if not history:
        raise ValueError("history is empty: pass at least one checkpoint row")
    rows = []
    for i, row in enumerate(history):
        missing = [key for key in ("checkpoint", "pass@1", "mean@n") if key not in row]
        if missing:
            raise ValueError(f"history row {i} is missing {missing}: {dict(row)!r}")
        rows.append(row)
    pairs = sorted(
        ((int(r["checkpoint"]), r) for r in rows),  # type: ignore[call-overload]
        key=lambda item: item[0],
    )
    checkpoints = [c for c, _ in pairs]
    if len(set(checkpoints)) != len(checkpoints):
        raise ValueError(f"history has repeated checkpoints: {checkpoints}")

    fig = Figure(figsize=_FIGSIZE)
    ax = fig.add_subplot(1, 1, 1)
    pass1 = [_finite(r["pass@1"], f"checkpoint {c} pass@1") for c, r in pairs]
    mean_n = [_finite(r["mean@n"], f"checkpoint {c} mean@n") for c, r in pairs]
    (line,) = ax.plot(checkpoints, pass1, marker="o", linewidth=1.5, markersize=4, label="pass@1")

    band = [(c, r["pass@1_ci95"]) for c, r in pairs if r.get("pass@1_ci95")]
    if band:
        xs, lo, hi = [], [], []
        for c, ci in band:
            if not isinstance(ci, Sequence) or len(ci) != 2:
                raise ValueError(f"checkpoint {c} pass@1_ci95 must be [lo, hi], got {ci!r}")
            xs.append(c)
            lo.append(_finite(ci[0], f"checkpoint {c} pass@1_ci95"))
            hi.append(_finite(ci[1], f"checkpoint {c} pass@1_ci95"))
        if len(xs) == 1:
            ax.vlines(xs, lo, hi, color=line.get_color(), alpha=0.4, linewidth=4)
        else:
            ax.fill_between(
                xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0, label="pass@1 95% CI"
            )

    ax.plot(checkpoints, mean_n, marker="s", linewidth=1.5, markersize=4, label="mean@n")
    reward = [(c, r["reward"]) for c, r in pairs if r.get("reward") is not None]
    if reward:
        ax.plot(
            [c for c, _ in reward],
            [_finite(v, f"checkpoint {c} reward") for c, v in reward],
            marker="^",
            linestyle="--",
            linewidth=1.2,
            markersize=4,
            label="train reward",
        )
    if len(checkpoints) <= 20:
        ax.xaxis.set_major_locator(FixedLocator(checkpoints))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(checkpoints) == 1:
        ax.set_xlim(checkpoints[0] - 1, checkpoints[0] + 1)
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("score")
    ax.set_title("Evaluation over checkpoints")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    return _save(fig, out_png)
