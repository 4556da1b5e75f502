"""`rlvr run --runner docker`: every task of the pipeline in its stage's image.

The same compiled pipeline on the same local scheduler (pipelines/local_runner.py), with each
task in a container instead of a subprocess: the task's image (the component's `base_image`,
`cluster.image(stage)`) runs the KFP executor command with the arguments the scheduler
resolved, the pipeline root mounted at its own path, and the outputs are read back. What this
module adds is what a pod gets from Kubernetes and a plain container has no notion of:

- **the run's data**: the run directory read-write, and the base checkpoint, the datasets and
  file plugins read-only, each at the path the config gives (paths in the config stay valid),
  module plugins alone under /opt/rlvr-plugins on PYTHONPATH;
- **the user**: for a root caller the uid the image declares (its `USER`, 10001 for the stage
  images), as on a cluster, with the run directory handed to that uid first; for anyone else
  the caller's own uid (only root can hand a directory to another uid), with HOME=/tmp;
- **the environment**: the thread settings of the subprocess runner, and the host's object-store
  credentials and Hub token (FORWARDED_ENV), nothing else of the host's;
- **the code-sandbox seccomp profile** on the tasks that run model-written code (verify and
  evaluate; generate too when the policy has tools), the profile the cluster's code-sandbox overlay installs (and, where the host runs
  AppArmor, no AppArmor profile: Docker's denies mount); the runtime's default seccomp profile
  refuses the sandbox, which then says so (tests/images/test_built_images.py shows both);
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.config import RunConfig, code_stages
from components.core.stages import STEPS

#: Tasks, by their display name's first word, and the stage whose image they run.
TASK_STAGE = {
    "init": "init",
    "next": "init",
    "report": "init",
    "generate": "generate",
    "verify": "verify",
    "train": "train",
    "evaluate": "evaluate",
}
BUILTIN_VERIFIERS = {"math", "exact", "code", "format"}


class DockerSetupError(RuntimeError):
    """The machine cannot run the pipeline in containers; the message says what to do."""


@dataclass(frozen=True)
class Mount:
    """A bind mount: `source` on the host (symlinks resolved, as Docker needs) at `target` in
    the container (the path the tasks use, as the config spells it)."""

    source: str
    target: str
    read_only: bool

    def volume(self) -> dict[str, str]:
        return {"bind": self.target, "mode": "ro" if self.read_only else "rw"}


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
    code_stages: tuple[str, ...] = ("verify", "evaluate")
    """The stages that get the seccomp profile (components.core.config.code_stages)."""
    """JSON of the profile for the code stages; None: the runtime's default."""
    apparmor_unconfined: bool = False
    """Whether the code stages also leave Docker's AppArmor profile (it denies mount)."""


#: Where module plugins are mounted in the containers (on their PYTHONPATH).
PLUGIN_ROOT = "/opt/rlvr-plugins"
#: Host variables a task may need, passed on: object-store credentials and endpoint, Hub token.
FORWARDED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
)


def stage_of(task: str) -> str:
    return TASK_STAGE.get(task.split("-")[0], "init")


def _same_path(path: str | Path, read_only: bool = True) -> Mount:
    return Mount(str(Path(path).resolve()), str(Path(path).absolute()), read_only)


def plugin_mounts(cfg: RunConfig) -> list[Mount]:
    """The config's verifier plugins: a file plugin's file at its own path; a module plugin's
    top-level package (or module) alone under PLUGIN_ROOT, found the way the stages' import
    finds it from here. Never a whole directory of other things (a project root with its
    runs, a site-packages whose torch would shadow the image's)."""
    specs: list[str] = []
    for spec in cfg.verify.rewards.values():
        if isinstance(spec, str):
            specs.append(spec)
        else:
            specs += [c.verifier for c in spec.components]
    mounts: list[Mount] = []
    for spec in specs:
        if spec in BUILTIN_VERIFIERS or ":" not in spec:
            continue
        target = spec.rsplit(":", 1)[0]
        if target.endswith(".py"):
            mounts.append(_same_path(target))
            continue
        top = target.split(".")[0]
        found = importlib.util.find_spec(top)
        if found is None or found.origin in (None, "built-in", "frozen"):
            continue  # preflight has already said the plugin does not import
        if found.submodule_search_locations:  # a package: its directory
            src = Path(found.origin).parent
        else:  # a module: its file
            src = Path(found.origin)
        mounts.append(Mount(str(src.resolve()), f"{PLUGIN_ROOT}/{src.name}", True))
    return mounts


