"""What an lm-eval suite's results depend on besides the checkpoint, read from its task directory.

The planner and the evaluate stage digest a suite's settings and files to decide whether its
committed results are current (components/core/lineages.py); the local Docker runner mounts the
data files its YAMLs name outside the directory. Both read the files only: lm-eval is not
imported.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

from components.core.config import LmEvalSetConfig

__all__ = ["data_files", "data_paths", "suite_inputs"]


def data_files(cfg: dict[str, Any]) -> list[str]:
    """The `data_files` a task config names (`dataset_kwargs.data_files`: a path, a list or
    a split -> paths mapping)."""
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        return [f for v in files.values() for f in ([v] if isinstance(v, str) else list(v))]
    if isinstance(files, list):
        return [str(f) for f in files]
    return []


def suite_inputs(suite: LmEvalSetConfig) -> dict[str, Any]:
    """What a suite's results depend on besides the checkpoint: its settings and the content of
    its task directory and of the local data files its YAMLs name (also outside it). lm-eval's
    version is recorded with the results, not here: a planner with another lm-eval than the
    evaluate image's would otherwise never find a committed evaluation current."""
    settings = suite.model_dump(mode="json", exclude={"include_path"})
    if suite.include_path is not None:
        root = Path(suite.include_path)
        settings["include_digest"] = _files_digest(root, _task_files(root))
    return settings


def _task_files(root: Path) -> list[Path]:
    """The files of a task directory (not Python's caches or hidden files), and the local
    `data_files` its YAMLs name, relative paths taken from the directory."""
    files = {
        p
        for p in root.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }
    for yml in [p for p in files if p.suffix in (".yaml", ".yml")]:
        try:
            cfg = yaml.load(yml.read_text(), Loader=_TaggedLoader)  # noqa: S506 - tags ignored
        except yaml.YAMLError:
            continue
        if isinstance(cfg, dict):
            for f in data_files(cfg):
                path = root / f
                if "://" not in f and path.is_file():
                    files.add(path.resolve())
    return sorted(files)


class _TaggedLoader(yaml.SafeLoader):
    """A safe loader that reads lm-eval's `!function module.name` tags as plain strings."""


_TaggedLoader.add_multi_constructor("!", lambda loader, tag, node: str(node.value))


def data_paths(suite: LmEvalSetConfig) -> list[str]:
    """Local files a suite reads outside its task directory (what a container must mount)."""
    if suite.include_path is None:
        return []
    root = Path(suite.include_path).resolve()
    return [str(p) for p in _task_files(Path(suite.include_path)) if root not in p.parents]


def _files_digest(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        # relative also outside the directory (../data/x.jsonl): a moved checkout stays current
        h.update(os.path.relpath(path, root).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
