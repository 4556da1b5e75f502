"""The README and docs as written: every install line names an extra that exists,
every `rlvr` command they show parses, every script and module they name is there, and every
count they state is the count in the code.

A new user copies these lines; a line that drifted from the code costs them the first hour.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines import local
from pipelines.cli import main
from pipelines.local import tensorboard_hint

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("examples/*/README.md")),
]
# every file a user reads an install hint in: docs, the benchmarks' docstrings, messages and
# skip reasons (components/train/ is another change's; its LoRA hint is listed there)
HINTED = [
    *DOCS,
    *sorted(ROOT.glob("benchmarks/*.py")),
    *sorted(ROOT.glob("tests/**/*.py")),
    *sorted(ROOT.glob("pipelines/*.py")),
    *sorted(ROOT.glob("examples/**/*.py")),
    *(
        p
        for p in sorted(ROOT.glob("components/**/*.py"))
        if "components/train/" not in p.as_posix()
    ),
]


def _extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"]["optional-dependencies"])


def _code(text: str) -> list[str]:
    """Every command-like piece of a Markdown file: the lines of fenced blocks and inline code."""
    pieces: list[str] = []
    for i, block in enumerate(re.split(r"^```.*$", text, flags=re.M)):
        if i % 2:
            pieces += block.splitlines()
        else:
            pieces += re.findall(r"`([^`\n]+)`", block.replace("\n", " "))
    return pieces


def _rlvr_commands() -> list[tuple[str, list[str]]]:
    """(file, argv) of every `rlvr SUBCOMMAND ...` the docs show."""
    found = []
    for path in DOCS:
        for piece in _code(path.read_text()):
            piece = piece.split("#", 1)[0]
            for part in re.split(r"&&|;|\|\|", piece):
                words = part.split()
                if len(words) >= 2 and words[0] == "rlvr" and re.fullmatch(r"[a-z]+", words[1]):
                    found.append((path.name, words[1:]))
    return found


def test_every_install_line_names_an_extra_that_exists():
    extras, bad = _extras(), []
    for path in HINTED:
        text = path.read_text()
        for m in re.finditer(r"pip install[^\n]*?(\S*)\[([a-z0-9_,-]+)\]", text):
            target, names = m.group(1).strip("'\""), m.group(2).split(",")
            if target.startswith("rlvr") or "rlvr[" in m.group(0):
                bad.append(
                    f"{path.name}: {m.group(0)!r}: rlvr is installed from the repository "
                    '(pip install -e ".[EXTRA]"), not from an index'
                )
            for name in names:
                if target.endswith(".") and name not in extras:
                    bad.append(f"{path.name}: {m.group(0)!r}: no extra {name!r} in pyproject.toml")
    assert not bad, "\n".join(bad)


def test_the_bench_extra_covers_what_the_benchmarks_import():
    import importlib.util

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = (
        pyproject["project"]["dependencies"]
        + pyproject["project"]["optional-dependencies"]["bench"]
    )
    declared = {Requirement(d).name.replace("-", "_").lower() for d in deps}
    declared |= {"yaml", "kfp", "vllm"}  # pyyaml's module; vllm: its own extra (CUDA only)
    stdlib = __import__("sys").stdlib_module_names
    ours = {"components", "pipelines", "examples", "benchmarks", "tests"}
    missing = set()
    for path in ROOT.glob("benchmarks/*.py"):
        text = path.read_text()
        for m in re.finditer(r"^\s*(?:import (\w+)|from (\w+)[\w.]* import)", text, re.M):
            name = m.group(1) or m.group(2)
            if name not in stdlib and name not in ours and name.lower() not in declared:
                if importlib.util.find_spec(name) is None or name in {"trl", "math_verify"}:
                    missing.add(f"{path.name}: {name}")
    assert not missing, sorted(missing)


def test_every_rlvr_command_in_the_docs_exists_and_parses():
    commands = _rlvr_commands()
    assert len(commands) > 30  # the parser still finds them
    names = set(main.commands)
    unknown = sorted({f"{f}: rlvr {argv[0]}" for f, argv in commands if argv[0] not in names})
    assert not unknown, unknown
    runner = CliRunner()
    for sub in sorted({argv[0] for _, argv in commands}):
        out = runner.invoke(main, [sub, "--help"])
        assert out.exit_code == 0, (sub, out.output)
    # every option a shown command uses is one the subcommand has
    bad = []
    for f, argv in commands:
        params = main.commands[argv[0]].params
        if argv[0] == "stage" and len(argv) > 1:
            argv = argv[1:]
        options = {o for p in params for o in (*p.opts, *p.secondary_opts)}
        for word in argv[1:]:
            flag = word.split("=", 1)[0].strip("[]")
            if flag.startswith("-") and flag not in options and not flag.startswith("--set"):
                bad.append(f"{f}: rlvr {' '.join(argv)}: no option {flag}")
    assert not bad, "\n".join(bad)


def test_every_script_and_module_the_docs_name_exists():
    missing = []
    for path in DOCS:
        text = path.read_text()
        for rel in set(
            re.findall(r"\b((?:benchmarks|tests|images|examples)/[\w/.-]+\.(?:py|sh|yaml))", text)
        ):
            if not (ROOT / rel).exists():
                missing.append(f"{path.name}: {rel}")
        for mod in set(re.findall(r"python -m ((?:components|examples|pipelines)[\w.]*\w)", text)):
            if (
                not (ROOT / mod.replace(".", "/")).with_suffix(".py").exists()
                and not (ROOT / mod.replace(".", "/") / "__main__.py").exists()
            ):
                missing.append(f"{path.name}: python -m {mod}")
    assert not missing, missing


def test_the_docs_count_the_bad_input_cases():
    from tests.e2e.test_bad_input import CASES

    usage = (ROOT / "docs/usage.md").read_text()
    stated = re.search(r"\((\d+) cases in `tests/e2e/test_bad_input.py`", usage)
    assert stated and int(stated.group(1)) == len(CASES), (stated and stated.group(1), len(CASES))
    rows = [
        line
        for line in (ROOT / "docs/errors.md").read_text().splitlines()
        if re.match(r"\| [a-z-]+/", line)
    ]
    assert sorted(r.split("|")[1].strip() for r in rows) == sorted(c[0] for c in CASES)


def test_the_run_says_how_to_get_the_tensorboard_program(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda _name: None)
    hint = tensorboard_hint("rlvr-runs/x/tensorboard")
    assert 'pip install -e ".[tensorboard]"' in hint and "tensorboard --logdir" in hint
    with local.console.capture() as printed:  # as `rlvr run` prints it: the extra kept
        local.print_tensorboard_hint("rlvr-runs/x/tensorboard")
    assert 'pip install -e ".[tensorboard]", then' in printed.get()
    assert "tensorboard" in _extras()
    monkeypatch.setattr(shutil, "which", lambda _name: "/usr/bin/tensorboard")
    assert "pip install" not in tensorboard_hint("rlvr-runs/x/tensorboard")


@pytest.mark.parametrize("line", ["pip install -e .", 'pip install -e ".[dev]"'])
def test_the_readme_install_lines_are_the_ones_ci_runs(line):
    """CI (.ci/run) runs the README's test install; the demo's is its prefix."""
    readme = (ROOT / "README.md").read_text()
    assert f"pip install torch==2.13.0 && {line} && " in readme
    ci = (ROOT / ".ci/run").read_text()
    assert "pip install --quiet torch==2.13.0" in ci and '-e ".[dev]"' in ci
    assert shlex.split(line)[:2] == ["pip", "install"]


def test_the_demo_figures_are_the_ones_readme_figures_checks():
    """benchmarks/readme_figures.py reads the demo rows of docs/benchmarks.md: they keep its
    form, a measurement like them agrees, one outside their noise fails, and --write's rows are
    read back as written; the README's headline states the same demo figure."""
    from benchmarks import readme_figures as rf

    readme = (ROOT / "docs/benchmarks.md").read_text()
    demo = rf.DEMO_RE.search(rf._row(readme, rf.DEMO_ROW))
    cost = rf.COST_RE.search(rf._row(readme, rf.COST_ROW))
    assert demo and cost
    base, final = float(demo.group(1)), float(demo.group(3))
    like = {
        "base": base,
        "base_ci": [base - 0.03, base + 0.03],
        "final": final,
        "final_ci": [final - 0.05, final + 0.05],
        "wall_s": float(demo.group(5)),
        "iteration_s": float(cost.group(3)),
        "startup_s": float(cost.group(5)),
        "fixed_share": float(cost.group(1)) / 100,
        "checkpoint": 12,
    }
    assert rf.compare(readme, like) == []
    drifted = {
        **like,
        "base": 0.12,
        "base_ci": [0.09, 0.14],
        "iteration_s": 4 * like["iteration_s"],
    }
    bad = rf.compare(readme, drifted)
    assert [b.split(":")[0] for b in bad] == ["base pass@1", "iteration"], bad
    assert rf.compare(readme, drifted, times=False)[0].startswith("base pass@1")
    rewritten = rf.rewrite(readme, drifted)
    assert rf.compare(rewritten, drifted) == [] and "0.120 -> " in rewritten
    assert rf.busy(2.0 * (os.cpu_count() or 1)) and not rf.busy(0.0)
    headline = f"held-out pass@1 {demo.group(1)} -> {demo.group(3)} in {demo.group(5)}-"
    front = (ROOT / "README.md").read_text()
    assert headline in front
    # --write keeps the README's headline with the rewritten row
    assert "held-out pass@1 0.120 -> " in rf.rewrite_headline(front, rewritten)


