"""The dynamics plots of the run dashboard: one PNG per figure family (eval, verify, rollout,
train, time), a grid of small line charts over the iterations, the key figures first, one panel
per figure or group of related figures; figures that never changed are listed in a text panel.

As in components/report/plots.py the figures are built on an Agg canvas without pyplot and the
PNGs carry no software version: the same table gives the same bytes. components/evaluate/
dashboard.py puts them on the HTML page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, MaxNLocator

from components.core.stages import STAGES
from components.report.dynamics import Dynamics, family_of

__all__ = ["Panel", "family_panels", "format_number", "plot_family", "short_name", "y_label"]

_DPI = 100
_PANEL_W, _PANEL_H = 3.4, 2.35
_COLUMNS = 4
_MARKERS_UP_TO = 40  # points per line drawn with markers; longer runs get plain lines
_CONSTANTS_PER_PANEL = 11
_TITLES = {
    "eval": "Evaluation (held-out sets) per checkpoint",
    "verify": "Rewards and verification per iteration",
    "rollout": "Rollouts (generate) per iteration",
    "train": "Policy update (train) per iteration",
    "health": "Run health per iteration",
    "time": "Seconds per stage and iteration",
}
#: The key figures of each family, in the order they come first (a panel only where present).
_TRAIN_KEYS = (
    "train/reward_mean",
    "train/entropy",
    "train/kl_ref",
    "train/ppo_kl",
    "train/approx_kl",
    "train/rollout_kl",
    "train/clipfrac",
    "train/grad_norm",
    "train/lr",
    "train/loss",
    "train/adv_std",
    "train/zero_var_groups",
    "train/tokens_per_s",
)
#: Figures drawn on one panel with the first (its title); the rest are the legend's lines.
_GROUPS = {
    "train/clipfrac": (
        "train/clipfrac",
        "train/clipfrac_low",
        "train/clipfrac_high",
        "train/dual_clipfrac",
    ),
    "train/loss": ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy_loss"),
    "train/staleness_mean": ("train/staleness_mean", "train/staleness_max"),
    "rollout/response_length_mean": ("rollout/response_length_mean", "rollout/response_length_max"),
    "verify/zero_signal_share": (
        "verify/zero_signal_share",
        "verify/all_correct_share",
        "verify/all_wrong_share",
    ),
    "rollout/tool_calls_per_sample": (
        "rollout/tool_calls_per_sample",
        "rollout/tool_call_rate",
        "rollout/tool_error_share",
    ),
}
_ROLLOUT_KEYS = (
    "rollout/tool_calls_per_sample",
    "rollout/turns_mean",  # multi-turn runs, first
    "rollout/response_length_mean",
    "rollout/truncated_fraction",
    "rollout/tokens_per_s",
)
_VERIFY_KEYS = ("verify/reward_mean", "verify/zero_signal_share", "verify/error_fraction")


@dataclass(frozen=True)
class Panel:
    """One small chart: ``lines`` (figure names) over the steps, titled ``title``; a line with
    ``<name>_ci95_lo`` / ``_hi`` companions gets its confidence band. ``constants`` instead makes a
    text panel listing ``(name, value)`` pairs."""

    title: str
    lines: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    constants: tuple[tuple[str, float], ...] = ()


# --------------------------------------------------------------------------- panels


def _constant(dyn: Dynamics, name: str) -> bool:
    _, ys = dyn.series(name)
    return len(ys) > 1 and max(ys) == min(ys)


def short_name(name: str, family: str) -> str:
    return name[len(family) + 1 :] if name.startswith(family + "/") else name


def _pass_k(name: str) -> int:
    m = re.search(r"pass@(\d+)$", name)
    return int(m.group(1)) if m else 0


def _lm_eval_panels(dyn: Dynamics, names: Sequence[str], trained: str | None) -> list[Panel]:
    """The regression panels: per lm-eval task its metrics over the checkpoints (95% band from
    lm-eval's standard errors), next to the trained task's pass@1."""
    panels = []
    prefix = "eval/lm_eval/"
    metrics = [
        n for n in names if n.startswith(prefix) and "_ci95_" not in n and not n.endswith("_stderr")
    ]
    for task in sorted({n[len(prefix) :].split("/")[0] for n in metrics}):
        mine = [n for n in metrics if n.startswith(f"{prefix}{task}/")]
        lines = tuple(mine) + ((trained,) if trained else ())
        labels = tuple(n.rsplit("/", 1)[1] for n in mine)
        if trained:
            labels += (f"{trained.split('/')[1]} pass@1 (trained task)",)
        panels.append(Panel(f"standard benchmark: {task}", lines, labels))
    return panels


def _eval_panels(dyn: Dynamics, names: Sequence[str]) -> list[Panel]:
    panels: list[Panel] = []
    sets = sorted({n.split("/")[1] for n in names if n.count("/") >= 2} - {"lm_eval"})
    trained = f"eval/{sets[0]}/pass@1" if sets and f"eval/{sets[0]}/pass@1" in names else None
    for s in sets:
        prefix = f"eval/{s}/"
        mine = [n for n in names if n.startswith(prefix) and "_ci95_" not in n]
        passes = sorted(
            (n for n in mine if re.fullmatch(r"pass@\d+", n[len(prefix) :])), key=_pass_k
        )
        used = set(passes)
        if prefix + "pass@1" in mine:
            panels.append(Panel(prefix + "pass@1", (prefix + "pass@1",), ("pass@1",)))
        more = [n for n in passes if n != prefix + "pass@1"]
        if more:
            lines = tuple(passes)
            panels.append(Panel(prefix + "pass@k", lines, tuple(n[len(prefix) :] for n in lines)))
        votes = sorted(
            (
                n
                for n in mine
                if re.fullmatch(r"(mean@\d+|maj@\d+|greedy_pass@1)", n[len(prefix) :])
            ),
            key=lambda n: (
                n[len(prefix) :].split("@")[0],
                _pass_k(n.replace("maj@", "pass@").replace("mean@", "pass@")),
            ),
        )
        if votes:
            used.update(votes)
            panels.append(
                Panel(
                    prefix + "mean@n, maj@k", tuple(votes), tuple(n[len(prefix) :] for n in votes)
                )
            )
        for n in mine:
            if n not in used:
                panels.append(Panel(n, (n,)))
    return panels + _lm_eval_panels(dyn, names, trained)


def _time_panels(names: Sequence[str]) -> list[Panel]:
    panels = []
    stages = STAGES

    def key(n: str) -> tuple[int, str]:
        stage = n.split("/")[1].split("_")[0]
        return (stages.index(stage) if stage in stages else len(stages), n)

    busy = sorted((n for n in names if not n.endswith("_work_s")), key=key)
    work = sorted((n for n in names if n.endswith("_work_s")), key=key)
    if busy:
        panels.append(
            Panel("time/<stage>_s: busy seconds", tuple(busy), tuple(n[5:-2] for n in busy))
        )
    if work:
        panels.append(
            Panel("time/<stage>_work_s: work seconds", tuple(work), tuple(n[5:-7] for n in work))
        )
    return panels


_SHARE_LABELS = {
    "verify/zero_signal_share": "no signal (all rewards equal)",
    "verify/all_correct_share": "all correct",
    "verify/all_wrong_share": "all wrong",
}


def family_panels(dyn: Dynamics, family: str) -> list[Panel]:
    """The panels of one family's grid, key figures first; figures that never changed (and are
    not key figures) go into text panels at the end."""
    names = [c for c in dyn.columns if family_of(c) == family]
    if not names:
        return []
    if family == "eval":
        return _eval_panels(dyn, names)
    if family == "time":
        return _time_panels(names)
    keys = {"train": _TRAIN_KEYS, "rollout": _ROLLOUT_KEYS, "verify": _VERIFY_KEYS}.get(family, ())
    present = set(names)
    grouped = {m for head, members in _GROUPS.items() if head in present for m in members[1:]}
    first = [k for k in keys if k in present]
    if family == "rollout":  # the curriculum's figures, after the key ones (constant: listed)
        first += [n for n in names if n.startswith("rollout/sampler_") and not _constant(dyn, n)]
    rest = [n for n in names if n not in first and n not in grouped]
    panels, constants = [], []
    for n in first + rest:
        members = tuple(m for m in _GROUPS.get(n, (n,)) if m in present)
        if family == "verify" and n == "verify/reward_mean":
            by = tuple(m for m in names if m.startswith("verify/reward_mean/"))
            grouped.update(by)  # one data source: its line is reward_mean's
            members = (n, *by) if len(by) > 1 else (n,)
        elif n in grouped:
            continue
        if all(_constant(dyn, m) for m in members):  # key figures too: a flat line says less
            constants += [(m, dyn.series(m)[1][0]) for m in members]
            continue
        same = tuple(m for m in members[1:] if dyn.series(m) == dyn.series(n))
        members = tuple(m for m in members if m not in same)  # one line for equal series
        if len(members) == 1 and same:
            panels.append(Panel(" = ".join((n, *same)), members))
        elif len(members) == 1:
            panels.append(Panel(n, members))
        else:
            labels = tuple(
                _SHARE_LABELS.get(m)
                or ("all" if m == n and family == "verify" else short_name(m, family))
                for m in members
            )
            if same:
                labels = (" = ".join(short_name(m, family) for m in (n, *same)), *labels[1:])
            if n == "verify/zero_signal_share":
                panels.append(Panel("verify/GRPO groups: share of prompts", members, labels))
            elif family == "verify" and n == "verify/reward_mean":
                panels.append(Panel(n + " (by data source)", members, labels))
            else:
                panels.append(Panel(n, members, labels))
    comps = [p for p in panels if p.lines and p.lines[0].startswith("verify/reward/")]
    if len(comps) > 1:  # reward components on one panel
        panels = [p for p in panels if p not in comps]
        lines = tuple(p.lines[0] for p in comps)
        panels.insert(
            1,
            Panel(
                "verify/reward components",
                lines,
                tuple(short_name(n, "verify/reward") for n in lines),
            ),
        )
    for i in range(0, len(constants), _CONSTANTS_PER_PANEL):
        chunk = tuple(constants[i : i + _CONSTANTS_PER_PANEL])
        panels.append(Panel("unchanged over the run", constants=chunk))
    return panels


# --------------------------------------------------------------------------- drawing


def format_number(x: float) -> str:
    """A figure's value for a table: thousands grouped, else 4 significant digits."""
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


