"""The child side of a sandboxed run: what the forked child does with the plan (``_plan.py``,
computed in the parent) before ``execve``.

Two modes, chosen by the parent (``mode`` of the plan):

* ``root``: the caller is root. ``unshare`` mount, PID, IPC, UTS and network namespaces;
  build the new root; then ``setresuid`` to an unprivileged uid of the host.
* ``userns``: the caller is any other user. ``unshare`` a *user* namespace together with
  the others; the child maps one uid inside (``plan.uid``) to the caller's own uid and
  gid (the only mapping an unprivileged process may write), which gives it the
  capabilities it needs to mount and pivot *inside* its namespaces only; those are gone
  at ``execve`` (the program runs as a non-zero uid with no file capabilities). The host
  sees the program as the caller's uid, so it is the PID namespace (it cannot name any
  host process), the mount namespace (it cannot reach any host file not bound read-only)
  and the syscall filter (no ``ptrace``, no new namespaces) that keep it from the caller.
  ``RLIMIT_NPROC`` is counted per user namespace and uid, so the process limit counts the
  sandbox's own processes, not the caller's.

Both modes end the same way: resource limits, ``PR_SET_NO_NEW_PRIVS``, the seccomp filter
(``seccomp.py``) last, then ``execve`` of the interpreter.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import resource
import signal
import sys
from typing import Any

from components.sandbox._plan import (
    DEV_LINKS,
    MNT_DETACH,
    MS_BIND,
    MS_MOVE,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    Mode,
    Plan,
    locked_flags,
)

# clone(2) / unshare(2) flags (linux/sched.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# prctl(2)
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

# pivot_root has no glibc wrapper; syscall numbers by architecture (others fall back to
# MS_MOVE + chroot, which is equivalent once the sandbox has dropped every capability)
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "riscv64": 41}

# Exit status the child uses when building the sandbox failed (paired with a marker line
# on stderr that carries a per-run nonce, so the sandboxed program cannot fake it).
SETUP_FAILED = 121


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


LIBC: Any = _load_libc()


class SetupError(Exception):
    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step


def _check(ret: int, step: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(step, f"{os.strerror(err)} (errno {err})")


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    ret = LIBC.mount(_b(src), _b(dst), _b(fstype), flags, _b(data))
    _check(ret, f"mount {dst}")


# ------------------------------------------------------------------ child side (preexec)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def preexec(plan: Plan) -> None:
    """Runs in the Popen child (new session, cwd = work, pipes on 0/1/2).

    Root mode: unshares the namespaces, forks the process that becomes the sandbox, and
    turns itself into the waiter, which never returns. Userns mode: forks a child that
    enters a new user namespace, writes that child's id maps from out here (inside
    gVisor a process may not write its own, and the caller of ``unshare`` is inside),
    and waits for it; the child unshares the other namespaces and forks the sandbox in
    turn. Either way the sandbox process builds its root, drops privileges and returns,
    after which subprocess execs the interpreter.
    """
    step = "start"
    try:
        step = "prctl(PR_SET_PDEATHSIG)"
        _check(LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), step)
        if os.getppid() != plan.parent_pid:
            os._exit(SETUP_FAILED)  # the caller is already gone
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if plan.netns:
            flags |= CLONE_NEWNET
        step = "unshare(namespaces" + (" incl. network)" if plan.netns else ")")
        if plan.mode == "root":
            _check(LIBC.unshare(flags), step)
        step = "fork"
        # SIGTERM stays blocked across the fork until the waiter has its handler
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if plan.mode == "userns":
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
        pid = os.fork()
    except BaseException as exc:  # report anything, never return
        _setup_failed(plan, step, exc)
    if plan.mode == "userns":
        if pid:
            _map_ids(plan, pid, ready_r, ready_w, go_r, go_w)
            _wait_and_exit(plan, pid, forward=True)
        _enter_user_namespace(plan, flags, step, ready_r, ready_w, go_r, go_w)
        pid = _fork_inner(plan)
        if pid:
            _wait_and_exit(plan, pid)
    elif pid:
        _wait_and_exit(plan, pid)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        _build_sandbox(plan)
    except BaseException as exc:
        _setup_failed(plan, "setup", exc)


def _map_ids(plan: Plan, pid: int, ready_r: int, ready_w: int, go_r: int, go_w: int) -> None:
    """Outer waiter, userns mode: once the child is in its user namespace, map the
    sandbox uid/gid to the caller's own (the one mapping an unprivileged process may
    write), then let the child go on. If the child failed, it reported why itself."""
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"u":
        return  # the child exited (and reported); the waiter passes its status on
    try:
        proc = f"/proc/{pid}"
        if os.path.exists(proc + "/setgroups"):  # gVisor has none, and needs none
            _write(proc + "/setgroups", "deny")
        _write(proc + "/uid_map", f"{plan.uid} {plan.host_uid} 1\n")
        _write(proc + "/gid_map", f"{plan.uid} {plan.host_gid} 1\n")
        os.write(go_w, b"g")
    except BaseException as exc:
        os.kill(pid, signal.SIGKILL)
        _setup_failed(plan, "user namespace id maps", exc)
    os.close(go_w)
    os.close(ready_r)


def _enter_user_namespace(
    plan: Plan, flags: int, step: str, ready_r: int, ready_w: int, go_r: int, go_w: int
) -> None:
    """Child, userns mode: new user namespace, wait for the maps, then the others."""
    try:
        os.close(ready_r)
        os.close(go_w)
        _check(LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        _check(LIBC.unshare(CLONE_NEWUSER), "unshare(user namespace)")
        os.write(ready_w, b"u")
        if os.read(go_r, 1) != b"g":
            os._exit(SETUP_FAILED)  # the waiter reported why
        os.close(ready_w)
        os.close(go_r)
        _check(LIBC.unshare(flags), step)
    except BaseException as exc:
        _setup_failed(plan, "user namespace", exc)


def _fork_inner(plan: Plan) -> int:
    try:
        return os.fork()
    except BaseException as exc:
        _setup_failed(plan, "fork", exc)
        raise  # unreachable: _setup_failed exits


def _setup_failed(plan: Plan, step: str, exc: BaseException) -> None:
    msg = str(exc) if isinstance(exc, SetupError) else f"{step}: {type(exc).__name__}: {exc}"
    try:
        os.write(2, f"\n{plan.nonce}:{msg}\n".encode(errors="replace"))
    finally:
        os._exit(SETUP_FAILED)


def _wait_and_exit(plan: Plan, pid: int, forward: bool = False) -> None:
    """The waiter: hold no file descriptors (so the caller sees EOF on the pipes as soon
    as the sandbox is gone), reap the sandbox and exit with its status. SIGTERM makes it
    SIGKILL the sandbox (PID 1 of its namespace, so everything in there dies) and still
    reap it, so that no zombie is left to the host's init. ``forward`` (the outer waiter
    in userns mode): pass SIGTERM on to the inner waiter, which does that. (If the caller
    itself dies, PR_SET_PDEATHSIG kills waiter and sandbox, and the host's init reaps
    them.)"""
    code = SETUP_FAILED
    try:

        def kill_sandbox(signum: int, frame: object) -> None:
            try:
                os.kill(pid, signal.SIGTERM if forward else signal.SIGKILL)
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


def _build_sandbox(plan: Plan) -> None:
    """In the sandbox process: PID 1 of the new PID namespace, with the capabilities of
    root (of the host in root mode, of its own user namespace in userns mode)."""
    os.umask(0o022)
    _check(LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # nothing we mount may propagate back to the host
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    nr = plan.newroot
    _mount("tmpfs", nr, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=1024")
    readonly: list[tuple[str, int]] = [("/", MS_NODEV)]
    for path, target in plan.symlinks:
        os.symlink(target, nr + path)
    for path, locked in plan.dirs:
        os.makedirs(nr + path, exist_ok=True)
        _mount(path, nr + path, None, MS_BIND | MS_REC, None)
        readonly.append((path, MS_NODEV | locked))
    os.makedirs(nr + "/dev", exist_ok=True)
    for dev in plan.devices:
        os.close(os.open(nr + dev, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(dev, nr + dev, None, MS_BIND, None)
        readonly.append((dev, locked_flags(dev)))
    for path, target in DEV_LINKS:
        os.symlink(target, nr + path)
    # the run's directory (main.py and friends) and the writable work dir inside it
    os.makedirs(nr + plan.base, exist_ok=True)
    # not recursive: the new root itself is mounted below base (base/newroot)
    _mount(plan.base, nr + plan.base, None, MS_BIND, None)
    readonly.append((plan.base, MS_NODEV | locked_flags(plan.base)))
    readonly.extend((path, MS_NODEV | locked) for path, locked in plan.submounts)
    _mount(
        "tmpfs",
        nr + plan.work,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"mode=0700,uid={plan.uid},gid={plan.uid},size={plan.workdir_mb}m,nr_inodes=4096",
    )
    os.mkdir(nr + "/proc", 0o555)
    os.mkdir(nr + "/.oldroot", 0o700)
    if _switch_root(nr, plan.mode):
        readonly.append(("/proc", MS_NODEV | MS_NOEXEC))
    for path, extra in readonly:
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | extra, None)
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
    _check(LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if plan.mode == "root":
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
        # changing credentials cleared the parent-death signal: set it again
        _check(LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # userns mode: the uid is already USERNS_UID (not 0 in the namespace), so execve
    # clears every capability; nothing to drop here
    prog = plan.seccomp.prog
    _check(
        LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def _mount_proc(mode: Mode) -> bool:
    """A /proc that shows only this PID namespace. Inside a user namespace the kernel
    allows it only while a fully visible /proc of the host is still mounted in this mount
    namespace (so: before the old root is detached), and not at all where the host's
    /proc has masked entries (a container's): then the sandbox goes without /proc, which
    takes functionality away and no isolation. False when there is none."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    except SetupError:
        if mode == "root":
            raise
        return False
    return True


def _switch_root(newroot: str, mode: Mode) -> bool:
    """pivot_root into ``newroot``, mount /proc, detach the old root. Whether /proc is
    mounted."""
    nr = _PIVOT_ROOT_NR.get(platform.machine())
    os.chdir(newroot)
    if nr is not None:
        _check(LIBC.syscall(nr, _b(newroot), _b(newroot + "/.oldroot")), "pivot_root")
        os.chdir("/")
        has_proc = _mount_proc(mode)
        _check(LIBC.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
        os.rmdir("/.oldroot")
    else:
        _mount(newroot, "/", None, MS_MOVE, None)
        os.chroot(".")
        os.chdir("/")
        os.rmdir("/.oldroot")
        has_proc = _mount_proc(mode)
    return has_proc
