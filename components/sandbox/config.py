"""The sandbox's configuration and results (plain data, shared by both sides)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