def test_ci_resolves_every_extra():
    """.ci/run dry-runs the install of every extra but vllm (CUDA only) and dev (installed)."""
    ci = (ROOT / ".ci/run").read_text()
    m = re.search(r'pip install --dry-run --quiet -e "\.\[([a-z,]+)\]"', ci)
    assert m and set(m.group(1).split(",")) == _extras() - {"vllm", "dev"}


FLOORED = ("torch", "transformers", "tokenizers", "kfp", "kfp-kubernetes")
"""The dependencies whose lowest declared release .ci/run's floors leg installs and tests."""


def test_ci_tests_every_declared_floor():
    """Every range is a tested range: pyproject's lower bound of each FLOORED dependency is
    what .ci/run's floors leg installs (its commands, not its comments), the leg's tests see
    them from any directory and count in CI's exit status, the README states each bound, and
    kfp's upper bounds are the kfp the images ship (with this run's kfp at one of the ends)."""
    import importlib.metadata

    from packaging.version import Version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ci = (ROOT / ".ci/run").read_text()
    readme = " ".join((ROOT / "README.md").read_text().split())
    body = re.search(r"^floors_install\(\) \{\n(.*?)^\}", ci, re.M | re.S)
    assert body, ".ci/run has no floors_install() for its floors leg"
    code = [
        line.split(" #")[0] for line in body[1].splitlines() if not line.lstrip().startswith("#")
    ]
    # the torch pin one argument, the others one each (unquoted: split into words)
    assert '"$floor_torch"' in " ".join(code) and "--target .floors $floor_pins" in " ".join(code)
    torch_pin = re.search(r"^floor_torch=(\S+)$", ci, re.M)
    other_pins = re.search(r'^floor_pins="([^"]*)"$', ci, re.M)
    assert torch_pin and other_pins, ".ci/run does not set floor_torch and floor_pins"
    commands = f"{torch_pin[1]} {other_pins[1]}"
    assert 'FLOOR_PINS="$floor_torch $floor_pins"' in ci  # the probe checks the same pins
    for name in FLOORED:
        (spec,) = [d for d in deps if re.match(rf"{name}\b\s*[<>=]", d)]
        low = re.match(rf"{name}\s*>=\s*([\d.]+)", spec)[1]
        pinned = re.search(rf"(?<![\w-]){name}==([\d.]+)", commands)
        assert pinned, f".ci/run's floors leg does not install {name}"
        assert Version(pinned[1]) == Version(low), (
            f"pyproject declares {spec}; the floors leg tests {name}=={pinned[1]}"
        )
        assert f"{name} >= {low}" in readme, f"README does not state {name} >= {low}"
    assert 'floors_path="$PWD/.floors"' in ci and "PYTHONPATH=$floors_path python -m pytest" in ci
    assert re.search(r"^exit \$\(\(.*\bfloors\b.*\)\)$", ci, re.M)
    image_kfp = re.search(
        r"^ARG KFP_VERSION=(\S+)$", (ROOT / "images/train/Dockerfile").read_text(), re.M
    )[1]
    for name in ("kfp", "kfp-kubernetes"):
        (spec,) = [d for d in deps if re.match(rf"{name}>=", d)]
        low, high = re.fullmatch(rf"{name}>=([\d.]+),<=([\d.]+)", spec).groups()
        assert high == image_kfp
        assert importlib.metadata.version(name) in (low, high)


