"""The shape of the code: functions short enough to name each step, and comments that say what
and why (history and measurements belong in docs/ or the benchmark that made them).

A function in components/ or pipelines/ longer than MAX_LINES (its def line to its last line)
fails the build unless it is listed in EXCEPTIONS with the reason it reads better whole. The
list is checked too: an entry for a function that is gone, or short again, is stale."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
SOURCE = ["components", "pipelines"]

#: "path::qualified name" -> why it stays longer than MAX_LINES. Empty: every function fits.
EXCEPTIONS: dict[str, str] = {}

# Markers of work tracked elsewhere: a reader of the code cannot see the tracker.
MARKERS = re.compile(r"\b(issue\s+#?\d+|in\s+progress)\b", re.IGNORECASE)
MARKED_TREES = ["components", "pipelines", "tests", "benchmarks", "examples", "images", "docs"]


def _functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, length in lines) of every function and method in `path`."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                out.append((name, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")

    walk(ast.parse(path.read_text()), "")
    return out


def _lengths() -> dict[str, int]:
    return {
        f"{p.relative_to(ROOT).as_posix()}::{name}": n
        for tree in SOURCE
        for p in sorted((ROOT / tree).rglob("*.py"))
        for name, n in _functions(p)
    }


def test_no_function_is_longer_than_the_limit_unless_listed_with_a_reason():
    long = {k: n for k, n in _lengths().items() if n > MAX_LINES and k not in EXCEPTIONS}
    assert not long, (
        f"functions over {MAX_LINES} lines: {long}; break them into named steps, or list one "
        "in EXCEPTIONS with the reason it reads better whole"
    )


def test_every_listed_exception_is_still_one():
    lengths = _lengths()
    stale = [k for k in EXCEPTIONS if lengths.get(k, 0) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): remove {stale}"
    assert all(reason.strip() for reason in EXCEPTIONS.values())


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    src = tmp_path / "m.py"
    src.write_text(f"class A:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert dict(_functions(src))["A.f"] == MAX_LINES + 1


def test_no_tracker_markers_in_code_tests_or_docs():
    this = Path(__file__).resolve()
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"] + [
        p
        for tree in MARKED_TREES
        for p in sorted((ROOT / tree).rglob("*"))
        if p.suffix in {".py", ".md", ".yaml", ".sh", ".txt"}
        and p.resolve() != this
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)  # builds
    ]
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}"
        for p in files
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if MARKERS.search(line)
    ]
    assert not found, f"say what and why instead: {found[:10]}"
