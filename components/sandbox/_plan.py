"""The plan of a sandboxed run, computed in the parent before it forks: what of the host the
sandbox shows (read once per process), the uid the program runs as, its limits and its seccomp
filter. ``_child.py`` carries it out in the forked child.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import resource
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Literal

from components.sandbox.config import SandboxConfig

# mount(2) flags (linux/mount.h); the ST_* flags of statvfs(3) have the same values
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MNT_DETACH = 0x2
# flags a bind mount inherits locked from its source inside a user namespace: a
# read-only remount must repeat them or the kernel refuses it
MS_LOCKED = MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME

# Read-only parts of the host visible inside the sandbox (when they exist). Symlinks
# (``/bin -> usr/bin`` on merged-/usr systems) are recreated as symlinks.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEV_LINKS = (
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
)

# The uid a sandbox runs as in root mode, when not configured: a high, otherwise unused
# uid, distinct per sandbox so that concurrent sandboxes do not share a process budget
# (RLIMIT_NPROC counts all processes of a uid). 65534 (nobody) if that uid is not mapped. In userns mode the uid inside is USERNS_UID (the host sees the caller's).
_AUTO_UID_BASE = 2_000_000_000
_NOBODY = 65534
_SANDBOX_SEQ = itertools.count()
USERNS_UID = 1000

Mode = Literal["root", "userns"]


# -------------------------------------------------------------------------- the run plan


@dataclass(frozen=True)
class Plan:
    """Everything the forked child needs, computed in the parent (the child should do as
    little Python work as possible: it is a fork of a possibly multi-threaded process)."""

    mode: Mode
    nonce: str
    parent_pid: int
    netns: bool
    uid: int  # the uid the program runs as (inside the user namespace in userns mode)
    host_uid: int  # userns mode: the caller's uid and gid, which USERNS_UID maps to
    host_gid: int
    base: str  # the run's temp dir (host path, bound at the same path inside)
    work: str  # base/work: the writable tmpfs and the cwd
    newroot: str  # base/newroot: mount point of the new root
    symlinks: tuple[tuple[str, str], ...]  # (path, target)
    dirs: tuple[tuple[str, int], ...]  # host dirs bound read-only: (path, locked flags)
    submounts: tuple[tuple[str, int], ...]  # mounts below those, made read-only too
    devices: tuple[str, ...]
    cpu_s: int
    memory_bytes: int
    fsize_bytes: int
    workdir_mb: int
    nproc: int
    nofile: int
    max_fd: int
    seccomp: Any  # ctypes struct sock_fprog, built in the parent


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _Filter:
    """A seccomp program kept alive with the buffer it points to."""

    def __init__(self, program: bytes) -> None:
        self.buffer = ctypes.create_string_buffer(program, len(program))
        self.prog = _SockFprog(len(program) // 8, ctypes.addressof(self.buffer))


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


def _sandbox_uid(config: SandboxConfig, mode: Mode) -> int:
    if mode == "userns":
        return USERNS_UID
    if config.uid is not None:
        if config.uid == 0:
            raise ValueError("the sandbox uid must not be 0")
        return config.uid
    # one uid per sandbox, not per calling process: RLIMIT_NPROC counts every process of
    # a uid, so a fork bomb in one sandbox must not starve another one of the same caller
    # (an assert case's two processes, or concurrent threads). pid and a counter, both
    # bounded so that the uid stays below 2**32 - 1.
    uid = _AUTO_UID_BASE + (os.getpid() % (1 << 20)) * (1 << 11) + next(_SANDBOX_SEQ) % (1 << 11)
    return uid if _uid_mapped(uid) else _NOBODY


def interpreter(config: SandboxConfig) -> tuple[str, str]:
    """(executable, prefix): the interpreter to run and the directory tree it needs."""
    if config.python:
        import shutil

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


def locked_flags(path: str) -> int:
    try:
        return os.statvfs(path).f_flag & MS_LOCKED
    except OSError:
        return 0


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \\ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _submounts(roots: list[str]) -> tuple[tuple[str, int], ...]:
    """Mount points strictly below any of ``roots``: a recursive bind takes them along
    (inside a user namespace it must), and each needs its own read-only remount."""
    found: list[tuple[str, int]] = []
    try:
        with open("/proc/self/mountinfo") as f:
            points = [_unescape(line.split()[4]) for line in f if len(line.split()) > 4]
    except OSError:
        return ()
    for point in dict.fromkeys(points):
        if any(point.startswith(r.rstrip("/") + "/") for r in roots):
            found.append((point, locked_flags(point)))
    return tuple(sorted(found))


@dataclass(frozen=True)
class _HostLayout:
    """What of the host a sandbox shows: the same for every run with the same interpreter
    and extra paths, so it is read once per process (mount tables and statvfs, not per run)."""

    symlinks: tuple[tuple[str, str], ...]
    dirs: tuple[tuple[str, int], ...]
    submounts: tuple[tuple[str, int], ...]
    devices: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def _host_layout(prefix: str, extra_ro_paths: tuple[str, ...]) -> _HostLayout:
    symlinks: list[tuple[str, str]] = []
    dirs: list[str] = []
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    real_dirs = [os.path.realpath(d) for d in dirs]
    for extra in (prefix, *extra_ro_paths):
        real = os.path.realpath(extra)
        if os.path.isdir(real) and not _covered(real, real_dirs):
            dirs.append(real)
            real_dirs.append(real)
    return _HostLayout(
        symlinks=tuple(symlinks),
        dirs=tuple((d, locked_flags(d)) for d in dirs),
        submounts=_submounts(dirs),
        devices=tuple(d for d in _DEVICES if os.path.exists(d)),
    )


@functools.lru_cache(maxsize=4)
def _filter(program: bytes) -> _Filter:
    return _Filter(program)


def make_plan(
    config: SandboxConfig, base: str, netns: bool, prefix: str, mode: Mode, seccomp: bytes
) -> Plan:
    host = _host_layout(prefix, tuple(config.extra_ro_paths))
    cpu = config.cpu_s if config.cpu_s is not None else config.timeout_s + 1
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    max_fd = nofile_hard if 0 < nofile_hard <= (1 << 20) else (1 << 20)
    return Plan(
        mode=mode,
        nonce=secrets.token_hex(16),
        parent_pid=os.getpid(),
        netns=netns,
        uid=_sandbox_uid(config, mode),
        host_uid=os.geteuid(),
        host_gid=os.getegid(),
        base=base,
        work=os.path.join(base, "work"),
        newroot=os.path.join(base, "newroot"),
        symlinks=host.symlinks,
        dirs=host.dirs,
        submounts=host.submounts,
        devices=host.devices,
        cpu_s=max(1, int(-(-cpu // 1))),
        memory_bytes=config.memory_mb << 20,
        fsize_bytes=config.max_file_mb << 20,
        workdir_mb=config.workdir_mb,
        nproc=config.max_processes,
        nofile=config.max_open_files,
        max_fd=max_fd,
        seccomp=_filter(seccomp),
    )
