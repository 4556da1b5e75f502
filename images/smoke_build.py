"""The image half of images/smoke.py: a docker CLI with BuildKit and an engine, a Python base
(official, pulled, or made from Debian's packages), the four CPU images built with this
machine's pip setup, and their sizes; plus the small helpers both halves use.
"""

from __future__ import annotations

import configparser
import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("generate", "verify", "train", "evaluate")
OFFICIAL_BASE = "python:3.11.14-slim-bookworm"
DEBIAN_BASE = "rlvr-base/python:3.11-bookworm"


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def sh(
    *cmd: str,
    env: dict[str, str] | None = None,
    capture: bool = False,
    check: bool = True,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        env={**os.environ, **(env or {})},
        text=True,
        check=check,
        timeout=timeout,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )


def die(message: str) -> None:
    print(f"smoke: {message}", file=sys.stderr)
    sys.exit(2)


# --- 1. docker -------------------------------------------------------------------------------


def find_docker() -> str:
    """A docker CLI whose `build` has BuildKit (buildx, or built in as in Debian's docker.io)."""
    candidates = [os.environ.get("DOCKER", ""), "docker", "/usr/bin/docker"]
    for cli in dict.fromkeys(c for c in candidates if c and shutil.which(c)):
        probe = sh(cli, "build", "--help", env={"DOCKER_BUILDKIT": "1"}, capture=True, check=False)
        if probe.returncode == 0 and "--secret" in probe.stdout:
            info = sh(cli, "info", "--format", "{{.ServerVersion}}", capture=True, check=False)
            if info.returncode != 0:
                die(
                    f"no Docker engine answers {cli} ({info.stderr.strip()[:200]}). Start one; "
                    "on a machine whose limits are below Docker's defaults: dockerd "
                    "--iptables=false --bridge=none --default-ulimit nofile=1024:1024 "
                    "--default-ulimit nproc=4096:4096 &"
                )
            print(f"docker CLI {cli}, engine {info.stdout.strip()}")
            return cli
    die("no docker CLI with BuildKit: install docker-buildx, or Debian's docker.io")
    raise AssertionError


# --- 2. the base -----------------------------------------------------------------------------


def find_base(docker: str) -> str:
    if os.environ.get("CPU_BASE"):
        return os.environ["CPU_BASE"]
    for image in (OFFICIAL_BASE, DEBIAN_BASE):
        if sh(docker, "image", "inspect", image, capture=True, check=False).returncode == 0:
            print(f"base {image} (on the machine)")
            return image
    with contextlib.suppress(subprocess.TimeoutExpired):
        if (
            sh(docker, "pull", OFFICIAL_BASE, capture=True, check=False, timeout=120).returncode
            == 0
        ):
            print(f"base {OFFICIAL_BASE} (pulled)")
            return OFFICIAL_BASE
    print("no registry answers: making the base from Debian's packages")
    started = time.perf_counter()
    sh("bash", str(ROOT / "images/base/debian.sh"), DEBIAN_BASE, env={"DOCKER": docker})
    print(f"base {DEBIAN_BASE} made in {time.perf_counter() - started:.0f} s")
    return DEBIAN_BASE


# --- 3. build --------------------------------------------------------------------------------


def host_pip_settings() -> dict[str, list[str]]:
    """This machine's pip settings that a build needs: cert, find-links, index URLs."""
    out = sh(sys.executable, "-m", "pip", "config", "list", capture=True, check=False).stdout
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"^[\w:.-]+?\.([\w-]+)='(.*)'$", line.strip())
        if m:
            settings.setdefault(m.group(1), []).extend(m.group(2).split())
    for key, env in (
        ("cert", "PIP_CERT"),
        ("find-links", "PIP_FIND_LINKS"),
        ("index-url", "PIP_INDEX_URL"),
        ("extra-index-url", "PIP_EXTRA_INDEX_URL"),
    ):
        if os.environ.get(env):
            settings.setdefault(key, []).extend(os.environ[env].split())
    return {k: list(dict.fromkeys(v)) for k, v in settings.items()}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def served(directory: str):
    """A local wheel directory as a find-links URL on loopback, for the builds' pip."""
    handler = functools.partial(_QuietHandler, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def build(docker: str, base: str, tag: str) -> tuple[float, dict[str, str]]:
    settings = host_pip_settings()
    conf = configparser.ConfigParser()
    conf["global"] = {}
    env = {"FLAVOR": "cpu", "CPU_BASE": base, "DOCKER": docker, "REVISION": tag}
    cert = (settings.get("cert") or [""])[0]
    if cert and Path(cert).is_file():
        env["PIP_CA"] = cert
        conf["global"]["cert"] = "/run/secrets/pip-ca"
    for key in ("index-url", "extra-index-url"):
        urls = [u for u in settings.get(key, []) if u.startswith(("http://", "https://"))]
        if urls:
            conf["global"][key] = " ".join(urls)
    local_dirs = [d for d in settings.get("find-links", []) if Path(d).is_dir()]
    if not local_torch_wheel(settings):
        extra = conf["global"].get("extra-index-url", "")
        conf["global"]["extra-index-url"] = f"{extra} https://download.pytorch.org/whl/cpu".strip()
    if sh(docker, "network", "inspect", "bridge", capture=True, check=False).returncode != 0:
        env["NETWORK"] = "host"  # the daemon runs without a bridge: builds use the host's
    with contextlib.ExitStack() as stack:
        links = [stack.enter_context(served(d)) for d in local_dirs]
        if links:
            if env.get("NETWORK") != "host":
                env["NETWORK"] = "host"  # the loopback wheel server must be reachable
            conf["global"]["find-links"] = " ".join(links)
        conf_file = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".conf"))
        conf.write(conf_file)
        conf_file.flush()
        env["PIP_CONF"] = conf_file.name
        print("pip for the builds:", dict(conf["global"]))
        started = time.perf_counter()
        sh("bash", str(ROOT / "images/build.sh"), "rlvr.local", tag, env=env)
        seconds = time.perf_counter() - started
    return seconds, {s: f"rlvr.local/rlvr-{s}:{tag}" for s in STAGES}


def sizes(docker: str, images: dict[str, str]) -> None:
    """Each image's size, and what the four take together: `docker save` of all four writes each
    distinct layer once (the torch layer the three torch images share among them)."""
    for image in images.values():
        size = int(
            sh(docker, "image", "inspect", "--format", "{{.Size}}", image, capture=True).stdout
        )
        print(f"  {image:<44} {size / 1e6:>6.0f} MB")
    with subprocess.Popen([docker, "save", *images.values()], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        together = sum(len(chunk) for chunk in iter(lambda: proc.stdout.read(1 << 20), b""))
    print(f"  the four together (shared layers once): {together / 1e6:.0f} MB")


def local_torch_wheel(settings: dict[str, list[str]]) -> bool:
    """Whether a find-links directory of this machine holds a torch wheel."""
    return any(
        name.startswith("torch-")
        for d in settings.get("find-links", [])
        if Path(d).is_dir()
        for name in os.listdir(d)
    )
