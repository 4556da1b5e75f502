"""The built stage images, run: what only a real container shows. Skipped where no Docker engine
answers or no image was built here (images/build.sh, or images/smoke.py, which .ci/run runs
before the tests where it can). Uses the newest image of each stage labelled by build.sh."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

STAGES = ("generate", "verify", "train", "evaluate")


def _client():
    docker = pytest.importorskip("docker", reason="the docker package is not installed")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # noqa: BLE001 - no engine, however it fails
        pytest.skip(f"no Docker engine answers: {e}")
    return client


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """stage -> the newest image build.sh made of it (its org.opencontainers title)."""
    client = _client()
    found: dict[str, tuple[str, str]] = {}
    for image in client.images.list(filters={"label": "rlvr.flavor"}):
        labels = image.labels or {}
        stage = labels.get("org.opencontainers.image.title", "").removeprefix("rlvr-")
        if stage in STAGES and image.tags:
            created = image.attrs.get("Created", "")
            if stage not in found or created > found[stage][0]:
                found[stage] = (created, image.tags[0])
    missing = [s for s in STAGES if s not in found]
    if missing:
        pytest.skip(f"no built image of {missing} here (images/build.sh or images/smoke.py)")
    return {s: tag for s, (_, tag) in found.items()}


def _run(
    image: str, *args: str, profile: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess:
    """The image as a pod runs it: its own non-root USER, no capabilities, no network."""
    cmd = ["docker", "run", "--rm", "--cap-drop", "ALL", "--network", "none"]
    if user:
        cmd += ["--user", user]
    if profile:
        cmd += ["--security-opt", f"seccomp={profile}"]
    return subprocess.run(
        [*cmd, "--entrypoint", "python", image, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_code_rewards_in_the_verify_image(images, tmp_path):
    """Under the runtime's default seccomp profile the sandbox cannot build its user namespace
    and says why and what to do; under the profile the code-sandbox overlay ships it is
    available, with the network isolated, as uid 10001 with every capability dropped."""
    default = _run(images["verify"], "-m", "components.sandbox", "probe")
    assert default.returncode != 0
    assert "available: False" in default.stdout
    assert "seccomp" in default.stdout and "pod-profile" in default.stdout  # names the fix

    profile = tmp_path / "profile.json"
    out = subprocess.run(
        [sys.executable, "-m", "components.sandbox", "pod-profile"],
        capture_output=True,
        text=True,
        check=True,
    )
    profile.write_text(out.stdout)
    shipped = _run(images["verify"], "-m", "components.sandbox", "probe", profile=str(profile))
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert "available: True, network isolated: True" in shipped.stdout


def test_images_run_as_their_uid_with_a_writable_home(images):
    probe = (
        "import os, pathlib, tempfile, json; h = pathlib.Path.home();"
        "(h / '.cache' / 'probe').parent.mkdir(parents=True, exist_ok=True);"
        "(h / '.cache' / 'probe').write_text('x');"
        "(h / '.config').mkdir(exist_ok=True); tempfile.mkstemp();"
        "print(json.dumps([os.getuid(), os.getgid(), str(h)]))"
    )
    for stage, image in images.items():
        out = _run(image, "-c", probe)
        assert out.returncode == 0, f"{stage}: {out.stderr[-500:]}"
        assert json.loads(out.stdout) == [10001, 10001, "/home/rlvr"], stage


def test_no_compiler_and_no_caches_in_the_images(images):
    check = (
        "import shutil, os, sys;"
        "found = [c for c in ('gcc', 'cc', 'g++', 'c++', 'nvcc') if shutil.which(c)];"
        "cache = [p for p in ('/root/.cache/pip', '/home/rlvr/.cache/pip') if os.path.exists(p)];"
        "print(found, cache); sys.exit(1 if found or cache else 0)"
    )
    for stage, image in images.items():
        out = _run(image, "-c", check, user="0")  # root: /root is not readable by uid 10001
        assert out.returncode == 0, f"{stage}: {out.stdout}"


def test_stage_modules_import_and_verify_holds_no_torch(images):
    for stage, image in images.items():
        code = (
            f"import sys, components.{stage}.__main__;"
            "print(sorted({'torch', 'transformers', 'deepspeed'} & set(sys.modules)))"
        )
        out = _run(image, "-c", code)
        assert out.returncode == 0, f"{stage}: {out.stderr[-800:]}"
        if stage == "verify":
            assert out.stdout.strip() == "[]"