def _symlink_targets(mount: Mount) -> list[Mount]:
    """Files that links inside an input point to outside it (a Hugging Face cache snapshot's
    files link to ../../blobs), mounted where the links resolve in the container."""
    root = Path(mount.source)
    if not root.is_dir():
        return []
    extra = []
    for link in root.rglob("*"):
        if not link.is_symlink():
            continue
        real = link.resolve()
        if real.is_relative_to(root):
            continue
        in_container = Path(mount.target) / link.relative_to(root)
        where = Path(os.path.normpath(in_container.parent / os.readlink(link)))
        extra.append(Mount(str(real), str(where), True))
    return extra


def plan_for(cfg: RunConfig, run_root: Path, *, user: str = "image") -> DockerPlan:
    """The containers' mounts, user, network and seccomp profile for this run; `user` is
    image (the images' own uid), host (the caller's) or UID[:GID]."""
    from components.core.config import _is_uri
    from components.sandbox.seccomp import pod_profile

    mounts = [_same_path(run_root, read_only=False)]
    remote = _is_uri(cfg.run.store)
    suites = [s.include_path for s in cfg.data.lm_eval if s.include_path]  # lm-eval task dirs
    if suites:  # and the local data files their YAMLs name outside them
        from components.core.task_files import data_paths

        suites += [str(Path(p).parent) for s in cfg.data.lm_eval for p in data_paths(s)]
    for path in (cfg.model.base, cfg.data.train, *(e.path for e in cfg.data.eval), *suites):
        if _is_uri(path):
            remote = True
        elif Path(path).exists():
            mounts.append(_same_path(path))
    mounts = _outermost(mounts)
    mounts += [extra for m in mounts if m.read_only for extra in _symlink_targets(m)]
    plugins = plugin_mounts(cfg)
    apparmor = Path("/sys/module/apparmor/parameters/enabled")
    return DockerPlan(
        images={s: cfg.cluster.image(s) for s in STEPS},
        mounts=mounts + plugins,
        user=None if user == "image" else (_caller() if user == "host" else user),
        network="host" if remote else "none",
        pythonpath=[PLUGIN_ROOT] if any(m.target.startswith(PLUGIN_ROOT) for m in plugins) else [],
        seccomp_profile=json.dumps(pod_profile()),
        code_stages=code_stages(cfg),
        apparmor_unconfined=apparmor.exists() and apparmor.read_text().strip().startswith("Y"),
    )


def _caller() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def _outermost(mounts: list[Mount]) -> list[Mount]:
    """Drop a mount that another already provides: the same path, or a path inside a
    read-write mount, or a read-only path inside a read-only one (an input kept inside the
    run). A read-write mount inside a read-only one stays (the default store inside a project
    whose data is mounted read-only): Docker stacks nested binds."""
    keep: list[Mount] = []
    for m in sorted(mounts, key=lambda m: (len(m.target), m.read_only)):
        covered = any(
            m.target == k.target
            or (
                m.target.startswith(k.target.rstrip("/") + "/") and (m.read_only or not k.read_only)
            )
            for k in keep
        )
        if not covered:
            keep.append(m)
    return keep


def image_user(client: Any, image: str) -> tuple[int, int] | None:
    """The numeric (uid, gid) an image declares, None for root or a user name."""
    user = (client.images.get(image).attrs.get("Config") or {}).get("User") or ""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or int(uid) == 0:
        return None
    return int(uid), int(gid) if gid.isdigit() else int(uid)


def check_machine(plan: DockerPlan) -> tuple[int, int] | None:
    """Check, before anything of the run is written: the engine answers, every image is here,
    the images declare one numeric non-root uid (returned; None when the tasks run as another
    user), and that uid can read every input. Raises DockerSetupError with the fix."""
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
    stages_of: dict[str, list[str]] = {}
    for stage, image in sorted(plan.images.items()):
        stages_of.setdefault(image, []).append(stage)
    missing = []
    for image, stages in stages_of.items():  # each image once (init runs on the train image)
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing.append(f"{image} ({', '.join(stages)})")
    if missing:
        raise DockerSetupError(
            f"images not on this machine: {', '.join(missing)}. Build them with "
            "`FLAVOR=cpu images/build.sh REGISTRY TAG` (images/smoke.py shows a whole run) and "
            "pass the `--set cluster.image_repo=... --set cluster.image_tag=...` it prints"
        )
    if plan.user is None:
        if os.geteuid() != 0:
            raise _needs_root("the images' uid")
        users = {image_user(client, image) for image in plan.images.values()}
        if None in users or len(users) != 1:
            raise DockerSetupError(
                f"the images declare {sorted(map(str, users))} as their users; rlvr runs them "
                "as one numeric non-root uid: rebuild with images/build.sh, or pass "
                "--docker-user UID:GID"
            )
        (owner,) = users
        for m in plan.mounts:
            if m.read_only:
                _check_readable(Path(m.source), *owner)
        return owner
    return None


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


