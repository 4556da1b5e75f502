"""`rlvr run --runner docker`: every task of the pipeline in its stage's image.

The same compiled pipeline, on kfp.local's DockerRunner instead of its SubprocessRunner: KFP
resolves each task's arguments, starts the task's image (the component's `base_image`,
`cluster.image(stage)`) with the KFP executor command, mounts the pipeline root at its own path,
and reads the outputs back. What this module adds is what a pod gets from Kubernetes and the
local runner has no notion of:

- **the run's data**: the run directory read-write, and the base checkpoint, the datasets and
  file plugins read-only, each at its own host path (paths in the config stay valid);
- **the user**: the uid the image declares (its `USER`, 10001 for the stage images), as on a
  cluster; a root caller hands the run directory to that uid first, a non-root caller whose
  run directory that uid cannot write is told how (`--docker-user host` runs as the caller);
- **the code-sandbox seccomp profile** on the tasks that run model-written code (verify and
  evaluate), the profile the cluster's code-sandbox overlay installs; the runtime's default
  profile refuses the sandbox, which then says so (tests/test_images_built.py shows both);
- **no network** unless the store or an input is remote (then the host's);
- **the console**: each container's output goes whole to its task's log and the rlvr lines to
  the console (pipelines/local_runner.py), and a stopped run stops its containers.

Nothing is pulled: an image that is not on the machine is an error naming images/build.sh.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.config import RunConfig

#: Tasks, by their display name's first word, and the stage whose image they run.
TASK_STAGE = {"init": "init", "next": "init", "report": "init", "generate": "generate",
              "verify": "verify", "train": "train", "evaluate": "evaluate"}  # fmt: skip
BUILTIN_VERIFIERS = {"math", "exact", "code", "format"}


class DockerSetupError(RuntimeError):
    """The machine cannot run the pipeline in containers; the message says what to do."""


@dataclass(frozen=True)
class Mount:
    host: str
    read_only: bool

    def volume(self) -> dict[str, str]:
        return {"bind": self.host, "mode": "ro" if self.read_only else "rw"}


@dataclass
class DockerPlan:
    """Everything a task's container gets besides what KFP gives it."""

    images: dict[str, str]
    mounts: list[Mount]
    user: str | None
    """None: the image's own USER."""
    network: str
    pythonpath: list[str] = field(default_factory=list)
    seccomp_profile: str | None = None
    """JSON of the profile for the code stages; None: the runtime's default."""


def stage_of(task: str) -> str:
    return TASK_STAGE.get(task.split("-")[0], "init")


