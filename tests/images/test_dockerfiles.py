"""The stage images, checked without a Docker engine.

Dockerfiles are parsed with dockerfile-parse (skipped when it is missing): pinned bases, a
non-root numeric USER, the `python -m components.<stage>` entry point, kfp pinned to the kfp
that compiles the pipeline here, every installed package pinned in images/constraints.txt and
those pins consistent with pyproject.toml. images/pip_install.py's pin merging is unit-tested,
images/build.sh runs against a stub container CLI, and the torch-free claim of the verify image
is checked by importing the verify stage the way its container does.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
STAGES = ("generate", "verify", "train", "evaluate")
# Packages the vLLM base pins for itself; generate/evaluate must take them from the base
# (pip_install.py holds them), never install their own.
VLLM_PROVIDED = {
    "click",
    "huggingface-hub",
    "numpy",
    "pydantic",
    "pyyaml",
    "safetensors",
    "sympy",
    "tokenizers",
    "torch",
    "tqdm",
    "transformers",
}
HEAVY = {"torch", "transformers", "deepspeed", "vllm", "safetensors", "tokenizers"}
# Imported only when present (pyarrow uses cloudpickle if it can, else pickle), so their absence
# from the verify image is fine.
OPTIONAL_IMPORTS = {"cloudpickle"}
# Function-level imports in modules the verify stage loads, in functions it never calls.
VERIFY_NEVER_CALLS = {
    ("components.model.checkpoint", "torch"),  # load_policy: generate/train/evaluate only
    ("components.model.checkpoint", "transformers"),
}


def _load_pip_install():
    spec = importlib.util.spec_from_file_location("rlvr_pip_install", IMAGES / "pip_install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pip_install = _load_pip_install()
canonical = pip_install.canonical


def _parser(stage: str):
    dfp = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse is not installed")
    text = (IMAGES / stage / "Dockerfile").read_bytes()
    return dfp.DockerfileParser(fileobj=io.BytesIO(text))


def _instructions(df, name: str) -> list[str]:
    return [i["value"] for i in df.structure if i["instruction"] == name]


def _pip_install_calls(df) -> list[list[str]]:
    """The arguments after `-c <constraints>` of each `pip_install.py` call of the Dockerfile."""
    calls = []
    for run in _instructions(df, "RUN"):
        if "pip_install.py" not in run:
            continue
        words = shlex.split(run.split("&&")[0])
        at = next(i for i, w in enumerate(words) if w.endswith("images/pip_install.py"))
        rest = words[at + 1 :]
        assert rest[0] == "-c" and rest[1].endswith("images/constraints.txt"), rest
        calls.append(rest[2:])
    assert calls, "no `python images/pip_install.py` RUN instruction"
    return calls


def _install_list(df) -> tuple[list[str], list[str]]:
    """(packages, options) of the Dockerfile's pip_install.py calls, `--if-missing=PKG`
    counted as packages (they are installed, at their pins, where the base lacks them)."""
    packages, options = [], []
    for args in _pip_install_calls(df):
        for w in args:
            if w.startswith("--if-missing="):
                packages.append(w.split("=", 1)[1])
            elif w.startswith("-"):
                options.append(w)
            else:
                packages.append(w)
    return packages, options


def _explicit(df) -> set[str]:
    """What the Dockerfile installs at its pin whatever the base holds (not `--if-missing`)."""
    return {canonical(w) for args in _pip_install_calls(df) for w in args if not w.startswith("-")}


def _pins() -> dict[str, tuple[str, str]]:
    return pip_install.parse_pins((IMAGES / "constraints.txt").read_text())


# --- Dockerfiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES)
def test_base_image_is_pinned(stage):
    df = _parser(stage)
    bases = df.parent_images
    assert len(bases) == 1, f"{stage}: expected one FROM, got {bases}"
    image = bases[0]
    name, _, digest = image.partition("@")
    assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), image
    last = name.rsplit("/", 1)[-1]
    assert ":" in last, f"{stage}: base {image} has no tag"
    tag = last.split(":", 1)[1]
    assert tag and tag != "latest", f"{stage}: base {image} is not pinned"
    # A minor-version tag such as python:3.11-slim moves; the pin names a patch release.
    assert re.search(r"\d+\.\d+\.\d+", tag), f"{stage}: base tag {tag} is not a full version"


@pytest.mark.parametrize("stage", STAGES)
def test_runs_as_a_numeric_non_root_user(stage):
    df = _parser(stage)
    users = _instructions(df, "USER")
    assert users, f"{stage}: no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"{stage}: USER {users[-1]} is not a non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0), f"{stage}: USER group {gid}"
    # Nothing after the final USER may need root, and the user must exist in the image.
    kinds = [i["instruction"] for i in df.structure if i["instruction"] != "COMMENT"]
    assert "RUN" not in kinds[kinds.index("USER") :], f"{stage}: RUN after USER"
    assert any(f"--uid {uid}" in run for run in _instructions(df, "RUN")), f"{stage}: no useradd"
    assert _instructions(df, "WORKDIR"), f"{stage}: no WORKDIR"


@pytest.mark.parametrize("stage", STAGES)
def test_entrypoint_is_the_stage_module(stage):
    df = _parser(stage)
    entry = json.loads(_instructions(df, "ENTRYPOINT")[-1])
    assert entry == ["python", "-m", f"components.{stage}"]
    assert (ROOT / "components" / stage / "__main__.py").is_file()


@pytest.mark.parametrize("stage", STAGES)
def test_kfp_matches_the_compiling_kfp(stage):
    df = _parser(stage)
    # The components run the image's KFP executor (install_kfp_package=False, no start-up pip
    # install): it must be the kfp that compiled the pipeline.
    installed = importlib.metadata.version("kfp")
    assert df.args.get("KFP_VERSION") == installed, (
        f"{stage}: ARG KFP_VERSION={df.args.get('KFP_VERSION')} but kfp here is {installed}: "
        "pin kfp in pyproject.toml to the images' version, or move every Dockerfile's pin"
    )
    assert any(
        'pip install --no-deps "kfp==${KFP_VERSION}"' in run for run in _instructions(df, "RUN")
    ), f"{stage}: kfp is not installed at ${{KFP_VERSION}} with --no-deps"


@pytest.mark.parametrize("stage", STAGES)
def test_installed_packages_are_pinned(stage):
    df = _parser(stage)
    packages, _ = _install_list(df)
    pins = _pins()
    assert packages
    missing = [p for p in packages if canonical(p) not in pins]
    assert not missing, f"{stage}: {missing} not pinned in images/constraints.txt"
    assert "kfp" not in {canonical(p) for p in packages}, "kfp is pinned by KFP_VERSION"
    # The package itself goes in without dependencies: pyproject's would pull torch/deepspeed.
    assert any("pip install --no-deps ." in run for run in _instructions(df, "RUN"))


def test_images_do_not_fight_their_bases():
    for stage in ("generate", "evaluate"):
        clash = VLLM_PROVIDED & _explicit(_parser(stage))
        assert not clash, f"{stage} reinstalls {clash}, which the vLLM base pins"
        # ...but the CPU flavor, on a bare Python, needs them: each where the base lacks it
        packages, _ = _install_list(_parser(stage))
        assert VLLM_PROVIDED - {"sympy"} <= {canonical(p) for p in packages}, stage
    df = _parser("train")
    packages, options = _install_list(df)
    assert "torch" not in _explicit(df) and "torch" in packages  # --if-missing=torch
    assert "deepspeed" in packages and "--pip-arg=--no-build-isolation" in options
    packages, _ = _install_list(_parser("verify"))
    assert not HEAVY & {canonical(p) for p in packages}


@pytest.mark.parametrize("stage", STAGES)
def test_copies_are_in_the_build_context(stage):
    df = _parser(stage)
    ignore = (IMAGES / stage / "Dockerfile.dockerignore").read_text()
    allowed = {line[1:] for line in ignore.splitlines() if line.startswith("!")}
    for copy in _instructions(df, "COPY"):
        *sources, _dest = copy.split()
        for src in sources:
            assert (ROOT / src).exists(), f"{stage}: COPY {src} does not exist"
            assert src.rstrip("/") in allowed, f"{stage}: {src} is excluded from the context"
    # pyproject names README.md as its readme, so the package build needs it in the image.
    copied = " ".join(_instructions(df, "COPY"))
    for needed in ("pyproject.toml", "README.md", "components/", "pipelines/"):
        assert needed in copied, f"{stage}: {needed} is not copied"


@pytest.mark.parametrize("stage", STAGES)
def test_what_the_real_build_taught(stage):
    """Checks that a static look can make, each a failure the first real build hit."""
    df = _parser(stage)
    runs = _instructions(df, "RUN")
    # The build-time import checks run as root with HOME=/home/rlvr and leave caches there
    # (matplotlib's font cache): the user could not write its own HOME.
    assert runs[-1].rstrip().endswith("chown -R 10001:10001 /home/rlvr"), runs[-1][-80:]
    # Every pip step can reach the index through a mirror or a proxy CA (BuildKit secrets), and
    # the project's own `pip install .` fetches its build backend too.
    for run in runs:
        if re.search(r"pip(_install\.py| install)", run):
            assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in run, run[:120]
            assert "--mount=type=secret,id=pip-ca" in run, run[:120]
    assert "FLAVOR" in df.args
    # what a pip_install.py step adds, it adds without test suites and build-only files
    assert all("--prune" in args for args in _pip_install_calls(df)), stage
    if stage != "verify":
        # torch first, in the layer the three torch images share: identical instructions
        # straight after FROM
        kinds = [i for i in df.structure if i["instruction"] not in ("COMMENT",)]
        after_from = [
            i["instruction"]
            for i in kinds[kinds.index(next(i for i in kinds if i["instruction"] == "FROM")) + 1 :][
                :2
            ]
        ]
        assert after_from == ["COPY", "RUN"] and "--if-missing=torch" in runs[0]


def test_torch_layer_is_the_same_in_the_three_torch_images():
    def first_two(stage):
        df = _parser(stage)
        items = [i for i in df.structure if i["instruction"] in ("COPY", "RUN")]
        return [(i["instruction"], i["value"]) for i in items[:2]]

    assert first_two("generate") == first_two("train") == first_two("evaluate")


def test_dockerignore_files_are_identical():
    texts = {(IMAGES / s / "Dockerfile.dockerignore").read_text() for s in STAGES}
    assert len(texts) == 1


# --- constraints and the pinned installer ---------------------------------------------------


def test_constraints_are_exact_and_satisfy_pyproject():
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        key = canonical(req.name)
        if key in pins:
            version = pins[key][1]
            assert req.specifier.contains(version, prereleases=True), (
                f"images/constraints.txt pins {req.name}=={version}, pyproject wants {dep}"
            )
    # The version limits the comments in constraints.txt explain.
    assert int(pins["transformers"][1].split(".")[0]) < 5, "vLLM 0.11 needs transformers<5"
    major, minor = (int(x) for x in pins["numpy"][1].split(".")[:2])
    assert (major, minor) < (2, 3), "numba in the vLLM base needs numpy<2.3"


def test_parse_pins_rejects_ranges_and_duplicates():
    assert pip_install.parse_pins("# c\nPyYAML==6.0.3  # why\n\n") == {
        "pyyaml": ("PyYAML", "6.0.3")
    }
    for bad in ("numpy>=2", "numpy", "numpy==2.2.6\nNumPy==2.2.5", "-r other.txt"):
        with pytest.raises(ValueError):
            pip_install.parse_pins(bad)


def test_merged_constraints_hold_the_base_and_pin_the_rest():
    pins = pip_install.parse_pins("numpy==2.2.6\nrich==15.0.0\nbotocore==1.43.11\n")
    base = {
        "numpy": ("numpy", "2.1.0"),
        "torch": ("torch", "2.8.0+cu128"),
        "rich": ("rich", "13.0.0"),
        "odd": ("odd", "not a version"),
    }
    lines, warnings = pip_install.merged_constraints(pins, ["rich"], base)
    # requested: the pin wins; base packages: held; other pins: as written; bad versions: skipped
    assert lines == ["botocore==1.43.11", "numpy==2.1.0", "rich==15.0.0", "torch==2.8.0+cu128"]
    assert any("numpy" in w and "2.1.0" in w for w in warnings)
    assert any("odd" in w for w in warnings)
    with pytest.raises(ValueError, match="pyarrow"):
        pip_install.merged_constraints(pins, ["pyarrow"], base)


def test_installer_tooling_is_not_held_and_if_missing_follows_the_base():
    # Debian's ensurepip gives a venv setuptools 66; torch 2.13 needs >= 77. Holding it made the
    # first CPU build unresolvable.
    pins = pip_install.parse_pins("torch==2.13.0\ntransformers==4.57.1\n")
    base = {
        "setuptools": ("setuptools", "66.1.1"),
        "pip": ("pip", "23.0.1"),
        "torch": ("torch", "2.13.0+cpu"),
    }
    lines, warnings = pip_install.merged_constraints(pins, ["transformers"], base)
    assert lines == ["torch==2.13.0+cpu", "transformers==4.57.1"]
    assert not warnings  # 2.13.0+cpu is the pin's release: no "keeping the base's" warning
    # --if-missing: installed only where the base lacks it
    assert pip_install.missing_from_base(["torch", "transformers"], base) == ["transformers"]
    assert pip_install.missing_from_base(["torch"], {}) == ["torch"]


def _installed(site: Path, name: str, version: str, files: dict[str, str], monkeypatch) -> None:
    """A distribution installed into `site` (on sys.path): its files and a RECORD listing them."""
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))
    monkeypatch.syspath_prepend(str(site))


def test_prune_removes_tests_and_build_only_files_of_what_it_installed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    files = {
        "torch/__init__.py": "",
        "torch/lib/libtorch.so": "x" * 100,
        "torch/include/c10/a.h": "x" * 50,
        "torch/test/Dict_test": "x" * 70,
        "torch/bin/test_api": "x" * 30,
        "torch/bin/TCPStoreTest": "x" * 20,
        "torch/bin/torch_shm_manager": "x",
        "torch/testing/_internal/common.py": "",
        "torch/utils/tests/t.py": "x" * 10,
    }
    _installed(site, "torch", "2.13.0", files, monkeypatch)
    freed = pip_install.prune(["torch"])
    assert freed == 50 + 70 + 30 + 20 + 10
    left = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert left == sorted(
        [
            "torch-2.13.0.dist-info/METADATA",
            "torch-2.13.0.dist-info/RECORD",
            "torch/__init__.py",
            "torch/bin/torch_shm_manager",
            "torch/lib/libtorch.so",
            "torch/testing/_internal/common.py",
        ]
    )


def test_pip_install_dry_run_prints_the_merged_constraints(tmp_path):
    cfile = tmp_path / "c.txt"
    cfile.write_text("pebble==5.2.3\n")
    out = subprocess.run(
        [sys.executable, str(IMAGES / "pip_install.py"), "-c", str(cfile), "--dry-run", "pebble"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "Pebble==5.2.3" in out or "pebble==5.2.3" in out
    assert f"pytest=={importlib.metadata.version('pytest')}" in out  # installed: held


# --- the verify image needs no torch --------------------------------------------------------


def _requirement_closure(names: list[str]) -> set[str]:
    """Canonical names of `names` and everything they require (as installed here)."""
    env = default_environment() | {"extra": ""}
    seen: set[str] = set()
    todo = [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(canonical(req.name))
    return seen


def _loaded_modules(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def _imports_in(module: str) -> set[str]:
    """Top-level names of every import statement in a components.* module, at any depth
    (function-level imports included: they run when the function does)."""
    path = ROOT / module.replace(".", "/")
    path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_verify_stage_imports_only_what_the_verify_image_installs():
    # What the verify container imports: its entry point, and the KFP component body
    # (pipelines/ops.py verify_stage) imports the config module and the stage.
    loaded = _loaded_modules(
        "import components.verify.__main__, components.verify.stage, components.core.config"
    )
    loaded -= _loaded_modules("pass")  # interpreter start-up (.pth hooks, site)
    top = {m.split(".")[0] for m in loaded}
    assert not HEAVY & top, f"importing the verify stage loads {sorted(HEAVY & top)}"

    dists_of = importlib.metadata.packages_distributions()
    packages, _ = _install_list(_parser("verify"))
    available = _requirement_closure(packages) | OPTIONAL_IMPORTS
    # Imports that happen at import time, and the function-level ones in the same modules
    # (pebble and sympy are imported where they are used).
    ours = sorted(m for m in loaded if m.startswith("components.") and "__" not in m)
    assert "components.verify.executor" in ours
    wanted = {(m, name) for m in ours for name in _imports_in(m)}
    wanted |= {("<import>", m) for m in top}
    missing = set()
    for module, name in wanted:
        if name in sys.stdlib_module_names or name == "components":
            continue
        if (module, name) in VERIFY_NEVER_CALLS:
            continue
        # A module loaded at run time that no distribution provides is interpreter or
        # extension internals; an import statement naming nothing installed is a finding.
        default = [] if module == "<import>" else [name]
        dists = {canonical(d) for d in dists_of.get(name, default)} - {"rlvr"}
        if dists and not dists & available:
            missing.add(f"{name} ({module})")
    assert not missing, f"the verify stage imports {sorted(missing)}, not in its image"


# --- build.sh and the Makefile ----------------------------------------------------------------


def test_build_script_parses():
    subprocess.run(["bash", "-n", str(IMAGES / "build.sh")], check=True)


def _stub_docker(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "docker.log"
    stub = tmp_path / "docker"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        'printf "%s\\n" "$*" >> "$STUB_LOG"\n'
        'if [[ $1 == inspect ]]; then echo "${@: -1}@sha256:$(printf 0%.0s {1..64})"; fi\n'
    )
    stub.chmod(0o755)
    return stub, log


def _run_build(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    stub, log = _stub_docker(tmp_path)
    full_env = os.environ | {"DOCKER": str(stub), "STUB_LOG": str(log), "REVISION": "r"} | env
    return subprocess.run(
        ["bash", str(IMAGES / "build.sh"), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("tag", ["0.2.0", "1.0", "20250101", "v3-rc1", "on"])
def test_build_script_tags_flow_into_the_config(tmp_path, tag):
    from components.core.config import apply_overrides
    from components.core.config_cluster import ClusterSection

    proc = _run_build(tmp_path, "registry.example.com/team", tag, "--push")
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "docker.log").read_text().splitlines()
    builds = [c.split() for c in calls if c.startswith("build ")]
    assert len(builds) == len(STAGES)
    for stage, words in zip(STAGES, builds, strict=True):
        image = f"registry.example.com/team/rlvr-{stage}:{tag}"
        assert words[words.index("-t") + 1] == image
        assert words[words.index("-f") + 1] == str(IMAGES / stage / "Dockerfile")
        assert words[-1] == str(ROOT)  # the context is the repository root
        kfp = importlib.metadata.version("kfp")
        assert f"KFP_VERSION={kfp}" in words
    assert sum(c.startswith("push ") for c in calls) == len(STAGES)

    # The last line, pasted into a shell, makes cluster.image(stage) the pushed image.
    line = proc.stdout.strip().splitlines()[-1]
    words = shlex.split(line)
    overrides = [w for prev, w in zip(words, words[1:], strict=False) if prev == "--set"]
    raw = apply_overrides({}, overrides)
    cluster = ClusterSection.model_validate(raw["cluster"])
    for stage in STAGES:
        assert cluster.image(stage) == f"registry.example.com/team/rlvr-{stage}:{tag}"


@pytest.mark.parametrize(
    "args",
    [
        ("registry.example.com/team", "latest"),
        ("Registry.example.com/team", "0.1.0"),
        ("registry.example.com/team", "bad tag"),
        ("registry.example.com/team", "0.1.0", "--pushh"),
        ("registry.example.com/team",),
    ],
)
def test_build_script_refuses_bad_arguments(tmp_path, args):
    proc = _run_build(tmp_path, *args)
    assert proc.returncode == 2
    assert not (tmp_path / "docker.log").exists(), "nothing may be built"


def test_build_script_builds_a_subset_with_base_overrides(tmp_path):
    digest = "python:3.11.14-slim-bookworm@sha256:" + "a" * 64
    proc = _run_build(tmp_path, "r.example/x", "0.3.0", STAGES="verify", PYTHON_BASE=digest)
    assert proc.returncode == 0, proc.stderr
    (build,) = (tmp_path / "docker.log").read_text().splitlines()
    assert "rlvr-verify:0.3.0" in build and f"PYTHON_BASE={digest}" in build


def test_build_script_cpu_flavor(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\n")
    proc = _run_build(
        tmp_path,
        "rlvr.local",
        "0.3.0",
        FLAVOR="cpu",
        CPU_BASE="b:1.2.3",
        PIP_CONF=str(conf),
        PIP_CA=str(conf),
        NETWORK="host",
    )
    assert proc.returncode == 0, proc.stderr
    builds = (tmp_path / "docker.log").read_text().splitlines()
    assert len(builds) == len(STAGES)
    for line in builds:
        for arg in (
            "VLLM_BASE=b:1.2.3",
            "TORCH_BASE=b:1.2.3",
            "PYTHON_BASE=b:1.2.3",
            "FLAVOR=cpu",
            "rlvr.flavor=cpu",
            f"id=pip.conf,src={conf}",
            f"id=pip-ca,src={conf}",
            "--network host",
        ):
            assert arg in line, (arg, line)
        assert "--platform" not in line  # the machine's own
    # Without PIP_CONF the CPU flavor gets PyTorch's CPU index through a generated pip.conf.
    (tmp_path / "docker.log").unlink()
    proc = _run_build(tmp_path, "rlvr.local", "0.3.0", FLAVOR="cpu", STAGES="train")
    assert proc.returncode == 0 and "id=pip.conf,src=" in (tmp_path / "docker.log").read_text()
    proc = _run_build(tmp_path, "rlvr.local", "0.3.0", FLAVOR="tpu")
    assert proc.returncode == 2 and "FLAVOR" in proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_calls_the_build_script():
    out = subprocess.run(
        ["make", "-n", "-C", str(IMAGES), "push", "REGISTRY=r.example/x", "TAG=0.1.0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'build.sh" "r.example/x" "0.1.0" --push' in out


def test_prune_keeps_the_test_files_numpy_testing_imports(tmp_path, monkeypatch):
    """numpy.testing imports numpy/_core/tests/_natype.py, and scipy imports numpy.testing
    (the evaluate image's lm-eval -> scikit-learn -> scipy): that directory stays, the rest of
    numpy's tests go."""
    site = tmp_path / "site"
    files = {
        "numpy/__init__.py": "",
        "numpy/_core/tests/_natype.py": "x" * 10,
        "numpy/linalg/tests/test_linalg.py": "x" * 40,
    }
    _installed(site, "numpy", "2.2.6", files, monkeypatch)
    assert pip_install.prune(["numpy"]) == 40
    assert (site / "numpy/_core/tests/_natype.py").is_file()
    assert not (site / "numpy/linalg/tests").exists()