@pytest.mark.slow
def test_the_readmes_bring_your_own_data_and_reward_runs(tmp_path, tiny_assets):
    """The README's "Bring your own data and reward", as written: its script makes the data,
    its config names the data and the reward, and `rlvr check` and `rlvr run` take them (with
    the tests' tiny base, of the demo base's tokenizer, for two iterations: the run's cost,
    not what it checks)."""
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", readme, flags=re.M | re.S)
    (script,) = [b for lang, b in blocks if lang == "python" and b.startswith("# my_task.py")]
    (config,) = [b for lang, b in blocks if lang == "yaml" and b.startswith("# my_run.yaml")]
    (tmp_path / "my_task.py").write_text(script)
    (tmp_path / "my_run.yaml").write_text(config)
    subprocess.run([sys.executable, "my_task.py"], cwd=tmp_path, check=True)
    assert (tmp_path / "train.parquet").exists() and (tmp_path / "eval.parquet").exists()
    rlvr = [sys.executable, "-m", "pipelines.cli"]
    sets = ["--set", f"model.base={tiny_assets / 'base'}", "--set", f"run.store={tmp_path}/runs"]
    check = subprocess.run(
        [*rlvr, "check", "my_run.yaml", *sets], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    run = subprocess.run(
        [*rlvr, "run", "my_run.yaml", *sets, "--skip-check", "--iterations", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    evals = tmp_path / "runs/sums/evals"
    assert (evals / "00002/_SUCCESS").exists() and "heldout" in run.stdout
