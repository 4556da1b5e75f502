"""A throwaway Linux sandbox for running untrusted Python (model-written code) once.

Why: the code verifier executes whatever the policy wrote. Under RL the policy is rewarded
for whatever passes, so the sandbox must hold against code that loops forever, forks,
allocates without bound, floods stdout, ignores SIGTERM, talks to the network, writes
outside its directory or reads the verifier's secrets -- by accident or as a reward hack.
Only the standard library is used (``ctypes`` for the few syscalls ``os`` lacks on 3.11).

What ``run_python`` does for one run (see docs/verifiers.md, "Code sandbox"):

* A fresh process per run: ``python -I -S -B -X utf8 main.py`` (isolated mode, no
  ``site``, no bytecode writes) with a clean environment (``PATH``, ``LANG``/``LC_ALL``,
  ``HOME``/``TMPDIR`` pointing at the work dir; nothing inherited) in its own session.
* In ``preexec_fn`` (root only): new mount, PID, IPC, UTS and network namespaces. The
  Popen child stays outside as a small *waiter*; the process it forks is PID 1 of the new
  PID namespace, so when it dies the kernel kills every process the program started,
  including ones that called ``setsid`` to leave the process group.
* Filesystem: a new root (tmpfs) holding read-only bind mounts of ``/usr``, ``/etc``, the
  ``/bin``/``/lib`` links, a few ``/dev`` nodes, the interpreter's prefix and the run's
  temp directory, plus a fresh ``/proc``; the old root is detached (``pivot_root``). The
  only writable place is the work directory, a size-capped tmpfs owned by the sandbox
  uid, which vanishes with the namespace.
* Privileges: ``PR_SET_NO_NEW_PRIVS``, then ``setgroups([])``/``setresgid``/``setresuid``
  to an unprivileged uid (``RLIMIT_NPROC`` is not enforced for root, so this is what
  makes the process limit stop fork bombs). ``PR_SET_PDEATHSIG`` ties the sandbox to
  its waiter and the waiter to the calling thread.
* ``resource.setrlimit``: CPU seconds, address space, file size, processes, open files,
  no core dumps.
* In the parent: a wall-clock deadline after which the whole process group gets
  ``SIGKILL`` (whatever the program does with ``SIGTERM``), and stdout/stderr read with a
  byte cap per stream; a program that overflows it is killed.

Fail closed: ``capabilities()`` probes once per process whether this machine allows all
of that. If the sandbox cannot be built (e.g. not root, no ``CAP_SYS_ADMIN``),
``run_python`` raises ``SandboxUnavailable`` and never runs the code unconfined. If only
the network namespace is refused, it also raises unless the config sets
``allow_network_fallback=True`` (then the code runs with the host's network).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Capabilities",
    "RunResult",
    "SandboxConfig",
    "SandboxUnavailable",
    "capabilities",
    "check_available",
    "clear_capabilities_cache",
    "probe",
    "run_python",
]

# clone(2) / unshare(2) flags (linux/sched.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# mount(2) flags (linux/mount.h)
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_MOVE = 0x2000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MNT_DETACH = 0x2

# prctl(2)
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

# pivot_root has no glibc wrapper; syscall numbers by architecture (others fall back to
# MS_MOVE + chroot, which is equivalent once the sandbox has dropped every capability)
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "riscv64": 41}

# Exit status the child uses when building the sandbox failed (paired with a marker line
# on stderr that carries a per-run nonce, so the sandboxed program cannot fake it).
_SETUP_FAILED = 121

# Read-only parts of the host visible inside the sandbox (when they exist). Symlinks
# (``/bin -> usr/bin`` on merged-/usr systems) are recreated as symlinks.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEV_LINKS = (
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
)

# The uid a sandbox runs as, when not configured: a high, otherwise unused uid, distinct
# per calling process so that concurrent verifier workers do not share a process budget
# (RLIMIT_NPROC counts all processes of a uid). 65534 (nobody) if that uid is not mapped.
_AUTO_UID_BASE = 2_000_000_000
_NOBODY = 65534

_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built on this machine (or for this config); no code ran."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and policy for one sandboxed run.

    ``timeout_s`` is the wall-clock limit; ``cpu_s`` the CPU-time limit (default: the
    wall limit rounded up, plus one second). ``memory_mb`` caps the address space
    (``RLIMIT_AS``), ``max_file_mb`` the size of any one file written, ``workdir_mb`` the
    total size of the writable work directory, ``max_output_bytes`` each of stdout and
    stderr. ``allow_network_fallback`` lets code run *with network access* where no
    network namespace can be created (default: refuse). ``uid`` is the unprivileged uid
    to run as (default: automatic, see module docs); ``python`` the interpreter (default:
    the running one's base interpreter); ``extra_ro_paths`` more host paths to expose
    read-only.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    cpu_s: float | None = None
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 16
    workdir_mb: int = 64
    max_processes: int = 32
    max_open_files: int = 64
    allow_network_fallback: bool = False
    uid: int | None = None
    python: str | None = None
    extra_ro_paths: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("memory_mb", "max_output_bytes", "max_file_mb", "workdir_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_processes < 1 or self.max_open_files < 8:
            raise ValueError("max_processes must be >= 1 and max_open_files >= 8")


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run.

    ``returncode`` is the program's exit status, or ``128 + N`` when signal ``N`` ended
    it (``137`` after the wall-clock kill). ``timed_out`` / ``output_exceeded`` say that
    the parent killed it. ``pid`` is the sandbox's top process, which is also its process
    group id; ``uid`` the uid the program ran as.
    """

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    output_exceeded: bool
    duration_s: float
    pid: int
    uid: int
    network_isolated: bool