def plugin_paths(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(directories to mount, entries for PYTHONPATH) of the config's verifier plugins: a file
    plugin's directory; a module plugin's top-level package's parent, found the way the
    stages' import finds it from here."""
    specs: list[str] = []
    for spec in cfg.verify.rewards.values():
        if isinstance(spec, str):
            specs.append(spec)
        else:
            specs += [c.verifier for c in spec.components]
    mounts: list[str] = []
    path: list[str] = []
    for spec in specs:
        if spec in BUILTIN_VERIFIERS or ":" not in spec:
            continue
        target = spec.rsplit(":", 1)[0]
        if target.endswith(".py"):
            mounts.append(str(Path(target).resolve().parent))
            continue
        top = target.split(".")[0]
        found = importlib.util.find_spec(top)
        if found is None or found.origin in (None, "built-in", "frozen"):
            continue  # preflight has already said the plugin does not import
        pkg = Path(found.origin).parent if found.submodule_search_locations else None
        where = str((pkg.parent if pkg is not None else Path(found.origin).parent).resolve())
        mounts.append(where)
        path.append(where)
    return sorted(set(mounts)), sorted(set(path))


def plan_for(cfg: RunConfig, run_root: Path, *, user: str = "image") -> DockerPlan:
    """The containers' mounts, user, network and seccomp profile for this run."""
    from components.core.config import _is_uri
    from components.verify.sandbox.seccomp import pod_profile

    mounts = [Mount(str(run_root.resolve()), read_only=False)]
    remote = _is_uri(cfg.run.store)
    for path in (cfg.model.base, cfg.data.train, *(e.path for e in cfg.data.eval)):
        if _is_uri(path):
            remote = True
        elif Path(path).exists():
            mounts.append(Mount(str(Path(path).resolve()), read_only=True))
    plugin_dirs, pythonpath = plugin_paths(cfg)
    mounts += [Mount(d, read_only=True) for d in plugin_dirs]
    return DockerPlan(
        images={
            s: cfg.cluster.image(s) for s in ("init", "generate", "verify", "train", "evaluate")
        },  # fmt: skip
        mounts=_outermost(mounts),
        user=None if user == "image" else (_caller() if user == "host" else user),
        network="host" if remote else "none",
        pythonpath=pythonpath,
        seccomp_profile=json.dumps(pod_profile()),
    )


def _caller() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def _outermost(mounts: list[Mount]) -> list[Mount]:
    """Drop a mount inside another (the run's own copy of an input, a plugin in the data dir);
    a read-write mount wins over a read-only one of the same path."""
    keep: list[Mount] = []
    for m in sorted(mounts, key=lambda m: (len(m.host), m.read_only)):
        if not any(m.host == k.host or m.host.startswith(k.host.rstrip("/") + "/") for k in keep):
            keep.append(m)
    return keep


def image_user(client: Any, image: str) -> tuple[int, int] | None:
    """The numeric (uid, gid) an image declares, None for root or a user name."""
    user = (client.images.get(image).attrs.get("Config") or {}).get("User") or ""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or int(uid) == 0:
        return None
    return int(uid), int(gid) if gid.isdigit() else int(uid)


def prepare(plan: DockerPlan, run_root: Path) -> Any:
    """Check the engine and the images, and make the run directory writable for the tasks'
    user; returns the docker client. Raises DockerSetupError with the fix."""
    try:
        import docker
    except ImportError:
        raise DockerSetupError(
            "--runner docker needs the docker package: pip install -e '.[docker]'"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the engine reads the same
        raise DockerSetupError(
            f"no Docker engine answers ({e}); start dockerd, or set DOCKER_HOST"
        ) from None
    missing = []
    for stage, image in sorted(plan.images.items()):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing.append(f"{image} ({stage})")
    if missing:
        raise DockerSetupError(
            f"images not on this machine: {', '.join(missing)}. Build them with "
            "`FLAVOR=cpu images/build.sh REGISTRY TAG` (images/smoke.sh shows a whole run) and "
            "pass the `--set cluster.image_repo=... --set cluster.image_tag=...` it prints"
        )
    if plan.user is None:
        users = {image_user(client, image) for image in plan.images.values()}
        if None in users or len(users) != 1:
            raise DockerSetupError(
                f"the images declare {sorted(map(str, users))} as their users; rlvr runs them "
                "as one numeric non-root uid: rebuild with images/build.sh, or pass "
                "--docker-user UID:GID"
            )
        (owner,) = users
        _hand_over(run_root, owner)
        for m in plan.mounts:
            if m.read_only:
                _check_readable(Path(m.host), *owner)
    return client


def _can(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether uid/gid has all of `bits` (an `rwx` mask of 0o7) on a file with `st`."""
    if uid == 0:
        return True
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & bits == bits


def _check_readable(root: Path, uid: int, gid: int) -> None:
    """Every file of an input mount readable, every directory listable, by the tasks' uid."""
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        st = path.stat()
        need = 0o5 if path.is_dir() else 0o4
        if not _can(st, uid, gid, need):
            raise DockerSetupError(
                f"the images run as uid {uid}, which cannot read {path} (mode "
                f"{oct(st.st_mode & 0o777)}, owner uid {st.st_uid}); make the input readable: "
                f"chmod -R a+rX {root}"
            )


def _hand_over(run_root: Path, owner: tuple[int, int]) -> None:
    """Make the run directory the tasks' own: a root caller chowns it to the images' uid (the
    cluster's pods write the store as that uid too); anyone else must already have given it."""
    run_root.mkdir(parents=True, exist_ok=True)
    uid, gid = owner
    if os.geteuid() == 0:
        for path in [run_root, *run_root.rglob("*")]:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(path, uid, gid)
        return
    st = run_root.stat()
    if st.st_uid != uid and not st.st_mode & 0o002:
        raise DockerSetupError(
            f"the images run as uid {uid}, which cannot write the run directory {run_root} "
            f"(owned by uid {st.st_uid}). Either run the containers as you: "
            f"--docker-user host, or give the directory to that uid: "
            f"sudo chown -R {uid}:{gid} {run_root}"
        )


_live: set[Any] = set()
_live_lock = threading.Lock()


def stop_live_containers() -> None:
    """Stop every running task container (SIGTERM, then SIGKILL after 10 s)."""
    with _live_lock:
        containers = list(_live)
    for c in containers:
        with contextlib.suppress(Exception):
            c.stop(timeout=10)


TaskLog = Callable[[str], contextlib.AbstractContextManager[Callable[[str], None]]]
"""`open_log(task)`: a context whose value takes the task's output line by line."""


def make_container_runner(
    plan: DockerPlan,
    open_log: TaskLog,
    current_task: Callable[[], str],
    task_env: Callable[[str], dict[str, str]],
) -> Callable[..., int]:
    """The replacement of kfp.local's `docker_task_handler.run_docker_container`: the task's
    container with the plan's mounts, user, network and profile; its output line by line to
    the task's log; its exit status (the container is removed after, not auto-removed, so the
    status is never lost)."""

    def run_docker_container(client, image, command, volumes, **run_args) -> int:
        task = current_task()
        stage = stage_of(task)
        env = {**task_env(task), **(run_args.pop("environment", None) or {})}
        if plan.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(plan.pythonpath)
        vols = dict(volumes)
        for m in plan.mounts:
            vols.setdefault(m.host, m.volume())
        security = []
        if stage in ("verify", "evaluate") and plan.seccomp_profile:
            security.append(f"seccomp={plan.seccomp_profile}")
        if plan.user:
            run_args["user"] = plan.user
        if security:
            run_args["security_opt"] = security
        # KFP's command replaces the image's ENTRYPOINT, as a pod's `command` does; Docker would
        # append it to the entry point (`python -m components.train sh -c ...`).
        container = client.containers.run(
            image=image, entrypoint=list(command), command=[], detach=True, volumes=vols, environment=env,
            network_mode=plan.network, cap_drop=["ALL"], labels={"rlvr.task": task},
            **run_args,
        )  # fmt: skip
        with _live_lock:
            _live.add(container)
        try:
            with open_log(task) as write:
                pending = b""
                for chunk in container.logs(stream=True, follow=True):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        write(line.decode(errors="replace") + "\n")
                if pending:
                    write(pending.decode(errors="replace") + "\n")
            return int(container.wait()["StatusCode"])
        finally:
            with _live_lock:
                _live.discard(container)
            with contextlib.suppress(Exception):
                container.remove(force=True)

    return run_docker_container


@contextlib.contextmanager
def docker_tasks(
    plan: DockerPlan,
    open_log: TaskLog,
    current_task: Callable[[], str],
    task_env: Callable[[str], dict[str, str]],
) -> Iterator[None]:
    """Patch kfp.local's Docker task handler for the duration (kfp==2.17.0; a test pins the
    name)."""
    from kfp.local import docker_task_handler

    saved = docker_task_handler.run_docker_container
    docker_task_handler.run_docker_container = make_container_runner(
        plan, open_log, current_task, task_env
    )
    try:
        yield
    finally:
        docker_task_handler.run_docker_container = saved