def _needs_root(who: str) -> DockerSetupError:
    return DockerSetupError(
        f"only root can hand the run directory to {who}: run the containers as you "
        f"(--docker-user host, what a non-root caller gets by default), or run as root"
    )


def hand_over(run_root: Path, owner: tuple[int, int]) -> None:
    """Make the run directory the tasks' own: a root caller chowns it to the images' uid (the
    cluster's pods write the store as that uid too). A non-root caller cannot: the directories
    it makes for the run (the pipeline root, the failure markers) would stay its own."""
    uid, gid = owner
    if os.geteuid() != 0:
        raise _needs_root(f"uid {uid}")
    run_root.mkdir(parents=True, exist_ok=True)
    root = run_root.resolve()
    for path in [root, *root.rglob("*")]:  # rglob does not descend into symlinked directories
        with contextlib.suppress(FileNotFoundError):
            os.lchown(path, uid, gid)


_live: set[Any] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


def stop_live_containers() -> None:
    """Stop and remove every task container, all at once (SIGTERM through the containers'
    init, SIGKILL after 10 s); a container created after this call is removed at once."""
    _stopping.set()
    with _live_lock:
        containers = list(_live)

    def stop(c) -> None:
        with contextlib.suppress(Exception):
            c.stop(timeout=10)
        with contextlib.suppress(Exception):
            c.remove(force=True)

    threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in containers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


TaskLog = Callable[[str], contextlib.AbstractContextManager[Callable[[str], None]]]
"""`open_log(task)`: a context whose value takes the task's output line by line."""


def make_container_runner(
    plan: DockerPlan,
    open_log: TaskLog,
    current_task: Callable[[], str],
    task_env: Callable[[str], dict[str, str]],
) -> Callable[..., int]:
    """`run(client, image, command, volumes, environment=...)`: the task's
    container with the plan's mounts, user, network and profile; its output line by line to
    the task's log; its exit status (the container is removed after, not auto-removed, so the
    status is never lost)."""

    def run_docker_container(client, image, command, volumes, **run_args) -> int:
        task = current_task()
        stage = stage_of(task)
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        env.update(task_env(task))
        env.update(run_args.pop("environment", None) or {})
        if plan.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(plan.pythonpath)
        if plan.user:  # another uid than the image's: its HOME (/home/rlvr) is not writable
            run_args["user"] = plan.user
            env["HOME"] = "/tmp"
        binds = [f"{src}:{spec['bind']}:{spec['mode']}" for src, spec in volumes.items()]
        binds += [f"{m.source}:{m.target}:{m.volume()['mode']}" for m in plan.mounts]
        security = []
        if stage in plan.code_stages:  # as on the cluster
            if plan.seccomp_profile:
                security.append(f"seccomp={plan.seccomp_profile}")
            if plan.apparmor_unconfined:
                security.append("apparmor=unconfined")
        if security:
            run_args["security_opt"] = security
        # KFP's command replaces the image's ENTRYPOINT, as a pod's `command` does; Docker would
        # append it to the entry point (`python -m components.train sh -c ...`). init: the
        # command's `sh` as PID 1 would ignore SIGTERM, so a stop would wait out its timeout.
        container = client.containers.create(
            image=image,
            entrypoint=list(command),
            command=[],
            volumes=binds,
            environment=env,
            network_mode=plan.network,
            cap_drop=["ALL"],
            init=True,
            labels={"rlvr.task": task},
            **run_args,
        )
        with _live_lock:
            _live.add(container)
        try:
            if _stopping.is_set():  # the run is being stopped: start nothing new
                return 1
            container.start()
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


def start_containers() -> None:
    """Let task containers start (after a stopped run, `stop_live_containers` refused them)."""
    _stopping.clear()
