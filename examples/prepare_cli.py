"""The command line every demo's prepare step shares: `--out DIR` and one flag per setting.

    python -m examples.arithmetic.prepare --out /tmp/arith --seed 1 --max-steps 300

A demo passes its settings dataclass (the defaults), the settings that get a flag, and its
`prepare(out, settings)`; flags override the defaults, and the settings without a flag keep
theirs.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

Settings = TypeVar("Settings")


def flag_type(hint: Any) -> type:
    """The argparse type of a settings field: its own type, or the one that is not None in
    `float | None` (the flag then sets a value; the default stays None)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if args else hint
    if kind is bool:
        raise TypeError("a bool setting needs a store_true flag, not a typed one")
    return kind


def prepare_main(
    prepare: Callable[[Path, Settings], Any],
    defaults: Settings,
    *,
    description: str,
    argv: Sequence[str] | None = None,
    flags: Sequence[str] | None = None,
    threads: int = 1,
) -> Any:
    """Parse `--out` and a flag per name in `flags` (every field of `defaults` where None),
    then run `prepare(out, settings)` on the CPU with at most `threads` threads (the settings'
    own `threads` field where they have one)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    hints = typing.get_type_hints(type(defaults))
    for name in flags if flags is not None else [f.name for f in fields(defaults)]:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=flag_type(hints[name]),
            default=getattr(defaults, name),
        )
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    # The warm-up runs on the CPU; saving a checkpoint imports DeepSpeed (through transformers),
    # which otherwise warns "Setting accelerator to CPU. If you have GPU ..." on every CPU machine.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    settings = replace(defaults, **args)
    torch.set_num_threads(min(torch.get_num_threads(), getattr(settings, "threads", threads)))
    return prepare(out, settings)
