"""The syscall filter (seccomp-BPF) every sandboxed program runs under.

Why: namespaces and an unprivileged uid stop a program from *reaching* anything outside
its sandbox; the kernel's own attack surface is still there. Reviewed sandboxes
(bubblewrap and nsjail with a seccomp policy, Docker's default profile, gVisor) take away
the syscalls that untrusted code has no use for and that most kernel escapes go through.
This filter refuses, with ``EPERM``:

* new namespaces: ``unshare``, ``setns``, and ``clone`` with any ``CLONE_NEW*`` flag
  (``clone3`` answers ``ENOSYS``, so libc falls back to ``clone``, whose flags a filter
  can read; ``clone3`` passes them in memory, where it cannot);
* tracing and reading other processes: ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd``, ``kcmp``;
* mounts and roots: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount
  API (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``), ``open_by_handle_at``/``name_to_handle_at``;
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``;
* the kernel keyring: ``keyctl``, ``add_key``, ``request_key``;
* netlink sockets (``socket(AF_NETLINK, ...)``; other families are left to the network
  namespace);
* administration: module loading, ``kexec_*``, ``reboot``, ``swapon``/``swapoff``,
  ``syslog``, ``acct``, ``quotactl``, ``lookup_dcookie``, ``fanotify_init``, ``vhangup``,
  ``iopl``/``ioperm``.

A syscall made through another ABI than the native one (i386 or x32 on x86-64) kills the
process: the numbers above would mean something else there. Everything else is allowed
(a deny list: the programs are ordinary Python, and an allow list would break them on the
next interpreter release). The filter is built here, in the parent, and installed in the
sandbox process after it dropped its privileges, just before ``execve``; it is inherited
by every process the program starts and cannot be removed.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

__all__ = ["DENIED", "SUPPORTED_MACHINES", "build_filter"]

# syscall numbers by machine (x86_64: arch/x86/entry/syscalls; aarch64: asm-generic)
_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "unshare": 272,
        "setns": 308,
        "clone": 56,
        "clone3": 435,
        "socket": 41,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "pidfd_getfd": 438,
        "kcmp": 312,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "syslog": 103,
        "acct": 163,
        "quotactl": 179,
        "lookup_dcookie": 212,
        "fanotify_init": 300,
        "vhangup": 153,
        "iopl": 172,
        "ioperm": 173,
    },
    "aarch64": {
        "unshare": 97,
        "setns": 268,
        "clone": 220,
        "clone3": 435,
        "socket": 198,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "pidfd_getfd": 438,
        "kcmp": 272,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "syslog": 116,
        "acct": 89,
        "quotactl": 60,
        "lookup_dcookie": 18,
        "fanotify_init": 262,
        "vhangup": 58,
    },
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SUPPORTED_MACHINES = tuple(_NR)

# refused outright with EPERM (clone, clone3 and socket are decided by their arguments)
DENIED = tuple(name for name in _NR["x86_64"] if name not in ("clone", "clone3", "socket"))

_CLONE_NEW_ANY = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_AF_NETLINK = 16
_X32_SYSCALL_BIT = 0x40000000

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (arg0: low 32 bits, LE)


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


@functools.lru_cache(maxsize=8)
def build_filter(machine: str | None = None, allow: tuple[str, ...] = ()) -> bytes:
    """The filter program (``struct sock_filter[]`` as bytes) for ``machine`` (default:
    this one). Raises ``ValueError`` for a machine without a syscall table here; the
    sandbox then refuses to run code rather than run it unfiltered. ``allow`` takes
    names off the deny list (with ``unshare`` also ``clone`` with namespace flags): with
    ``SANDBOX_BUILDER_NEEDS`` it is the same policy as ``pod_profile``."""
    machine = machine or platform.machine()
    if machine not in _NR:
        raise ValueError(f"no seccomp syscall table for {machine!r} (supported: {', '.join(_NR)})")
    nr = _NR[machine]
    eperm = _RET_ERRNO | errno.EPERM
    denied = [nr[name] for name in DENIED if name in nr and name not in allow]
    clone_flags = 0 if "unshare" in allow else _CLONE_NEW_ANY
    # layout: arch check, load nr, [x32 check], one JEQ per denied syscall, then the
    # three argument checks; every jump target is the fixed tail below
    head = [
        _ins(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _ins(_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        _ins(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _ins(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        head += [_ins(_JGE_K, 0, 1, _X32_SYSCALL_BIT), _ins(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    # tail (indices relative to its start):
    #   0 ret ALLOW | 1 ret EPERM | 2 ret ENOSYS
    #   3 clone: ld arg0 | 4 jset NEW* -> EPERM | 5 ret ALLOW
    #   7 socket: ld arg0 | 8 jeq AF_NETLINK -> EPERM | 9 ret EPERM | 10 ret ALLOW
    n_checks = len(denied) + 3
    body: list[bytes] = []
    for i, number in enumerate(denied):
        to_eperm = n_checks - i - 1 + 1  # skip the remaining checks, land on tail[1]
        body.append(_ins(_JEQ_K, to_eperm, 0, number))
    base = len(denied)
    # clone -> tail[3], clone3 -> tail[2], socket -> tail[7]
    body.append(_ins(_JEQ_K, n_checks - base - 1 + 3, 0, nr["clone"]))
    body.append(_ins(_JEQ_K, n_checks - base - 2 + 2, 0, nr["clone3"]))
    body.append(_ins(_JEQ_K, n_checks - base - 3 + 7, 0, nr["socket"]))
    tail = [
        _ins(_RET_K, 0, 0, _RET_ALLOW),
        _ins(_RET_K, 0, 0, eperm),
        _ins(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        _ins(_LD_W_ABS, 0, 0, _OFF_ARG0),
        _ins(_JSET_K, 0, 1, clone_flags),
        _ins(_RET_K, 0, 0, eperm),
        _ins(_RET_K, 0, 0, _RET_ALLOW),
        _ins(_LD_W_ABS, 0, 0, _OFF_ARG0),
        _ins(_JEQ_K, 0, 1, _AF_NETLINK),
        _ins(_RET_K, 0, 0, eperm),
        _ins(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(head + body + tail)


# ------------------------------------------------------------------ the pod's own profile

# what the verifier process itself needs to build a sandbox without root (userns mode)
SANDBOX_BUILDER_NEEDS = ("unshare", "mount", "umount2", "pivot_root")
_OCI_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def pod_profile() -> dict:
    """The seccomp profile (OCI / Kubernetes ``Localhost`` JSON) for pods that run code
    rewards: the same refusals as the per-run filter, except the four calls that
    building a sandbox without root needs (``unshare``, ``mount``, ``umount2``,
    ``pivot_root``) and ``clone`` with namespace flags. The runtimes' default profiles
    refuse those without ``CAP_SYS_ADMIN``, which no baseline or restricted pod has;
    with this profile the pod stays non-root with every capability dropped, and the
    untrusted code inside each sandbox still runs under the stricter per-run filter.
    Generated: ``python -m components.sandbox pod-profile > FILE``."""
    names = sorted(
        {n for table in _NR.values() for n in table} & set(DENIED) - set(SANDBOX_BUILDER_NEEDS)
    )
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [_OCI_ARCH[m] for m in SUPPORTED_MACHINES],
        "syscalls": [
            {"names": names, **eperm},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            {
                "names": ["socket"],
                **eperm,
                "args": [{"index": 0, "value": _AF_NETLINK, "op": "SCMP_CMP_EQ"}],
            },
        ],
    }
