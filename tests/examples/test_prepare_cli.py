"""examples/prepare_cli.py: the demos' prepare command line (flags over a settings dataclass)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from examples.prepare_cli import prepare_main


@pytest.fixture(autouse=True)
def _restore_process_settings():
    """prepare_main sets torch's thread count and DS_ACCELERATOR for the process it runs in:
    both go back for the tests after these."""
    threads, accelerator = torch.get_num_threads(), os.environ.pop("DS_ACCELERATOR", None)
    yield
    torch.set_num_threads(threads)
    os.environ.pop("DS_ACCELERATOR", None)
    if accelerator is not None:
        os.environ["DS_ACCELERATOR"] = accelerator


@dataclass
class Settings:
    seed: int = 0
    lr: float = 1e-3
    target: float | None = None
    name: str = "demo"
    threads: int = 1


def test_flags_override_the_defaults_and_the_rest_keep_theirs(tmp_path):
    got = []
    prepare_main(
        lambda out, s: got.append((out, s)),
        Settings(name="kept"),
        description="d",
        argv=["--out", str(tmp_path), "--seed", "3", "--target", "0.25"],
        flags=("seed", "lr", "target"),
    )
    assert got == [(tmp_path, Settings(seed=3, lr=1e-3, target=0.25, name="kept"))]
    assert isinstance(got[0][0], Path)
    assert os.environ["DS_ACCELERATOR"] == "cpu" and torch.get_num_threads() == 1


def test_every_field_gets_a_flag_where_none_are_named(tmp_path):
    got = []
    prepare_main(
        lambda out, s: got.append(s),
        Settings(),
        description="d",
        argv=["--out", str(tmp_path), "--name", "x", "--lr", "0.5"],
    )
    assert got == [Settings(lr=0.5, name="x")]


def test_a_flag_not_offered_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_main(
            lambda out, s: None,
            Settings(),
            description="d",
            argv=["--out", str(tmp_path), "--name", "x"],
            flags=("seed",),
        )
    assert e.value.code == 2 and "--name" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module, argv, want, threads, task",
    [
        (
            "examples.arithmetic.prepare",
            ["--max-steps", "5", "--target", "0.2", "--label-smoothing", "0.2"],
            {"max_steps": 5, "target": 0.2, "label_smoothing": 0.2},
            1,
            "ARITHMETIC",
        ),
        (
            "examples.arithmetic_code.prepare",
            ["--seed", "2"],
            {"seed": 2, "max_steps": 1500},
            2,
            "CODE",
        ),
        (
            "examples.vision_count.prepare",
            ["--n-dev", "7", "--lr", "0.01", "--label-smoothing", "0"],
            {"n_dev": 7, "lr": 0.01, "label_smoothing": 0.0},
            1,
            None,
        ),
        (
            "examples.tool_arithmetic.prepare",
            ["--tool-share", "0.5", "--max-turns", "3"],
            {"tool_share": 0.5, "max_turns": 3},
            2,
            None,
        ),
    ],
)
def test_each_demo_parses_its_flags(monkeypatch, tmp_path, module, argv, want, threads, task):
    """Each demo's `main` hands its prepare the settings its flags give, its task (the code
    demo: CODE), on at most its thread count (prepare itself is replaced: it would build the
    demo)."""
    import importlib

    cores = torch.get_num_threads()
    mod = importlib.import_module(module)
    target = importlib.import_module(module.replace("arithmetic_code", "arithmetic"))
    got = []

    def fake(out, settings, *rest):
        got.append((out, settings, rest, torch.get_num_threads()))

    monkeypatch.setattr(target, "prepare", fake)
    mod.main(["--out", str(tmp_path), *argv])
    ((out, settings, rest, used),) = got
    assert out == tmp_path
    assert {k: getattr(settings, k) for k in want} == want
    assert used == min(cores, threads)
    assert rest == ((getattr(mod, task),) if task else ())
