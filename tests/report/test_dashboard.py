"""The run dashboard: one table from every committed manifest, PNGs per family, index.html."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from components.core.commit import OutputDir, read_manifest, shard_dir
from components.core.store import get_store, join
from components.report.dashboard import Panel, family_panels, write_dashboard
from components.report.dynamics import Dynamics, collect
from components.report.run_report import write_run_report

PNG = b"\x89PNG\r\n\x1a\n"


def _commit(store, uri: str, stage: str, stats: dict, files: dict | None = None) -> None:
    out = OutputDir(store, uri, stage)
    assert out.begin(force=True)
    for name, data in (files or {}).items():
        out.put_bytes(data, name)
    out.commit(stats)


def _timeline(**seconds: float) -> dict:
    return {"task": "x", "iteration": 0, "spans": [], "seconds": seconds}


def _metrics(pass1: float, pass2: float, ci: list[float]) -> bytes:
    overall = {
        "n": 2,
        "num_problems": 10,
        "pass@1": pass1,
        "pass@2": pass2,
        "mean@2": pass1,
        "pass@1_ci95": ci,
    }
    top = {
        "checkpoint": "ckpt",
        "eval_set": "held",
        "n": 2,
        "overall": overall,
        "by_data_source": {},
    }
    return json.dumps({**top, "sets": {"held": top}}).encode()


def _build_run(root: Path, *, evals: bool = True) -> None:
    """Iteration 0 unsharded with train; iteration 1 in two shards (no train yet); iteration 2
    with one of two rollout shards committed (not done); evaluations of checkpoints 0 and 1."""
    store, r = get_store(str(root)), str(root)
    it = lambda i, kind: join(r, "iterations", f"{i:05d}", kind)  # noqa: E731
    _commit(
        store,
        it(0, "rollouts"),
        "generate",
        {
            "samples": 8,
            "prompts": 2,
            "response_length_mean": 10.0,
            "response_length_max": 12,
            "truncated_fraction": 0.25,
            "tokens_per_s": 100.0,
            "backend": "transformers",
            "timeline": _timeline(wait=5.0, load=1.0, work=2.0),
        },
    )
    _commit(
        store,
        it(0, "scored"),
        "verify",
        {
            "samples": 8,
            "reward_mean": 0.5,
            "error_fraction": 0.0,
            "reward_mean_by_data_source": {"a": 0.5},
            "reward_components_mean": {"math": 0.5},
        },
    )
    _commit(store, join(r, "checkpoints", "00000"), "init", {"source": "/base"})
    _commit(
        store,
        join(r, "checkpoints", "00001"),
        "train",
        {
            "iteration": 0,
            "train/loss": 0.25,
            "train/entropy": 1.5,
            "train/engine": "reuse",
            "train/lr": 0.001,
            "timeline": _timeline(wait=9.0, read=0.5, work=2.5),
        },
    )
    shards = [
        (
            {
                "samples": 4,
                "prompts": 1,
                "response_length_mean": 10.0,
                "response_length_max": 11,
                "tokens_per_s": 50.0,
                "timeline": _timeline(work=1.0),
            },
            {
                "samples": 4,
                "reward_mean": 1.0,
                "groups": 1,
                "zero_signal_share": 1.0,
                "all_correct_share": 1.0,
                "all_wrong_share": 0.0,
            },
        ),
        (
            {
                "samples": 12,
                "prompts": 3,
                "response_length_mean": 14.0,
                "response_length_max": 16,
                "tokens_per_s": 70.0,
                "timeline": _timeline(work=3.0),
            },
            {
                "samples": 12,
                "reward_mean": 0.5,
                "groups": 3,
                "zero_signal_share": 2 / 3,
                "all_correct_share": 1 / 3,
                "all_wrong_share": 1 / 3,
            },
        ),
    ]
    for s, (gen, ver) in enumerate(shards):
        _commit(store, shard_dir(it(1, "rollouts"), s, 2), "generate", gen)
        _commit(store, shard_dir(it(1, "scored"), s, 2), "verify", ver)
    _commit(store, shard_dir(it(2, "rollouts"), 0, 2), "generate", {"samples": 3})
    if evals:
        for c, (p1, p2, ci) in enumerate([(0.2, 0.3, [0.1, 0.3]), (0.4, 0.5, [0.3, 0.5])]):
            _commit(
                store,
                join(r, "evals", f"{c:05d}"),
                "evaluate",
                {"checkpoint_index": c, "timeline": _timeline(wait=4.0, work=0.75)},
                {"metrics.json": _metrics(p1, p2, ci)},
            )


EVAL_ROWS = {
    0: {
        "eval/held/pass@1": 0.2,
        "eval/held/pass@2": 0.3,
        "eval/held/mean@2": 0.2,
        "eval/held/pass@1_ci95_lo": 0.1,
        "eval/held/pass@1_ci95_hi": 0.3,
        "time/evaluate_s": 0.75,
        "time/evaluate_work_s": 0.75,
    },
    1: {
        "eval/held/pass@1": 0.4,
        "eval/held/pass@2": 0.5,
        "eval/held/mean@2": 0.4,
        "eval/held/pass@1_ci95_lo": 0.3,
        "eval/held/pass@1_ci95_hi": 0.5,
        "time/evaluate_s": 0.75,
        "time/evaluate_work_s": 0.75,
    },
}
TRAIN_ROWS = {
    0: {
        "rollout/samples": 8.0,
        "rollout/prompts": 2.0,
        "rollout/response_length_mean": 10.0,
        "rollout/response_length_max": 12.0,
        "rollout/truncated_fraction": 0.25,
        "rollout/tokens_per_s": 100.0,
        "time/generate_s": 3.0,
        "time/generate_work_s": 2.0,
        "verify/samples": 8.0,
        "verify/reward_mean": 0.5,
        "verify/error_fraction": 0.0,
        "verify/reward_mean/a": 0.5,  # one reward component: no verify/reward/… figure
        "train/loss": 0.25,
        "train/entropy": 1.5,
        "train/lr": 0.001,
        "time/train_s": 3.0,
        "time/train_work_s": 2.5,
    },
    1: {  # two shards: counts add up, maxima and seconds take the slowest, rates add up,
        # means weighted by samples (groups for the group shares)
        "rollout/samples": 16.0,
        "rollout/prompts": 4.0,
        "rollout/response_length_mean": (4 * 10.0 + 12 * 14.0) / 16,  # 13.0
        "rollout/response_length_max": 16.0,
        "rollout/tokens_per_s": 120.0,
        "time/generate_s": 3.0,
        "time/generate_work_s": 3.0,
        "verify/samples": 16.0,
        "verify/reward_mean": (4 * 1.0 + 12 * 0.5) / 16,  # 0.625
        "verify/groups": 4.0,
        "verify/zero_signal_share": (1 * 1.0 + 3 * (2 / 3)) / 4,  # 0.75
        "verify/all_correct_share": (1 * 1.0 + 3 * (1 / 3)) / 4,  # 0.5
        "verify/all_wrong_share": (1 * 0.0 + 3 * (1 / 3)) / 4,  # 0.25
    },
}


def _expected(evals: bool = True) -> dict[int, dict[str, float]]:
    rows = {s: dict(r) for s, r in TRAIN_ROWS.items()}
    if evals:
        for s, r in EVAL_ROWS.items():
            rows[s].update(r)
    return rows


def test_collect_reads_every_manifest_into_one_table(tmp_path):
    root = tmp_path / "run"
    _build_run(root)
    dyn = collect(get_store(str(root)), str(root))
    assert dyn.rows == _expected()
    assert dyn.steps == [0, 1]  # iteration 2 has one of its two shards: not done, not shown
    assert dyn.families() == ["eval", "verify", "rollout", "train", "time"]
    assert dyn.columns[0].startswith("eval/") and dyn.columns[-1].startswith("time/")
    assert dyn.series("train/loss") == ([0], [0.25])


def test_csv_and_json_hold_the_table_exactly(tmp_path):
    root = tmp_path / "run"
    _build_run(root)
    dyn = collect(get_store(str(root)), str(root))
    rows = list(csv.DictReader(io.StringIO(dyn.to_csv())))
    assert list(rows[0]) == ["step", *dyn.columns]
    parsed = {
        int(r["step"]): {k: float(v) for k, v in r.items() if k != "step" and v != ""} for r in rows
    }
    assert parsed == _expected()
    data = json.loads(dyn.to_json())
    assert data["columns"] == dyn.columns
    assert {r.pop("step"): r for r in data["rows"]} == _expected()


def test_run_without_evaluation(tmp_path):
    root = tmp_path / "run"
    _build_run(root, evals=False)
    dyn = collect(get_store(str(root)), str(root))
    assert dyn.rows == _expected(evals=False)
    assert "eval" not in dyn.families()
    files = write_dashboard(dyn, tmp_path / "out", "run", str(root))
    names = sorted(f.name for f in files)
    assert "dynamics_eval.png" not in names and "dynamics_train.png" in names
    page = (tmp_path / "out" / "index.html").read_text()
    assert "No evaluation committed yet" in page


def test_empty_run_gives_an_empty_table(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    dyn = collect(get_store(str(root)), str(root))
    assert dyn.rows == {} and dyn.families() == []
    assert dyn.to_csv() == "step\n"


def test_panels_only_for_figures_present(tmp_path):
    dyn = Dynamics(_expected())
    train = [p.title for p in family_panels(dyn, "train")]
    assert train == ["train/entropy", "train/lr", "train/loss"]  # the key ones, in key order
    verify = [p.title for p in family_panels(dyn, "verify")]
    assert verify[:3] == [
        "verify/reward_mean",
        "verify/GRPO groups: share of prompts",
        "verify/error_fraction",
    ]
    shares = next(
        p for p in family_panels(dyn, "verify") if p.title == "verify/GRPO groups: share of prompts"
    )
    assert shares.lines == (
        "verify/zero_signal_share",
        "verify/all_correct_share",
        "verify/all_wrong_share",
    )
    assert shares.labels == ("no signal (all rewards equal)", "all correct", "all wrong")
    evals = family_panels(dyn, "eval")
    assert [p.title for p in evals][:2] == ["eval/held/pass@1", "eval/held/pass@k"]
    assert all("_ci95_" not in n for p in evals for n in p.lines)  # bands, not lines
    # no verify/zero_signal_share yet (an older run): no group-shares panel, nothing breaks
    old = Dynamics(
        {
            0: {"verify/reward_mean": 0.5, "verify/samples": 8.0},
            1: {"verify/reward_mean": 0.7, "verify/samples": 8.0},
        }
    )
    panels = family_panels(old, "verify")
    assert [p.title for p in panels] == ["verify/reward_mean", "unchanged over the run"]
    assert panels[1].constants == (("verify/samples", 8.0),)
    assert family_panels(old, "train") == []
    # a multi-turn run: the tool figures lead the rollout grid, calls, rate and errors together
    tools = Dynamics(
        {
            i: {
                "rollout/tool_calls_per_sample": 0.1 * i,
                "rollout/tool_call_rate": 0.05 * i,
                "rollout/tool_error_share": 0.5 - 0.1 * i,
                "rollout/turns_mean": 1 + 0.2 * i,
                "rollout/response_length_mean": 10.0 + i,
            }
            for i in range(3)
        }
    )
    panels = family_panels(tools, "rollout")
    assert [p.title for p in panels][:2] == ["rollout/tool_calls_per_sample", "rollout/turns_mean"]
    assert panels[0].lines == (
        "rollout/tool_calls_per_sample",
        "rollout/tool_call_rate",
        "rollout/tool_error_share",
    )


def test_pngs_are_valid_and_deterministic(tmp_path):
    root = tmp_path / "run"
    _build_run(root)
    dyn = collect(get_store(str(root)), str(root))
    first = write_dashboard(dyn, tmp_path / "a", "run", str(root))
    second = write_dashboard(dyn, tmp_path / "b", "run", str(root))
    pngs = [f for f in first if f.suffix == ".png"]
    assert sorted(f.name for f in pngs) == [
        f"dynamics_{f}.png" for f in sorted(["eval", "verify", "rollout", "train", "time"])
    ]
    for a, b in zip(first, second, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes(), a.name
    for f in pngs:
        data = f.read_bytes()
        assert data.startswith(PNG) and data.endswith(b"IEND\xaeB`\x82")
        assert b"Software" not in data and b"matplotlib" not in data.lower()


def test_index_html_is_self_contained(tmp_path):
    root = tmp_path / "run"
    _build_run(root)
    dyn = collect(get_store(str(root)), str(root))
    write_dashboard(dyn, tmp_path / "out", "my-run", str(root))
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'src="http' not in page and "<script" not in page and "<link" not in page
    assert "@import" not in page and "url(" not in page
    # every src is an embedded PNG, every href an anchor of the page
    assert all(s.startswith("data:image/png;base64,") for s in re.findall(r'src="([^"]*)"', page))
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    for family in ("eval", "verify", "rollout", "train", "time"):
        assert f'<section id="{family}">' in page
    assert page.count("data:image/png;base64,") == 5
    assert "Run my-run" in page and "0.4000" in page  # header and best pass@1
    assert f"tensorboard --logdir {root}/tensorboard" in page
    assert (
        "pip install -e &quot;.[tensorboard]&quot;" in page
        or 'pip install -e ".[tensorboard]"' in page
    )


def test_write_run_report_writes_the_dashboard(tmp_path):
    root = tmp_path / "run"
    _build_run(root)
    store = get_store(str(root))
    paths = write_run_report(store, str(root))
    for name in (
        "index.html",
        "dynamics.csv",
        "dynamics.json",
        "dynamics_train.png",
        "dynamics_eval.png",
        "report.md",
    ):
        assert name in paths and Path(paths[name]).is_file(), name
    listed = {f["path"] for f in read_manifest(store, join(str(root), "report"))["files"]}
    assert {"index.html", "dynamics.csv", "dynamics_time.png"} <= listed
    md = (root / "report" / "report.md").read_text()
    assert "## Training dynamics" in md and "![train](dynamics_train.png)" in md
    assert "[index.html](index.html)" in md
    csv_rows = list(csv.DictReader(io.StringIO((root / "report" / "dynamics.csv").read_text())))
    assert [r["step"] for r in csv_rows] == ["0", "1"]


@pytest.mark.parametrize("evals", [True, False])
def test_report_is_the_same_twice(tmp_path, evals):
    root = tmp_path / "run"
    _build_run(root, evals=evals)
    store = get_store(str(root))
    write_run_report(store, str(root))
    first = {p.name: p.read_bytes() for p in (root / "report").iterdir() if p.name != "_SUCCESS"}
    write_run_report(store, str(root))
    second = {p.name: p.read_bytes() for p in (root / "report").iterdir() if p.name != "_SUCCESS"}
    assert first == second


def test_pass_at_k_curves_one_per_checkpoint_with_every_role():
    from components.report.run_report import pass_curves

    def top(p1: float) -> dict:
        return {"overall": {"pass@1": p1, "pass@2": p1 + 0.1, "pass@1_ci95": [0, 1]}}

    tops = {0: top(0.1), 2: top(0.5), 4: top(0.4)}
    assert pass_curves(tops, base=0, best=2, last=4) == {
        "base (00000)": {1: 0.1, 2: 0.1 + 0.1},
        "best (00002)": {1: 0.5, 2: 0.5 + 0.1},
        "last (00004)": {1: 0.4, 2: 0.4 + 0.1},
    }
    assert list(pass_curves(tops, base=0, best=4, last=4)) == [
        "base (00000)",
        "best = last (00004)",
    ]
    assert list(pass_curves({0: top(0.1)}, base=0, best=0, last=0)) == [
        "base = best = last (00000)"
    ]


def test_panels_have_y_labels_and_do_not_magnify_noise():
    """Panels once had no y label, and auto-scaling drew response length 11.26-11.31 as a
    jagged line; constant key figures (train/lr, verify/error_fraction) were plotted while other
    constants were listed."""
    from matplotlib.figure import Figure

    from components.report.dynamics_plots import MIN_RELATIVE_SPAN, _draw, y_label

    lengths = [11.26, 11.31, 11.27, 11.30, 11.28]
    dyn = Dynamics(
        {
            i: {
                "rollout/response_length_mean": v,
                "train/lr": 1e-3,
                "train/entropy": 1.5 - 0.1 * i,
                "verify/error_fraction": 0.0,
                "verify/reward_mean": 0.1 * i,
            }
            for i, v in enumerate(lengths)
        }
    )
    panel = family_panels(dyn, "rollout")[0]
    ax = Figure().add_subplot(1, 1, 1)
    _draw(ax, dyn, panel, (0, 4))
    lo, hi = ax.get_ylim()
    assert (
        hi - lo >= MIN_RELATIVE_SPAN * max(lengths) * 0.999
        and lo < min(lengths) < max(lengths) < hi
    )
    assert ax.get_ylabel() == "tokens"
    for family in ("rollout", "train", "verify"):
        for p in family_panels(dyn, family):
            if p.lines:
                assert y_label(p), p.title
    train = family_panels(dyn, "train")
    assert [p.title for p in train] == ["train/entropy", "unchanged over the run"]
    assert train[1].constants == (("train/lr", 1e-3),)
    verify = family_panels(dyn, "verify")
    assert ("verify/error_fraction", 0.0) in verify[-1].constants
    assert y_label(train[0]) == "nats" and y_label(verify[0]) == "reward"
    units = {
        n: y_label(Panel(n, (n,)))
        for n in (
            "train/zero_var_groups",
            "train/tokens_per_s",
            "rollout/policy_load_s",
            "train/adv_std",
            "eval/held/pass@1",
            "time/train_s",
        )
    }
    assert units == {
        "train/zero_var_groups": "groups",
        "train/tokens_per_s": "tokens per second",
        "rollout/policy_load_s": "seconds",
        "train/adv_std": "advantage",
        "eval/held/pass@1": "share of prompts",
        "time/train_s": "seconds",
    }


def test_last_figures_wrap_long_names_and_the_timeline_labels_are_legible():
    from components.report import dashboard, timeline

    rule = re.search(r"td\.name \{([^}]*)\}", dashboard._CSS).group(1)
    assert "white-space: normal" in rule and "overflow-wrap: anywhere" in rule
    assert timeline.ITERATION_LABEL_SIZE >= 8


def test_families_drawn_in_two_processes_equal_one_and_survive_a_failed_child(
    tmp_path, monkeypatch
):
    """plot_families draws about half the panels in a forked child where that is safe. The
    PNGs are the same bytes either way; a child that fails, or hangs and is killed, costs time,
    never a plot; a process with another thread (fork would copy its locks) draws everything
    itself."""
    import os
    import threading
    import time

    from components.report import dashboard

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform: always drawn in one process")
    root = tmp_path / "run"
    _build_run(root)
    dyn = collect(get_store(str(root)), str(root))
    families = dyn.families()
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(dashboard, "_cores", lambda: 2)
    monkeypatch.setattr(dashboard, "CHILD_TIMEOUT_S", 10.0)  # a child stuck on a lock: not 2 min
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    # Other tests leave threads (a moto server) that matplotlib's drawing never waits on.
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    split = dashboard.plot_families(dyn, families, tmp_path / "split")
    assert forks == [1] and sorted(split) == sorted(families)

    monkeypatch.setattr(threading, "active_count", lambda: 2)
    alone = dashboard.plot_families(dyn, families, tmp_path / "alone")
    assert forks == [1]  # another thread: no fork
    for f in families:
        assert split[f].read_bytes() == alone[f].read_bytes(), f

    monkeypatch.setattr(threading, "active_count", lambda: 1)
    real_plot = dashboard.plot_family
    parent = os.getpid()
    for child_does, name in [("fail", "failed"), ("hang", "hung")]:

        def child(dyn, family, out_png, does=child_does):
            if os.getpid() != parent:
                if does == "fail":
                    raise RuntimeError("the child fails")
                time.sleep(60)
            return real_plot(dyn, family, out_png)

        monkeypatch.setattr(dashboard, "plot_family", child)
        monkeypatch.setattr(dashboard, "CHILD_TIMEOUT_S", 1.0)  # the hung child: killed soon
        t0 = time.monotonic()
        redrawn = dashboard.plot_families(dyn, families, tmp_path / name)
        assert time.monotonic() - t0 < 30, name  # a hung child is killed, not waited out
        for f in families:
            assert redrawn[f].read_bytes() == alone[f].read_bytes(), (name, f)
    assert forks == [1, 1, 1]
