"""examples/prepare_cli.py: the demos' prepare command line (flags over a settings dataclass)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.prepare_cli import prepare_main


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
    "module, argv, want",
    [
        (
            "examples.arithmetic.prepare",
            ["--max-steps", "5", "--target", "0.2"],
            {"max_steps": 5, "target": 0.2},
        ),
        ("examples.arithmetic_code.prepare", ["--seed", "2"], {"seed": 2, "max_steps": 1500}),
        (
            "examples.vision_count.prepare",
            ["--n-dev", "7", "--lr", "0.01"],
            {"n_dev": 7, "lr": 0.01},
        ),
        ("examples.tool_arithmetic.prepare", ["--tool-share", "0.5"], {"tool_share": 0.5}),
    ],
)
def test_each_demo_parses_its_flags(monkeypatch, tmp_path, module, argv, want):
    """Each demo's `main` hands its prepare the settings its flags give (prepare itself is
    replaced: it would build the demo)."""
    import importlib

    mod = importlib.import_module(module)
    target = importlib.import_module(module.replace("arithmetic_code", "arithmetic"))
    got = []
    monkeypatch.setattr(target, "prepare", lambda out, s, *task: got.append((out, s)))
    mod.main(["--out", str(tmp_path), *argv])
    ((out, settings),) = got
    assert out == tmp_path
    assert {k: getattr(settings, k) for k in want} == want
