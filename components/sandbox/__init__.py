"""A throwaway Linux sandbox for running untrusted Python (model-written code) once.

Why: the code verifier executes whatever the policy wrote. Under RL the policy is rewarded
for whatever passes, so the sandbox must hold against code that loops forever, forks,
allocates without bound, floods stdout, ignores SIGTERM, talks to the network, writes
outside its directory or reads the verifier's secrets -- by accident or as a reward hack.
Only the standard library is used (``ctypes`` for the few syscalls ``os`` lacks on 3.11).
No root needed: as any user it builds its namespaces inside a user namespace of its own.

What one run does (see docs/verifiers.md, "Code sandbox"):

* A fresh process per run: ``python -I -S -B -X utf8 main.py`` (isolated mode, no
  ``site``, no bytecode writes) with a clean environment (``PATH``, ``LANG``/``LC_ALL``,
  ``HOME``/``TMPDIR`` pointing at the work dir; nothing inherited) in its own session.
* In ``preexec_fn``: new mount, PID, IPC, UTS and network namespaces, plus a user
  namespace when the caller is not root (``_child.py`` explains both modes). The Popen
  child stays outside as a small *waiter*; the process it forks is PID 1 of the new PID
  namespace, so when it dies the kernel kills every process the program started,
  including ones that called ``setsid`` to leave the process group.
* Filesystem: a new root (tmpfs) holding read-only bind mounts of ``/usr``, ``/etc``, the
  ``/bin``/``/lib`` links, a few ``/dev`` nodes, the interpreter's prefix and the run's
  temp directory, plus a fresh ``/proc``; the old root is detached (``pivot_root``). The
  only writable place is the work directory, a size-capped tmpfs owned by the sandbox
  uid, which vanishes with the namespace.
* Privileges: an unprivileged uid (root mode: ``setresuid`` to an unused uid; userns
  mode: a non-zero uid inside the namespace), ``PR_SET_NO_NEW_PRIVS``, and a seccomp
  filter (``seccomp.py``) that refuses new namespaces, ``ptrace``, mounts, ``bpf``,
  keyrings, ``perf_event_open``, ``io_uring`` and netlink. ``PR_SET_PDEATHSIG`` ties the
  sandbox to its waiter and the waiter to the calling thread.
* ``resource.setrlimit``: CPU seconds, address space, file size, processes, open files,
  no core dumps.
* In the parent: a wall-clock deadline after which the whole process group gets
  ``SIGKILL`` (whatever the program does with ``SIGTERM``), and stdout/stderr read with a
  byte cap per stream; a program that overflows it is killed.

``run_python`` runs a program to completion over stdin/stdout; ``Process`` keeps one
running with a framed message channel (the code verifier's call server and test runner).

Fail closed: ``capabilities()`` probes once per process whether this machine allows all
of that. If the sandbox cannot be built (no user namespaces for a non-root caller, a
container's seccomp profile refusing ``unshare``, an architecture without a syscall
table), ``run_python`` raises ``SandboxUnavailable`` and never runs the code unconfined.
If only the network namespace is refused, it also raises unless the config sets
``allow_network_fallback=True`` (then the code runs with the host's network).
"""

from components.sandbox._process import (
    ChannelClosed,
    ChannelOverflow,
    ChannelTimeout,
    Process,
)
from components.sandbox._run import (
    capabilities,
    check_available,
    clear_capabilities_cache,
    mode,
    probe,
    run_python,
)
from components.sandbox.config import (
    Capabilities,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
)

__all__ = [
    "ChannelClosed",
    "ChannelOverflow",
    "ChannelTimeout",
    "Process",
    "mode",
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
