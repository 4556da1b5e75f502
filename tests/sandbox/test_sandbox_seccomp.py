"""The syscall filter: the program itself (interpreted here, instruction by instruction,
for both supported machines and every syscall in their tables) and its effect inside a
real sandbox (each refused family answers EPERM; ordinary Python still works)."""

from __future__ import annotations

import errno
import json
import platform
import struct

import pytest

from components import sandbox
from components.sandbox import seccomp

CAPS = sandbox.capabilities()
ENFORCED = CAPS.available and CAPS.network_isolated
ALLOW, KILL = "allow", "kill"


def evaluate(program: bytes, arch: int, nr: int, arg0: int = 0) -> str | int:
    """Run a classic-BPF seccomp program on one syscall; "allow", "kill" or the errno.
    Covers the instructions the filter uses (LD W ABS, JEQ/JGE/JSET K, RET K)."""
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    for _ in range(len(insns) + 1):
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            action = k & 0xFFFF0000
            if action == 0x7FFF0000:
                return ALLOW
            if action == 0x80000000:
                return KILL
            assert action == 0x00050000, hex(k)
            return k & 0xFFFF
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        assert 0 <= pc < len(insns), "jump out of the program"
    raise AssertionError("program did not return")


@pytest.mark.parametrize("machine", seccomp.SUPPORTED_MACHINES)
def test_filter_decides_every_syscall_as_documented(machine: str) -> None:
    prog = seccomp.build_filter(machine)
    table = seccomp._NR[machine]
    arch = seccomp._AUDIT_ARCH[machine]
    for name in seccomp.DENIED:
        if name in table:
            assert evaluate(prog, arch, table[name]) == errno.EPERM, name
    clone, socket_nr = table["clone"], table["socket"]
    assert evaluate(prog, arch, table["clone3"]) == errno.ENOSYS
    # fork/threads (no namespace flags) pass; any CLONE_NEW* flag is refused
    for flags in (0x11, 0x003D0F00):  # SIGCHLD (fork); CLONE_VM|FS|FILES|SIGHAND|THREAD|...
        assert evaluate(prog, arch, clone, flags) == ALLOW
    for flag in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):
        assert evaluate(prog, arch, clone, flag | 0x11) == errno.EPERM, hex(flag)
    assert evaluate(prog, arch, socket_nr, 16) == errno.EPERM  # AF_NETLINK
    for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6: left to the network namespace
        assert evaluate(prog, arch, socket_nr, family) == ALLOW
    denied_nrs = {table[n] for n in seccomp.DENIED if n in table} | {clone, socket_nr}
    for nr in range(0, 460):  # every other syscall number is allowed
        if nr not in denied_nrs and nr != table["clone3"]:
            assert evaluate(prog, arch, nr) == ALLOW, nr
    # another ABI (i386 / arm32 compat) is killed, whatever the number
    assert evaluate(prog, 0x40000003, table["unshare"]) == KILL
    assert evaluate(prog, 0x40000028, 1) == KILL
    if machine == "x86_64":  # the x32 ABI sets bit 30 of the number
        assert evaluate(prog, arch, 0x40000000 | 39) == KILL


def test_unknown_machine_is_refused() -> None:
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        seccomp.build_filter("sparc64")


PROBES = r"""
import ctypes, errno, json, os, socket, sys, threading, subprocess
nr = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(nr[name], *[ctypes.c_long(a) for a in args])
    return "ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
out = {
    "unshare(NEWUSER)": call("unshare", 0x10000000),
    "unshare(NEWNET)": call("unshare", 0x40000000),
    "clone(NEWUSER)": call("clone", 0x10000000 | 17, 0, 0, 0, 0),
    "setns": call("setns", 0, 0),
    "ptrace(TRACEME)": call("ptrace", 0, 0, 0, 0),
    "process_vm_readv": call("process_vm_readv", 1, 0, 0, 0, 0, 0),
    "mount": call("mount", 0, 0, 0, 0, 0),
    "umount2": call("umount2", 0, 0),
    "pivot_root": call("pivot_root", 0, 0),
    "chroot": call("chroot", 0),
    "fsopen": call("fsopen", 0, 0),
    "open_tree": call("open_tree", -100, 0, 0),
    "bpf": call("bpf", 0, 0, 0),
    "keyctl": call("keyctl", 0, 0),
    "add_key": call("add_key", 0, 0, 0, 0, 0),
    "request_key": call("request_key", 0, 0, 0, 0),
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "init_module": call("init_module", 0, 0, 0),
    "kexec_load": call("kexec_load", 0, 0, 0, 0),
    "open_by_handle_at": call("open_by_handle_at", 0, 0, 0),
}
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    out["socket(AF_NETLINK)"] = "ok"
except OSError as e:
    out["socket(AF_NETLINK)"] = errno.errorcode[e.errno]
# ordinary Python still works: fork, threads, a child process, local sockets
pid = os.fork()
if pid == 0:
    os._exit(7)
ok = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
t = threading.Thread(target=lambda: None); t.start(); t.join()
a, b = socket.socketpair(); a.sendall(b"x"); ok = ok and b.recv(1) == b"x"
ok = ok and subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True).stdout == b"42\n"
socket.socket(socket.AF_INET).close()
print(json.dumps({"refused": out, "ordinary": ok}))
"""


@pytest.mark.skipif(not ENFORCED, reason=f"no sandbox here: {CAPS.reason}")
def test_each_family_is_refused_inside_the_sandbox() -> None:
    table = seccomp._NR[platform.machine()]
    res = sandbox.run_python(PROBES, json.dumps(table), sandbox.SandboxConfig(timeout_s=20))
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["ordinary"] is True
    assert report["refused"] == {name: "EPERM" for name in report["refused"]}
    assert len(report["refused"]) == 23


@pytest.mark.parametrize("machine", seccomp.SUPPORTED_MACHINES)
def test_pod_profile_and_its_filter_agree(machine: str) -> None:
    # the shipped Localhost profile (JSON, for the container runtime) and the BPF program
    # built with the same exceptions decide every syscall the same way
    profile = seccomp.pod_profile()
    prog = seccomp.build_filter(machine, allow=seccomp.SANDBOX_BUILDER_NEEDS)
    table = seccomp._NR[machine]
    arch = seccomp._AUDIT_ARCH[machine]
    refused = set(profile["syscalls"][0]["names"])
    assert profile["syscalls"][1] == {
        "names": ["clone3"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": errno.ENOSYS,
    }
    assert profile["syscalls"][2]["args"] == [{"index": 0, "value": 16, "op": "SCMP_CMP_EQ"}]
    for name, nr in table.items():
        got = evaluate(prog, arch, nr)
        if name == "clone3":
            assert got == errno.ENOSYS
        elif name in refused:
            assert got == errno.EPERM, name
        else:
            assert got == ALLOW, name
    assert evaluate(prog, arch, table["clone"], 0x10000000 | 0x11) == ALLOW  # userns: allowed
    assert evaluate(prog, arch, table["socket"], 16) == errno.EPERM
