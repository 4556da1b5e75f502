"""Every path under a run comes from components/core/layout.py (RunLayout): no other module
spells a run directory or zero-pads an index into a path.

The scan reads the syntax tree of components/ and pipelines/ and fails on a string, outside
layout.py and outside docstrings, that spells a run path:

- a run directory's name as a part given to `join` or to a `Path` `/`;
- a path whose first part is a run directory (`"status/channel/train.json"`, `"/tensorboard"`);
- a path that ends in a hand-numbered part (`+ "/00000"`), or a `:05d` field in a path (a
  `join` part, or a field beside a `/` in an f-string);
- a run directory's name in a tuple, list or set, or compared with (a reader parsing the
  layout by hand).

Names inside one artifact (`shard-00000-of-00002`, `part-00000.parquet`, a state file) are the
writer's; a `:05d` label in a message is a label. Neither is a run path."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ["components", "pipelines"]
LAYOUT = ROOT / "components" / "core" / "layout.py"

#: The run's directories (docs/contracts.md, "Run layout").
RUN_DIRS = {
    "run.yaml",
    "data",
    "checkpoints",
    "iterations",
    "train_state",
    "evals",
    "eval_shards",
    "eval_scratch",
    "report",
    "tensorboard",
    "status",
    "logs",
    "kfp",
}
#: Names that are a run directory and nothing else: a reader that lists them parses the layout.
ONLY_DIRS = {"checkpoints", "train_state", "evals", "eval_shards", "eval_scratch", "prompt_stats"}


def _padded_field(v: ast.AST) -> bool:
    """`{i:05d}`."""
    return (
        isinstance(v, ast.FormattedValue)
        and isinstance(v.format_spec, ast.JoinedStr)
        and "".join(c.value for c in v.format_spec.values if isinstance(c, ast.Constant)) == "05d"
    )


def _padded(node: ast.AST) -> bool:
    """An f-string with a `:05d` field."""
    return isinstance(node, ast.JoinedStr) and any(_padded_field(v) for v in node.values)


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _padded_beside_slash(node: ast.AST) -> bool:
    """An f-string with a `:05d` field next to a `/`: `f"{i:05d}/{kind}"`."""
    if not isinstance(node, ast.JoinedStr):
        return False
    v = node.values
    return any(
        _padded_field(x)
        and (
            (k > 0 and (_text(v[k - 1]) or "").endswith("/"))
            or (k + 1 < len(v) and (_text(v[k + 1]) or "").startswith("/"))
        )
        for k, x in enumerate(v)
    )


def _path_part(node: ast.AST, padded: bool) -> str | None:
    """Why `node`, a part given to `join` (padded: a `:05d` field counts) or to a `Path` `/`,
    spells a run path (None: it doesn't)."""
    text = _text(node)
    if text is not None and text.strip("/").split("/")[0] in RUN_DIRS:
        return f"run directory {text!r}"
    if padded and _padded(node):
        return "a :05d field in a path"
    return None


def _is_join(call: ast.Call) -> bool:
    """`join(...)`, `store.join(...)`, `os.path.join(...)`; not `", ".join(...)`."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id == "join"
    return isinstance(f, ast.Attribute) and f.attr == "join" and _text(f.value) is None


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if _text(body[0].value) is not None:
                out.add(id(body[0].value))
    # an attribute's docstring: a string statement anywhere
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and _text(node.value) is not None:
            out.add(id(node.value))
    return out


def _violations(node: ast.AST, skip: set[int]) -> list[str]:
    """Why `node` alone spells a run path."""
    out = []
    if isinstance(node, ast.Call) and _is_join(node):
        out += [w for a in node.args if (w := _path_part(a, True))]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        out += [w for a in (node.left, node.right) if (w := _path_part(a, False))]
    text = _text(node)
    if text is not None and id(node) not in skip:
        head = text.lstrip("/").split("/")[0]
        if "/" in text and head in RUN_DIRS:
            out.append(f"a path under run directory {head!r}: {text!r}")
        if text.startswith("/0") and text[1:].isdigit():
            out.append(f"a hand-numbered path: {text!r}")
    if _padded_beside_slash(node):
        out.append("a :05d field in a path")
    if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Compare):
        parts = node.elts if not isinstance(node, ast.Compare) else [node.left, *node.comparators]
        out += [
            f"run directory {_text(e)!r} parsed by hand" for e in parts if _text(e) in ONLY_DIRS
        ]
    return out


def scan(path: Path) -> list[str]:
    """`path:line: why` for every run path spelled in `path`."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    return [
        f"{rel}:{node.lineno}: {why}" for node in ast.walk(tree) for why in _violations(node, skip)
    ]


def test_no_run_path_is_spelled_outside_the_layout():
    found = [
        v
        for tree in SOURCE
        for p in sorted((ROOT / tree).rglob("*.py"))
        if p != LAYOUT
        for v in scan(p)
    ]
    assert not found, (
        "run paths spelled outside components/core/layout.py; name each in RunLayout and call "
        f"it: {found}"
    )


def test_the_scan_sees_each_kind_of_hand_built_run_path(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "\n".join(
            [
                'a = join(root, "checkpoints")',
                'b = join(root, "evals", f"{c:05d}")',
                'c = uri.rsplit("/", 1)[0] + "/00000"',
                'd = "status/channel/train.json"',
                'e = root + "/tensorboard"',
                'f = local / "logs" / f"segment-{i:05d}"',
                'g = f"{i:05d}/{kind}"',
                'h = parts[1] in ("checkpoints", "train_state")',
            ]
        )
    )
    lines = {int(v.split(":")[1]) for v in scan(src)}
    assert lines == set(range(1, 9))


def test_the_scan_passes_labels_artifact_names_and_docstrings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "\n".join(
            [
                'def f():\n    """Reads `<run>/checkpoints/00000`."""',
                'a = f"checkpoint {c:05d}"',
                'b = f"shard-{k:05d}-of-{n:05d}"',
                'b2 = tmp / f"part-{k:05d}.parquet"',
                'b3 = f"from {c:05d}.</p>"',
                'b4 = "the run\'s checkpoints/00000 beside it"',
                'c = join(uri, "metrics.json")',
                'd = ", ".join(names)',
                'e = {"checkpoints": done}',
                'g = "train/loss"',
            ]
        )
    )
    assert scan(src) == []