@dataclass(frozen=True)
class Capabilities:
    """What ``probe`` found: whether the sandbox can be built here (``available``) and
    whether it gets its own network namespace; ``reason`` explains what is missing."""

    available: bool
    network_isolated: bool
    reason: str | None = None


# ------------------------------------------------------------------------------ syscalls


def _load_libc() -> ctypes.CDLL | None:
    """glibc/musl with the prototypes we call; None off Linux (the sandbox then reports
    itself unavailable instead of breaking imports)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        c_str, c_ulong = ctypes.c_char_p, ctypes.c_ulong
        libc.mount.argtypes = [c_str, c_str, c_str, c_ulong, ctypes.c_void_p]
        libc.umount2.argtypes = [c_str, ctypes.c_int]
        libc.unshare.argtypes = [ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int, c_ulong, c_ulong, c_ulong, c_ulong]
        libc.syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None
    return libc


_LIBC: Any = _load_libc()


class _SetupError(Exception):
    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step


def _check(ret: int, step: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise _SetupError(step, f"{os.strerror(err)} (errno {err})")


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    ret = _LIBC.mount(_b(src), _b(dst), _b(fstype), flags, _b(data))
    _check(ret, f"mount {dst}")


# -------------------------------------------------------------------------- the run plan


@dataclass(frozen=True)
class _Plan:
    """Everything the forked child needs, computed in the parent (the child should do as
    little Python work as possible: it is a fork of a possibly multi-threaded process)."""

    nonce: str
    parent_pid: int
    netns: bool
    uid: int
    base: str  # the run's temp dir (host path, bound at the same path inside)
    work: str  # base/work: the writable tmpfs and the cwd
    newroot: str  # base/newroot: mount point of the new root
    symlinks: tuple[tuple[str, str], ...]  # (path, target)
    dirs: tuple[str, ...]  # host dirs bound read-only at the same path
    devices: tuple[str, ...]
    cpu_s: int
    memory_bytes: int
    fsize_bytes: int
    workdir_mb: int
    nproc: int
    nofile: int
    max_fd: int


def _uid_mapped(uid: int) -> bool:
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                if inside <= uid < inside + count:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _sandbox_uid(config: SandboxConfig) -> int:
    if config.uid is not None:
        if config.uid == 0:
            raise ValueError("the sandbox uid must not be 0")
        return config.uid
    uid = _AUTO_UID_BASE + os.getpid()
    return uid if _uid_mapped(uid) else _NOBODY


def _interpreter(config: SandboxConfig) -> tuple[str, str]:
    """(executable, prefix): the interpreter to run and the directory tree it needs."""
    if config.python:
        exe = shutil.which(config.python) or config.python
        exe = os.path.realpath(exe)
        return exe, os.path.dirname(os.path.dirname(exe))
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe.startswith(prefix + os.sep):
        prefix = os.path.dirname(os.path.dirname(exe))
    return exe, prefix


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _make_plan(config: SandboxConfig, base: str, netns: bool, prefix: str) -> _Plan:
    symlinks: list[tuple[str, str]] = []
    dirs: list[str] = []
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    real_dirs = [os.path.realpath(d) for d in dirs]
    for extra in (prefix, *config.extra_ro_paths):
        real = os.path.realpath(extra)
        if os.path.isdir(real) and not _covered(real, real_dirs):
            dirs.append(real)
            real_dirs.append(real)
    cpu = config.cpu_s if config.cpu_s is not None else config.timeout_s + 1
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    max_fd = nofile_hard if 0 < nofile_hard <= (1 << 20) else (1 << 20)
    return _Plan(
        nonce=secrets.token_hex(16),
        parent_pid=os.getpid(),
        netns=netns,
        uid=_sandbox_uid(config),
        base=base,
        work=os.path.join(base, "work"),
        newroot=os.path.join(base, "newroot"),
        symlinks=tuple(symlinks),
        dirs=tuple(dirs),
        devices=tuple(d for d in _DEVICES if os.path.exists(d)),
        cpu_s=max(1, int(-(-cpu // 1))),
        memory_bytes=config.memory_mb << 20,
        fsize_bytes=config.max_file_mb << 20,
        workdir_mb=config.workdir_mb,
        nproc=config.max_processes,
        nofile=config.max_open_files,
        max_fd=max_fd,
    )


# ------------------------------------------------------------------ child side (preexec)


def _preexec(plan: _Plan) -> None:
    """Runs in the Popen child (root, new session, cwd = work, pipes on 0/1/2).

    Unshares the namespaces, forks the process that becomes the sandbox, and turns
    itself into the waiter, which never returns. The sandbox process builds its root,
    drops privileges and returns, after which subprocess execs the interpreter.
    """
    step = "start"
    try:
        step = "prctl(PR_SET_PDEATHSIG)"
        _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), step)
        if os.getppid() != plan.parent_pid:
            os._exit(_SETUP_FAILED)  # the caller is already gone
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if plan.netns:
            flags |= CLONE_NEWNET
        step = "unshare(namespaces)" if not plan.netns else "unshare(namespaces incl. network)"
        _check(_LIBC.unshare(flags), step)
        step = "fork"
        # SIGTERM stays blocked across the fork until the waiter has its handler
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
    except BaseException as exc:  # report anything, never return
        _setup_failed(plan, step, exc)
    if pid:
        _wait_and_exit(plan, pid)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        _build_sandbox(plan)
    except BaseException as exc:
        _setup_failed(plan, "setup", exc)


def _setup_failed(plan: _Plan, step: str, exc: BaseException) -> None:
    msg = str(exc) if isinstance(exc, _SetupError) else f"{step}: {type(exc).__name__}: {exc}"
    try:
        os.write(2, f"\n{plan.nonce}:{msg}\n".encode(errors="replace"))
    finally:
        os._exit(_SETUP_FAILED)


def _wait_and_exit(plan: _Plan, pid: int) -> None:
    """The waiter: hold no file descriptors (so the caller sees EOF on the pipes as soon
    as the sandbox is gone), reap the sandbox and exit with its status. SIGTERM makes it
    SIGKILL the sandbox (PID 1 of its namespace, so everything in there dies) and still
    reap it, so that no zombie is left to the host's init."""
    code = _SETUP_FAILED
    try:

        def kill_sandbox(signum: int, frame: object) -> None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already exited and reaped

        signal.signal(signal.SIGTERM, kill_sandbox)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.closerange(0, plan.max_fd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            code = 128 - code
    except BaseException:
        pass
    os._exit(code)


def _build_sandbox(plan: _Plan) -> None:
    """In the sandbox process: PID 1 of the new PID namespace, still root."""
    os.umask(0o022)
    _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # nothing we mount may propagate back to the host
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    nr = plan.newroot
    _mount("tmpfs", nr, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m,nr_inodes=1024")
    readonly: list[tuple[str, int]] = [("/", _MS_NODEV)]
    for path, target in plan.symlinks:
        os.symlink(target, nr + path)
    for path in plan.dirs:
        os.makedirs(nr + path, exist_ok=True)
        _mount(path, nr + path, None, _MS_BIND, None)
        readonly.append((path, _MS_NODEV))
    os.makedirs(nr + "/dev", exist_ok=True)
    for dev in plan.devices:
        os.close(os.open(nr + dev, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(dev, nr + dev, None, _MS_BIND, None)
        readonly.append((dev, 0))
    for path, target in _DEV_LINKS:
        os.symlink(target, nr + path)
    # the run's directory (main.py and friends) and the writable work dir inside it
    os.makedirs(nr + plan.base, exist_ok=True)
    _mount(plan.base, nr + plan.base, None, _MS_BIND, None)
    readonly.append((plan.base, _MS_NODEV))
    _mount(
        "tmpfs",
        nr + plan.work,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"mode=0700,uid={plan.uid},gid={plan.uid},size={plan.workdir_mb}m,nr_inodes=4096",
    )
    os.mkdir(nr + "/proc", 0o555)
    os.mkdir(nr + "/.oldroot", 0o700)
    _switch_root(nr)
    # a /proc that shows only this PID namespace
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    readonly.append(("/proc", _MS_NODEV | _MS_NOEXEC))
    for path, extra in readonly:
        _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | extra, None)
    os.chdir(plan.work)
    # resource limits (RLIMIT_NPROC takes effect once we are not root any more)
    for res, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, plan.cpu_s),
        (resource.RLIMIT_AS, plan.memory_bytes),
        (resource.RLIMIT_FSIZE, plan.fsize_bytes),
        (resource.RLIMIT_NOFILE, plan.nofile),
        (resource.RLIMIT_NPROC, plan.nproc),
    ):
        hard = value + 1 if res == resource.RLIMIT_CPU else value
        resource.setrlimit(res, (value, hard))
    _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.setgroups([])
    os.setresgid(plan.uid, plan.uid, plan.uid)
    os.setresuid(plan.uid, plan.uid, plan.uid)
    # changing credentials cleared the parent-death signal: set it again
    _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _switch_root(newroot: str) -> None:
    nr = _PIVOT_ROOT_NR.get(platform.machine())
    os.chdir(newroot)
    if nr is not None:
        _check(_LIBC.syscall(nr, _b(newroot), _b(newroot + "/.oldroot")), "pivot_root")
        os.chdir("/")
        _check(_LIBC.umount2(b"/.oldroot", _MNT_DETACH), "umount old root")
        os.rmdir("/.oldroot")
    else:
        _mount(newroot, "/", None, _MS_MOVE, None)
        os.chroot(".")
        os.chdir("/")
        os.rmdir("/.oldroot")


# ---------------------------------------------------------------------------- parent side


def _env(work: str) -> dict[str, str]:
    return {
        "PATH": _SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": work,
        "TMPDIR": work,
    }


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait (without reaping, so the process group id stays reserved) until ``pid``
    exits or the deadline passes; True if it exited."""
    delay = 0.0005
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 0.02)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run early: ask the waiter to kill the sandbox (which takes every process in
    its PID namespace along), then SIGKILL the whole process group as a backstop."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    _wait_unreaped(proc.pid, time.monotonic() + 2.0)
    _kill_group(proc.pid)


def _communicate(
    proc: subprocess.Popen[bytes], stdin: bytes, cap: int, deadline: float
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read stdout/stderr (each capped at ``cap`` bytes) until both close,
    the deadline passes or a cap is hit. Returns (out, err, timed_out, exceeded)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    timed_out = exceeded = False
    sel = selectors.DefaultSelector()
    try:
        view = memoryview(stdin)
        sent = 0
        if stdin:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _events in sel.select(remaining):
                fd = key.fd
                if fd in bufs:
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(fd)
                        continue
                    buf = bufs[fd]
                    room = cap - len(buf)
                    buf += data[:room]
                    if len(data) > room:
                        exceeded = True
                else:
                    try:
                        sent += os.write(fd, view[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        sent = len(view)
                    if sent >= len(view):
                        sel.unregister(fd)
                        proc.stdin.close()
            if exceeded:
                break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, exceeded


def _run(
    code: str,
    config: SandboxConfig,
    *,
    netns: bool,
    stdin: bytes = b"",
    files: dict[str, str] | None = None,
) -> RunResult:
    exe, prefix = _interpreter(config)
    base = os.path.realpath(tempfile.mkdtemp(prefix="rlvr-sandbox-"))
    try:
        os.chmod(base, 0o755)
        main = os.path.join(base, "main.py")
        for name, text in {"main.py": code, **(files or {})}.items():
            if os.sep in name or name in ("work", "newroot") or name.startswith("."):
                raise ValueError(f"invalid sandbox file name {name!r}")
            path = os.path.join(base, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)
        plan = _make_plan(config, base, netns, prefix)
        os.mkdir(plan.work, 0o755)
        os.mkdir(plan.newroot, 0o700)
        argv = [exe, "-I", "-S", "-B", "-X", "utf8", main]
        start = time.monotonic()
        deadline = start + config.timeout_s
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=plan.work,
                env=_env(plan.work),
                start_new_session=True,
                close_fds=True,
                preexec_fn=functools.partial(_preexec, plan),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise _SetupError("start", f"{type(exc).__name__}: {exc}") from exc
        pgid = proc.pid
        try:
            out, err, timed_out, exceeded = _communicate(
                proc, stdin, config.max_output_bytes, deadline
            )
            if not (timed_out or exceeded) and not _wait_unreaped(proc.pid, deadline):
                timed_out = True
            if timed_out or exceeded:
                _stop(proc)
        finally:
            # the whole group, every time: stragglers that closed their pipes included
            _kill_group(pgid)
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        duration = time.monotonic() - start
        rc = proc.returncode
        rc = 128 - rc if rc < 0 else rc
        stderr = err.decode("utf-8", errors="replace")
        marker = f"\n{plan.nonce}:"
        if rc == _SETUP_FAILED and marker in stderr:
            detail = stderr.split(marker, 1)[1].strip()
            raise _SetupError(detail.split(":", 1)[0], detail.split(":", 1)[-1].strip())
        return RunResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=stderr,
            returncode=rc,
            timed_out=timed_out,
            output_exceeded=exceeded,
            duration_s=duration,
            pid=pgid,
            uid=plan.uid,
            network_isolated=netns,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- probe and public

_PROBE_CODE = "import os, socket\nprint('ok', os.getuid(), len(socket.if_nameindex()))\n"


def probe(config: SandboxConfig | None = None) -> Capabilities:
    """Try to build the sandbox on this machine (twice at most: with and without a
    network namespace) and report what works. Not cached; see ``capabilities``."""
    cfg = config or SandboxConfig()
    if _LIBC is None:
        return Capabilities(False, False, f"the code sandbox needs Linux (this is {sys.platform})")
    if os.geteuid() != 0:
        return Capabilities(
            False,
            False,
            f"the code sandbox needs root (CAP_SYS_ADMIN for namespaces and mounts, "
            f"CAP_SETUID to drop to an unprivileged uid); running as uid {os.geteuid()}",
        )
    probe_cfg = SandboxConfig(
        timeout_s=max(cfg.timeout_s, 10.0),
        memory_mb=max(cfg.memory_mb, 256),
        uid=cfg.uid,
        python=cfg.python,
        extra_ro_paths=cfg.extra_ro_paths,
    )

    def attempt(netns: bool) -> str | None:
        try:
            res = _run(_PROBE_CODE, probe_cfg, netns=netns)
        except (_SetupError, OSError, ValueError) as exc:
            return str(exc)
        if res.returncode != 0 or not res.stdout.startswith("ok "):
            return (
                f"probe program failed (exit {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-500:]}"
            )
        return None

    err_net = attempt(True)
    if err_net is None:
        return Capabilities(True, True)
    err = attempt(False)
    if err is None:
        return Capabilities(True, False, f"cannot create a network namespace ({err_net})")
    return Capabilities(False, False, f"cannot build the sandbox ({err})")


@functools.lru_cache(maxsize=8)
def _cached_capabilities(
    uid: int | None, python: str | None, extra: tuple[str, ...]
) -> Capabilities:
    return probe(SandboxConfig(uid=uid, python=python, extra_ro_paths=extra))


def capabilities(config: SandboxConfig | None = None) -> Capabilities:
    """``probe`` once per process (and per uid / interpreter / extra paths)."""
    cfg = config or SandboxConfig()
    return _cached_capabilities(cfg.uid, cfg.python, cfg.extra_ro_paths)


def clear_capabilities_cache() -> None:
    """Forget probe results (tests; or after the machine's permissions changed)."""
    _cached_capabilities.cache_clear()


def check_available(config: SandboxConfig | None = None) -> Capabilities:
    """Return the capabilities if code may run under ``config``; otherwise raise
    ``SandboxUnavailable`` saying what is missing (fail closed)."""
    cfg = config or SandboxConfig()
    caps = capabilities(cfg)
    if not caps.available:
        raise SandboxUnavailable(f"sandbox unavailable: {caps.reason}; refusing to run code")
    if not caps.network_isolated and not cfg.allow_network_fallback:
        raise SandboxUnavailable(
            f"sandbox unavailable: {caps.reason}; refusing to run code with network access "
            "(set allow_network_fallback=True only where the network is blocked by other "
            "means, e.g. a Kubernetes NetworkPolicy)"
        )
    return caps


def run_python(
    code: str,
    stdin: str | bytes = b"",
    config: SandboxConfig | None = None,
    *,
    files: dict[str, str] | None = None,
) -> RunResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox and return what happened.

    ``stdin`` is fed to the program; ``files`` (name -> text) are placed read-only next
    to ``main.py`` (the program finds them via ``__file__``). The program's cwd is the
    empty, writable work directory. Raises ``SandboxUnavailable`` when the sandbox
    cannot be built (nothing ran); anything the program does is reported in the result.
    """
    cfg = config or SandboxConfig()
    caps = check_available(cfg)
    data = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    try:
        return _run(code, cfg, netns=caps.network_isolated, stdin=data, files=files)
    except _SetupError as exc:
        raise SandboxUnavailable(f"sandbox setup failed: {exc}; the code did not run") from exc
