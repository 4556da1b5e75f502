"""Standard benchmarks through lm-evaluation-harness (components/evaluate/lm_eval_suite.py): the
config, `rlvr check`'s answers, the evaluate stage's results against lm-eval's own CLI on the
same checkpoint, where they land (metrics.json, the manifest, TensorBoard, the dashboard,
`rlvr report`) and the eval pipeline that `rlvr schedule` submits.

Tasks are local, in lm-eval's own YAML format, over data the tests write: one multiple-choice
task (scored by log-likelihood) and one generative task (greedy, exact match)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.core.config import ConfigError, RunConfig, effective_config, load_config
from pipelines.cli import main
from tests.support.runs import write_config

CHOICE = {
    "task": "t_choice",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": "data/choice.jsonl"}},
    "test_split": "test",
    "output_type": "multiple_choice",
    "doc_to_text": "{{question}}",
    "doc_to_choice": "{{choices}}",
    "doc_to_target": "label",
    "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    "metadata": {"version": 2.0},
}
GREEDY = {
    "task": "t_greedy",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": "data/greedy.jsonl"}},
    "test_split": "test",
    "output_type": "generate_until",
    "doc_to_text": "{{question}}",
    "doc_to_target": "{{target}}",
    "generation_kwargs": {"until": [], "do_sample": False, "max_gen_toks": 6},
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    "metadata": {"version": 1.0},
}


def write_tasks(root: Path, extra: dict | None = None) -> Path:
    """A task directory: the two tasks' YAMLs and their data (relative data_files)."""
    (root / "data").mkdir(parents=True)
    choice = [
        {
            "question": f"{a}+{b}=",
            "choices": [f"\\boxed{{{a + b + d}}}" for d in (0, 1, -1)],
            "label": 0,
        }
        for a, b in [(3, 4), (12, 30), (7, 7), (25, 19), (40, 2), (9, 81)]
    ]
    greedy = [
        {"question": f"{a}*{b}=", "target": f"\\boxed{{{a * b}}}"}
        for a, b in [(2, 3), (4, 5), (6, 7), (8, 9)]
    ]
    for name, rows in (("choice", choice), ("greedy", greedy)):
        (root / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for spec in (CHOICE, GREEDY, *([extra] if extra else [])):
        (root / f"{spec['task']}.yaml").write_text(yaml.safe_dump(spec))
    return root


def suite_config(tmp_path: Path, assets: Path, **suite) -> Path:
    tasks = write_tasks(tmp_path / "tasks", suite.pop("extra", None))
    entry = {
        "name": "general",
        "lm_eval": ["t_choice", "t_greedy"],
        "include_path": str(tasks),
        "batch_size": 4,
        **suite,
    }
    sets = [{"name": "heldout", "path": str(assets / "eval.parquet"), "n": 2}, entry]
    return write_config(tmp_path, assets, data={"eval": sets})


def test_suites_are_written_beside_the_sets_and_kept_apart(tmp_path, tiny_assets):
    cfg = load_config(suite_config(tmp_path, tiny_assets, limit=3))
    assert [e.name for e in cfg.data.eval] == ["heldout"]
    (suite,) = cfg.data.lm_eval
    assert suite.lm_eval == ["t_choice", "t_greedy"] and suite.limit == 3
    assert cfg.data.evaluates
    again = RunConfig.from_json(cfg.to_json())  # what every pipeline task is given
    assert again.data.lm_eval == cfg.data.lm_eval and again.data.eval == cfg.data.eval
    # the eval_sets pipeline parameter (rlvr schedule, the KFP UI) takes both kinds as well
    sets = json.dumps([{"name": "x", "lm_eval": ["t_greedy"], "num_fewshot": 0}])
    swapped = effective_config(cfg.to_json(), eval_sets=sets)
    assert swapped.data.eval == [] and swapped.data.lm_eval[0].lm_eval == ["t_greedy"]
    assert swapped.data.evaluates
    path = tmp_path / "config.yaml"
    for bad, message in (
        ("data.eval.1.limit=1.5", "a fraction is below 1"),
        ("data.eval.0.name=lm_eval", "names the standard-benchmark results"),
        ("data.eval.1.name=heldout", "names must be unique"),
        ("data.eval.1.fewshot_as_multiturn=true", "needs apply_chat_template"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(path, overrides=[bad])
    twice = "data.eval=[{name: a, lm_eval: [t_choice]}, {name: b, lm_eval: [t_choice]}]"
    with pytest.raises(ConfigError, match="in two suites"):
        load_config(path, overrides=[twice])


def test_check_names_an_unknown_task_and_data_out_of_reach(tmp_path, tiny_assets):
    """`rlvr check` resolves every task before anything trains: an unknown name comes with its
    closest match; a task whose data is on the Hub (unreachable here: HF_HUB_OFFLINE, set for
    the tests) or a missing local file is named with the fix; exit 2."""
    hub = {**CHOICE, "task": "t_hub", "dataset_path": "someone/only-on-the-hub"}
    hub.pop("dataset_kwargs")
    missing = {**GREEDY, "task": "t_missing", "dataset_kwargs": {"data_files": "data/nope.jsonl"}}
    path = suite_config(tmp_path, tiny_assets, extra=hub)
    (tmp_path / "tasks" / "t_missing.yaml").write_text(yaml.safe_dump(missing))
    sets = yaml.safe_load(path.read_text())
    sets["data"]["eval"][1]["lm_eval"] = ["t_choise", "t_hub", "t_missing", "t_greedy"]
    path.write_text(yaml.safe_dump(sets))
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "no lm-eval task, group or tag named 't_choise'; closest: t_choice" in out
    assert "task t_hub loads the dataset 'someone/only-on-the-hub' from the Hugging Face Hub" in out
    assert "HF_HUB_OFFLINE" in out and "include_path" in out
    assert "task t_missing reads data/nope.jsonl, which does not exist" in out
    assert "3 problems" in out  # t_greedy is fine
    # what needs no inputs (as compile and submit check): the names only
    offline = CliRunner().invoke(main, ["check", str(path), "--offline"])
    assert offline.exit_code == 2 and "t_choise" in offline.output
    assert "t_hub" not in offline.output and "nope.jsonl" not in offline.output


def test_check_follows_lm_evals_groups_and_tags_to_their_data():
    """A group (mmlu: groups of tags of 57 tasks) and a tag (ai2_arc) resolve to their tasks;
    a Hub dataset out of reach is one problem, not one per task."""
    from components.core.errors import Problems
    from components.evaluate.lm_eval_suite import check_suites

    cfg = RunConfig.model_validate(
        {
            "model": {"base": "x"},
            "data": {"train": "x", "eval": [{"name": "std", "lm_eval": ["mmlu", "ai2_arc"]}]},
        }
    )
    problems = Problems()
    check_suites(cfg, problems)
    texts = [str(p) for p in problems.errors]
    assert len(texts) == 2, texts
    assert "mmlu: 57 tasks (" in texts[0] and "'cais/mmlu'" in texts[0]
    assert "ai2_arc: 2 tasks (arc_challenge, arc_easy) load" in texts[1]
    assert "'allenai/ai2_arc'" in texts[1]


DISTRIBUTED_ENV = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
}


def _cli_results(model_args: str, tasks: Path, out: Path, batch_size: int = 4) -> dict:
    """What `lm_eval --model hf --model_args MODEL_ARGS --tasks ...` reports."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            f"{model_args},dtype=float32",
            "--tasks",
            "t_choice,t_greedy",
            "--include_path",
            str(tasks),
            "--batch_size",
            str(batch_size),
            "--output_path",
            str(out),
        ],
        cwd=tasks,  # relative data_files, as the stage resolves them
        capture_output=True,
        text=True,
        # a plain shell's environment: an in-process train step of an earlier test leaves
        # torch.distributed's variables set, and accelerate would join that group
        env={k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = out.rglob("results_*.json")
    return json.loads(path.read_text())["results"]


def test_results_equal_lm_evals_own_cli_and_land_everywhere(tmp_path, tiny_assets):
    """The evaluate stage's numbers are lm-eval's: its CLI on the same checkpoint gives the
    same accuracy, exact match and standard errors. They are in metrics.json (by task), in
    lm_eval.json (whole), in the manifest (lm-eval's and each task's version, sample counts),
    in report.md, in TensorBoard under eval/lm_eval/<task>/<metric>, and in `rlvr report`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from components.evaluate.local import evaluate_external

    cfg = load_config(suite_config(tmp_path, tiny_assets))
    result = evaluate_external(cfg, str(tiny_assets / "base"))
    root = Path(result["root"])
    evals = root / "evals" / "00000"
    top = json.loads((evals / "metrics.json").read_text())
    cli = _cli_results(f"pretrained={tiny_assets / 'base'}", tmp_path / "tasks", tmp_path / "cli")
    for task, metric in (("t_choice", "acc"), ("t_greedy", "exact_match")):
        ours = top["lm_eval"][task]["metrics"]
        assert ours[metric] == pytest.approx(cli[task][f"{metric},none"], abs=1e-12)
        assert ours[f"{metric}_stderr"] == pytest.approx(
            cli[task][f"{metric}_stderr,none"], abs=1e-12
        )
    assert top["lm_eval"]["t_choice"]["n_samples"] == {"original": 6, "effective": 6}
    assert top["lm_eval"]["t_choice"]["version"] == 2.0 and top["lm_eval_version"] == "0.4.13"
    whole = json.loads((evals / "lm_eval.json").read_text())
    assert set(whole) == {"general"} and whole["general"]["seconds"] > 0
    stats = read_manifest_stats(evals)
    assert stats["lm_eval"]["lm_eval_version"] == "0.4.13"
    assert stats["lm_eval"]["tasks"]["t_greedy"]["n_samples"]["effective"] == 4
    assert stats["timeline"]["seconds"]["lm_eval"] > 0
    assert "## Standard benchmarks (lm-evaluation-harness)" in (evals / "report.md").read_text()

    (events,) = (root / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    (scalar,) = acc.Scalars("eval/lm_eval/t_choice/acc")
    assert scalar.value == pytest.approx(top["lm_eval"]["t_choice"]["metrics"]["acc"], abs=1e-6)
    assert "eval/lm_eval/t_greedy/exact_match_ci95_hi" in acc.Tags()["scalars"]

    report = CliRunner().invoke(main, ["report", str(root)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert "standard benchmarks" in report.output and "t_greedy" in report.output
    html = (root / "report" / "index.html").read_text()
    assert "Standard benchmarks" in html and "t_choice/acc" in html


def read_manifest_stats(uri: Path) -> dict:
    from components.core.commit import read_manifest
    from components.core.store import get_store

    return read_manifest(get_store(str(uri)), str(uri))["stats"]


def test_a_warm_worker_hands_its_own_model_to_lm_eval(tmp_path, tiny_assets):
    """No second load: lm-eval's adapter wraps the model the engine holds; and an unchanged
    evaluation is not run again, while a changed task file makes it stale."""
    from components.core.timing import Timeline
    from components.evaluate.lm_eval_suite import _policy
    from components.evaluate.lm_eval_suite import adapter as lm_adapter
    from components.evaluate.stage import EvaluateStage
    from components.model import run_setup

    cfg = load_config(suite_config(tmp_path, tiny_assets))
    run_setup.run(cfg)
    stage = EvaluateStage(cfg)
    try:
        stage._load(0, Timeline("evaluate", 0))
        model, _ = _policy(stage.engine, stage.store, stage.layout.checkpoint(0), stage.task)
        assert model is stage.engine.backend.model
        assert lm_adapter(model, stage.engine.tokenizer, cfg.data.lm_eval[0]).model is model
        stage.step(0, timeline=Timeline("evaluate", 0))
        assert stage.up_to_date(0)
        tasks = tmp_path / "tasks"
        (tasks / "__pycache__").mkdir()  # Python's caches (a `!function` task's) change nothing
        (tasks / "__pycache__" / "utils.cpython-311.pyc").write_bytes(b"cache")
        assert stage.up_to_date(0)
        data = tasks / "data" / "greedy.jsonl"  # the data a task reads
        data.write_text(data.read_text() + json.dumps({"question": "1*1=", "target": "1"}) + "\n")
        assert not stage.up_to_date(0)
        stage.step(0, timeline=Timeline("evaluate", 0))
        yaml_path = tasks / "t_greedy.yaml"  # a task's definition
        spec = yaml.safe_load(yaml_path.read_text())
        spec["generation_kwargs"]["max_gen_toks"] = 5
        yaml_path.write_text(yaml.safe_dump(spec))
        assert not stage.up_to_date(0)
    finally:
        stage.close()


def test_figures_dashboard_and_regression_panel():
    from components.core.figures import eval_figures
    from components.report.dashboard import render_html
    from components.report.dynamics import Dynamics
    from components.report.dynamics_plots import family_panels

    def top(p1: float, acc: float) -> dict:
        return {
            "sets": {"heldout": {"overall": {"pass@1": p1}}},
            "lm_eval": {"t_choice": {"metrics": {"acc": acc, "acc_stderr": 0.05}}},
        }

    figs = eval_figures(top(0.2, 0.6))
    assert figs["eval/lm_eval/t_choice/acc"] == 0.6
    assert figs["eval/lm_eval/t_choice/acc_ci95_lo"] == pytest.approx(0.6 - 1.96 * 0.05)
    assert figs["eval/lm_eval/t_choice/acc_stderr"] == 0.05
    dyn = Dynamics()
    dyn.add(0, eval_figures(top(0.2, 0.6)))
    dyn.add(2, eval_figures(top(0.5, 0.55)))
    panels = family_panels(dyn, "eval")
    (panel,) = [p for p in panels if p.title == "standard benchmark: t_choice"]
    assert panel.lines == ("eval/lm_eval/t_choice/acc", "eval/heldout/pass@1")
    assert panel.labels == ("acc", "heldout pass@1 (trained task)")
    assert all("lm_eval" not in p.title for p in panels if p is not panel)
    html = render_html(dyn, "r", "/runs/r", {})
    assert "Standard benchmarks" in html and "(-0.0500)" in html
    assert html.count("<h3>lm_eval</h3>") == 0  # not taken for a held-out set


def test_schedule_submits_an_eval_pipeline_carrying_the_suite(
    tmp_path,
    tiny_assets,
    kfp_server,  # noqa: F811 - the fixture imported above
):
    path = suite_config(tmp_path, tiny_assets)
    result = CliRunner().invoke(
        main, ["schedule", str(path), "--host", kfp_server.url, "--cron", "0 0 */6 * * *"]
    )
    assert result.exit_code == 0, result.output
    (rr,) = kfp_server.posts("/apis/v2beta1/recurringruns")
    spec = rr["pipeline_spec"]["pipeline_spec"]
    assert spec["pipelineInfo"]["name"] == "rlvr-eval"
    config_json = spec["root"]["inputDefinitions"]["parameters"]["config_json"]["defaultValue"]
    cfg = effective_config(config_json)  # what the evaluate task runs with
    assert cfg.data.lm_eval[0].lm_eval == ["t_choice", "t_greedy"]


def test_a_lora_checkpoint_is_its_base_with_the_adapter_as_lm_eval_loads_it(tmp_path, tiny_assets):
    """A LoRA run's checkpoint: the worker's PEFT model goes to lm-eval, and the numbers equal
    lm-eval's CLI with `pretrained=BASE,peft=ADAPTER`."""
    from components.core.layout import RunLayout
    from components.evaluate.stage import run as evaluate
    from components.generate.stage import run as generate
    from components.model import run_setup
    from components.train.stage import run as train
    from components.verify.stage import run as verify

    plugin = tmp_path / "odd_length.py"  # rewards that differ within a group: a gradient
    plugin.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
        "\n    return float(len(solution_str) % 2)\n"
    )
    path = suite_config(tmp_path, tiny_assets)
    raw = yaml.safe_load(path.read_text())
    raw["model"]["lora"] = {"rank": 2, "alpha": 4.0}
    raw["verify"]["rewards"] = {"arithmetic": f"{plugin}:compute_score"}
    raw["train"].update({"lr": 5e-2, "micro_batch_tokens": 512})
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    layout = RunLayout.of(cfg)
    run_setup.run(cfg)
    generate(cfg, 0)
    verify(cfg, 0)
    train(cfg, 0)
    evaluate(cfg, 1)
    ckpt = Path(layout.checkpoint(1))
    assert (ckpt / "adapter_model.safetensors").exists()
    top = json.loads(Path(layout.evals(1), "metrics.json").read_text())
    cli = _cli_results(
        f"pretrained={layout.checkpoint(0)},peft={ckpt}", tmp_path / "tasks", tmp_path / "cli"
    )
    for task, metric in (("t_choice", "acc"), ("t_greedy", "exact_match")):
        ours = top["lm_eval"][task]["metrics"][metric]
        assert ours == pytest.approx(cli[task][f"{metric},none"], abs=1e-12)


def test_a_config_of_suites_alone_evaluates_and_reports(tmp_path, tiny_assets):
    """No held-out set, only standard benchmarks: the evaluation, its tables and the run
    report (which draws pass@1 plots only where there is pass@1) all work."""
    from components.evaluate.local import evaluate_external
    from components.report.run_report import write_run_report

    path = suite_config(tmp_path, tiny_assets)
    raw = yaml.safe_load(path.read_text())
    raw["data"]["eval"] = raw["data"]["eval"][1:]
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.data.eval == [] and cfg.data.evaluates
    result = evaluate_external(cfg, str(tiny_assets / "base"))
    top = json.loads((Path(result["root"]) / "evals/00000/metrics.json").read_text())
    assert (
        top["sets"] == {}
        and "overall" not in top
        and set(top["lm_eval"])
        == {
            "t_choice",
            "t_greedy",
        }
    )
    from components.core.store import get_store

    paths = write_run_report(get_store(result["root"]), result["root"])
    assert "index.html" in paths
    report = CliRunner().invoke(main, ["report", result["root"]], catch_exceptions=False)
    assert report.exit_code == 0 and "t_greedy" in report.output


def test_a_suite_runs_on_every_kth_evaluated_checkpoint_and_the_first_and_last():
    from components.core.lineages import suites_due

    cfg = RunConfig.model_validate(
        {
            "run": {"iterations": 13},
            "model": {"base": "x"},
            "data": {
                "train": "x",
                "eval": [
                    {"name": "a", "lm_eval": ["t1"], "every": 3},
                    {"name": "b", "lm_eval": ["t2"]},
                ],
            },
            "evaluate": {"every": 2},
        }
    )
    due = {c: [s.name for s in suites_due(cfg, c)] for c in range(14)}
    assert [c for c in due if "a" in due[c]] == [0, 6, 12, 13]  # 13: the last checkpoint
    assert all("b" in names for names in due.values())  # every: 1 runs on any checkpoint