class _Ticks(Formatter):
    """Short tick labels with as few decimals as the ticks need, all alike: 0.15 0.30 0.45,
    1.000 1.004, 45k 50k, 1.2M; tiny values in e-notation."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.format_ticks([x])[0]

    def format_ticks(self, values: Sequence[float]) -> list[str]:  # type: ignore[override]
        values = [float(v) for v in values]
        if not values:
            return []
        top = max(abs(v) for v in values)
        scale, suffix = 1.0, ""
        for limit, div, name in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
            if top >= limit:
                scale, suffix = div, name
                break
        if 0 < top < 1e-3:
            for digits in range(1, 7):
                labels = [f"{v:.{digits}e}".replace("e-0", "e-") if v else "0" for v in values]
                if len(set(labels)) == len(labels):
                    return labels
            return labels
        scaled = [v / scale for v in values]
        steps = [abs(b - a) for a, b in zip(scaled, scaled[1:], strict=False) if b != a]
        tol = (min(steps) if steps else max(abs(scaled[0]), 1.0)) * 1e-6
        for decimals in range(0, 9):
            if all(abs(round(v, decimals) - v) <= tol for v in scaled):
                break
        out = []
        for v in scaled:
            text = f"{v:.{decimals}f}"
            out.append(("0" if float(text) == 0 else text) + ("" if float(text) == 0 else suffix))
        return out


def _xlim(steps: Sequence[int]) -> tuple[float, float]:
    lo, hi = min(steps), max(steps)
    pad = 0.5 if hi - lo < 10 else 0.0
    return (lo - pad, hi + pad) if hi > lo else (lo - 1.0, hi + 1.0)


#: A panel's y axis spans at least this share of its largest value: auto-scaling alone
#: stretches a series that barely moves (response length 11.26-11.31) into a jagged line.
MIN_RELATIVE_SPAN = 0.05

#: What a figure's value is, by its name (the first match), for the panel's y axis.
_UNITS = (
    (r"(pass@\d+|maj@\d+|mean@\d+)$", "share of prompts"),
    (r"bytes_per_s$", "bytes per second"),
    (r"tokens_per_s$", "tokens per second"),
    (r"_per_s$", "per second"),
    (r"^time/|_s$|/seconds$", "seconds"),
    (r"_groups$", "groups"),
    (r"(share|fraction|frac|rate|waste)$|clipfrac", "share"),
    (r"(length_\w+|tokens)$", "tokens"),
    (r"(entropy|kl_ref|kl|approx_kl|ppo_kl)$", "nats"),
    (r"reward", "reward"),
    (r"/adv_", "advantage"),
    (r"/lr$", "learning rate"),
    (r"grad_norm$", "L2 norm"),
    (r"global_step$", "optimizer steps"),
    (r"staleness|policy_version", "iterations"),
)


def y_label(panel: Panel) -> str:
    """The y axis label of a line panel: the unit its first figure is in, else its short name."""
    name = panel.lines[0] if panel.lines else panel.title
    for pattern, unit in _UNITS:
        if re.search(pattern, name):
            return unit
    return short_name(name, family_of(name)).rsplit("/", 1)[-1]


def _ylim(lim: tuple[float, float]) -> tuple[float, float]:
    """The y limits auto-scaling gave, widened about their middle to MIN_RELATIVE_SPAN of the
    largest magnitude (a flat line sits in the middle; values near 0 get +-1e-3 at least)."""
    lo, hi = lim
    need = max(MIN_RELATIVE_SPAN * max(abs(lo), abs(hi)), 1e-12 * max(1.0, abs(hi)))
    if hi - lo >= need:
        return lo, hi
    mid = (lo + hi) / 2
    half = (
        max(need / 2, 0.5 * max(abs(mid), 1e-3))
        if hi - lo <= 1e-12 * max(1.0, abs(hi))
        else need / 2
    )
    return mid - half, mid + half


def _draw(ax, dyn: Dynamics, panel: Panel, xlim: tuple[float, float]) -> None:  # noqa: ANN001
    if panel.constants:
        ax.set_axis_off()
        ax.set_title(panel.title, fontsize=9, loc="left", color="#555555")
        text = "\n".join(f"{n} = {format_number(v)}" for n, v in panel.constants)
        ax.text(
            0.0,
            1.0,
            text,
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=7.5,
            family="monospace",
            color="#333333",
            linespacing=1.45,
        )
        return
    for i, name in enumerate(panel.lines):
        xs, ys = dyn.series(name)
        if not xs:
            continue
        label = panel.labels[i] if i < len(panel.labels) else short_name(name, family_of(name))
        marker = "o" if len(xs) <= _MARKERS_UP_TO else None
        (line,) = ax.plot(
            xs, ys, marker=marker, markersize=3, linewidth=1.4, label=label, color=f"C{i}"
        )
        lo_x, lo = dyn.series(name + "_ci95_lo")
        hi_x, hi = dyn.series(name + "_ci95_hi")
        if lo_x and lo_x == hi_x:
            if len(lo_x) == 1:
                ax.vlines(lo_x, lo, hi, color=line.get_color(), alpha=0.35, linewidth=4)
            else:
                ax.fill_between(
                    lo_x,
                    lo,
                    hi,
                    color=line.get_color(),
                    alpha=0.18,
                    linewidth=0,
                    label=f"{label} 95% CI",
                )
    for step, _ in dyn.health.markers() if dyn.health is not None else []:
        # the health verdict's first iteration, and the stop (components/core/run_control.py)
        ax.axvline(step, color="#c0392b", linestyle="--", linewidth=1.0, alpha=0.8)
    ax.set_title(panel.title, fontsize=9, loc="left")
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.yaxis.set_major_formatter(_Ticks())
    ax.tick_params(labelsize=7.5, length=2.5)
    ax.grid(True, alpha=0.3, linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_ylabel(y_label(panel), fontsize=7.5, color="#555555", labelpad=2)
    ax.set_ylim(*_ylim(ax.get_ylim()))
    if len(panel.lines) > 1 or len(ax.get_legend_handles_labels()[0]) > 1:
        ax.legend(fontsize=6.5, loc="best", frameon=False, handlelength=1.5, borderaxespad=0.2)


def plot_family(dyn: Dynamics, family: str, out_png: Path) -> Path | None:
    """One family's grid of panels as a PNG (None when the run has no figure of it)."""
    panels = family_panels(dyn, family)
    if not panels:
        return None
    steps = sorted({s for p in panels for n in p.lines for s in dyn.series(n)[0]}) or dyn.steps
    # few panels (time: two) get wider ones, so every family's image has the same width
    ncols = min(_COLUMNS, len(panels))
    width = _PANEL_W * _COLUMNS if ncols > 1 else _PANEL_W * 2
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(width, _PANEL_H * nrows + 0.55), layout="constrained")
    fig.get_layout_engine().set(h_pad=0.06, w_pad=0.06, hspace=0.04, wspace=0.03)
    xlim = _xlim(steps)
    for i, panel in enumerate(panels):
        _draw(fig.add_subplot(nrows, ncols, i + 1), dyn, panel, xlim)
    fig.suptitle(_TITLES.get(family, family), fontsize=12, x=0.01, ha="left", fontweight="bold")
    fig.supxlabel("checkpoint" if family == "eval" else "iteration", fontsize=9)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out_png, format="png", dpi=_DPI, metadata={"Software": None})
    return out_png


# --------------------------------------------------------------------------- HTML
