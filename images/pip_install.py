"""Install pinned packages on top of a base image without moving what the base already ships.

Every images/*/Dockerfile installs its Python packages through this script:

    python pip_install.py -c constraints.txt [--pip-arg ARG]... [--if-missing=PKG]... PKG [PKG...]

- Each PKG must be pinned (`name==version`) in the constraints file and is installed at that pin.
- An `--if-missing` package is installed at its pin only where the base lacks it, and otherwise
  held at the base's version like the rest of the base. One Dockerfile then serves both flavors:
  the GPU bases bring torch (and, for vLLM, transformers and friends), a bare Python base (the
  CPU flavor) gets them from the pins.
- With `--prune`, what the packages it added carry only for their own tests and for compiling
  against them is removed in the same layer: test suites (directories named tests / test, but
  for the few that run-time code imports: KEEP_TEST_DIRS) and
  torch's C++ headers and test binaries (the images have no compiler). The base's own packages
  are never touched.
- Every distribution already installed (the base image's torch, vLLM, CUDA wheels, numpy...) is
  handed to pip as a `name==installed-version` constraint. Resolving PKG's dependencies can add
  packages but never up- or downgrade one the base ships, so the GPU bases keep the set they were
  tested with; a genuine conflict fails the build with pip's resolver message instead of
  silently breaking vLLM or torch at run time.
- Pins in the constraints file that are neither requested nor in the base still apply to
  dependencies pip adds (botocore for boto3, say).
- Afterwards it checks that no base package changed version and prints what was added.

Standard library only: it runs in a bare base image before anything else is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

# PEP 440 public + local versions (the regex from the PEP's appendix, compacted). Base images
# occasionally carry distributions with versions pip refuses in a constraint; those are skipped
# rather than failing the build on a line we generated ourselves.
_PEP440 = re.compile(
    r"""^\s*v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$""",
    re.VERBOSE | re.IGNORECASE,
)
#: The installer's own tools are not part of the set a base was tested with, and packages
#: legitimately need newer ones (torch 2.13 needs setuptools >= 77; Debian's ensurepip gives a
#: venv 66): they are neither held nor reported as moved.
TOOLING = {"pip", "setuptools", "wheel"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)$")


def canonical(name: str) -> str:
    """PEP 503 normalised project name (`PyYAML` and `pyyaml` are the same project)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, tuple[str, str]]:
    """canonical name -> (name, version) for every `name==version` line; anything else is an
    error, because a range in this file would make image builds drift."""
    pins: dict[str, tuple[str, str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise ValueError(f"line {lineno}: {raw.strip()!r} is not an exact `name==version` pin")
        key = canonical(m.group(1))
        if key in pins:
            raise ValueError(f"line {lineno}: {m.group(1)} is pinned twice")
        pins[key] = (m.group(1), m.group(2))
    return pins


def installed_distributions() -> dict[str, tuple[str, str]]:
    """canonical name -> (name, version) of what the running interpreter has installed."""
    found: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            # The first hit on sys.path is the one Python imports, so it is the one to hold.
            found.setdefault(canonical(name), (name, dist.version))
    return found


def merged_constraints(
    pins: dict[str, tuple[str, str]],
    requested: list[str],
    base: dict[str, tuple[str, str]],
) -> tuple[list[str], list[str]]:
    """(constraint lines, warnings): requested names at their pin, base packages at their
    installed version, remaining pins as written."""
    wanted = {canonical(r) for r in requested}
    missing = sorted(r for r in requested if canonical(r) not in pins)
    if missing:
        raise ValueError(f"not pinned in the constraints file: {', '.join(missing)}")
    lines: dict[str, str] = {}
    warnings: list[str] = []
    for key, (name, version) in base.items():
        if key in wanted or key in TOOLING:
            continue
        if not _PEP440.match(version):
            warnings.append(f"base package {name} {version!r} is not a PEP 440 version; not held")
            continue
        lines[key] = f"{name}=={version}"
        if key in pins and pins[key][1] != version.split("+")[0]:  # 2.13.0+cpu is ==2.13.0
            warnings.append(
                f"{name}: keeping the base image's {version} (constraints file says {pins[key][1]})"
            )
    for key, (name, version) in pins.items():
        if key in wanted or key not in base:
            lines[key] = f"{name}=={version}"
    return [lines[k] for k in sorted(lines)], warnings


#: Dead weight at run time, by distribution, beyond test suites (paths relative to site-packages).
PRUNE_GLOBS = {"torch": ["torch/include", "torch/bin/test_*", "torch/bin/*Test"]}
TEST_DIRS = {"tests", "test"}
#: Test directories that run-time code imports, kept: numpy.testing (which scipy imports, and
#: through it scikit-learn, lm-eval's metrics and transformers) reads numpy/_core/tests/_natype.py.
KEEP_TEST_DIRS = {"numpy": {"numpy/_core/tests"}}


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def prune(names: list[str]) -> int:
    """Remove the test suites and PRUNE_GLOBS of the installed distributions `names`; returns
    the bytes freed. Only what those distributions' own RECORDs list is touched (a namespace
    directory such as nvidia/ may hold other packages, the base's among them)."""
    targets: set[Path] = set()
    for name in names:
        dist = metadata.distribution(name)
        root = Path(str(dist.locate_file("")))
        for f in dist.files or []:
            parts = f.parts
            if parts and parts[0] == "..":
                continue
            for k, part in enumerate(parts[:-1]):
                if part in TEST_DIRS:
                    if "/".join(parts[: k + 1]) not in KEEP_TEST_DIRS.get(canonical(name), ()):
                        targets.add(root.joinpath(*parts[: k + 1]))
                    break
        for pattern in PRUNE_GLOBS.get(canonical(name), []):
            targets.update(root.glob(pattern))
    freed = 0
    for path in sorted(targets, key=lambda p: len(p.parts)):  # outermost first
        if not path.exists():
            continue  # inside one removed already
        freed += _size(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return freed


def missing_from_base(names: list[str], base: dict[str, tuple[str, str]]) -> list[str]:
    """The `--if-missing` names the base does not have (those it has stay at its version)."""
    return [n for n in names if canonical(n) not in base]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--constraints", required=True, type=Path)
    ap.add_argument("--pip-arg", action="append", default=[], help="extra argument for pip")
    ap.add_argument(
        "--if-missing",
        action="append",
        default=[],
        metavar="PKG",
        help="install PKG at its pin only where the base lacks it",
    )
    ap.add_argument(
        "--prune",
        action="store_true",
        help="remove test suites and build-only files of the packages installed here",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the constraints and stop")
    ap.add_argument("packages", nargs="*")
    args = ap.parse_args(argv)

    pins = parse_pins(args.constraints.read_text())
    base = installed_distributions()
    args.packages += missing_from_base(args.if_missing, base)
    if not args.packages:
        print("pip_install: nothing to install (the base has every --if-missing package)")
        return 0
    lines, warnings = merged_constraints(pins, args.packages, base)
    for w in warnings:
        print(f"pip_install: {w}", file=sys.stderr)
    if args.dry_run:
        print("\n".join(lines))
        return 0

    specs = [f"{pins[canonical(p)][0]}=={pins[canonical(p)][1]}" for p in args.packages]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        cmd = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "-c", f.name]
        subprocess.run([*cmd, *args.pip_arg, *specs], check=True)
    finally:
        Path(f.name).unlink(missing_ok=True)

    after = installed_distributions()
    wanted = {canonical(p) for p in args.packages}
    moved = sorted(
        f"{base[k][0]} {base[k][1]} -> {after.get(k, ('', 'removed'))[1]}"
        for k in base
        if k not in wanted and k not in TOOLING and after.get(k, (None, None))[1] != base[k][1]
    )
    if moved:
        print(f"pip_install: base packages changed: {'; '.join(moved)}", file=sys.stderr)
        return 1
    added = sorted(f"{n}=={v}" for k, (n, v) in after.items() if k not in base)
    print(f"pip_install: added {' '.join(added) or 'nothing'}")
    if args.prune:
        names = [n for k, (n, _) in after.items() if k not in base]
        print(f"pip_install: pruned {prune(names) / 1e6:.0f} MB of tests and build-only files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
