"""The seccomp filter of every sandbox: a classic BPF program, generated here, that bwrap
installs (``--seccomp FD``) just before it executes the sandboxed worker.

It refuses (EPERM) what lets a job reach beyond its sandbox or its own processes: ptrace and
process_vm_*, the kernel keyring, bpf, perf events, userfaultfd, every mount call (old and
new API), unshare/setns/pivot_root, clone with a namespace flag, and ioctl TIOCSTI/TIOCLINUX
(typing into a terminal). ``clone3`` gets ENOSYS (its flags are behind a pointer, which BPF
cannot read; libc then falls back to clone, which is checked). A system call of another ABI
(i386 via int 0x80, x32) kills the process: the table below is for the native ABI only.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
CLONE_NS_FLAGS |= 0x40000000 | 0x00000080

_X32_BIT = 0x40000000

# per architecture: its audit number and the numbers of the calls the filter looks at
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "ioctl": 16,
            "clone": 56,
            "ptrace": 101,
            "pivot_root": 155,
            "mount": 165,
            "umount2": 166,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "perf_event_open": 298,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "userfaultfd": 323,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ioctl": 29,
            "clone": 220,
            "ptrace": 117,
            "pivot_root": 41,
            "mount": 40,
            "umount2": 39,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "unshare": 97,
            "perf_event_open": 241,
            "setns": 268,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "userfaultfd": 282,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "clone3": 435,
        },
    ),
}

# refused outright, whatever their arguments
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "mount", "umount2", "pivot_root", "unshare",
    "setns", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
)  # fmt: skip

Insn = tuple[int, int, int, int]


def _stmt(code: int, k: int) -> Insn:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> Insn:
    return (code, jt, jf, k)


def program(arch: str, deny_errno: int = errno.EPERM) -> list[Insn]:
    """The filter's instructions for ``arch`` (a key of :data:`ARCHES`)."""
    audit, nrs = ARCHES[arch]
    deny = RET_ERRNO | deny_errno
    out: list[Insn] = [
        _stmt(_LD_W_ABS, _ARCH),
        _jump(_JEQ_K, audit, 1, 0),
        _stmt(_RET_K, RET_KILL_PROCESS),
        _stmt(_LD_W_ABS, _NR),
    ]
    if arch == "x86_64":
        out += [_jump(_JGE_K, _X32_BIT, 0, 1), _stmt(_RET_K, RET_KILL_PROCESS)]
    for name in DENIED:
        out += [_jump(_JEQ_K, nrs[name], 0, 1), _stmt(_RET_K, deny)]
    out += [_jump(_JEQ_K, nrs["clone3"], 0, 1), _stmt(_RET_K, RET_ERRNO | errno.ENOSYS)]
    # clone: its flags are its first argument on both architectures (low 32 bits)
    out += [
        _jump(_JEQ_K, nrs["clone"], 0, 3),
        _stmt(_LD_W_ABS, _ARG0),
        _jump(_JSET_K, CLONE_NS_FLAGS, 0, 1),
        _stmt(_RET_K, deny),
    ]
    # ioctl: the request is its second argument; the low 32 bits are what the tty layer reads
    out += [
        _stmt(_LD_W_ABS, _NR),
        _jump(_JEQ_K, nrs["ioctl"], 0, 4),
        _stmt(_LD_W_ABS, _ARG1),
        _jump(_JEQ_K, TIOCSTI, 1, 0),
        _jump(_JEQ_K, TIOCLINUX, 0, 1),
        _stmt(_RET_K, deny),
        _stmt(_RET_K, RET_ALLOW),
    ]
    return out


def encode(insns: list[Insn]) -> bytes:
    """The program as the kernel reads it: ``struct sock_filter`` (u16, u8, u8, u32) each."""
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in insns)


def native_arch() -> str | None:
    """This machine's architecture if the filter knows it (else no filter can be built)."""
    machine = platform.machine()
    return machine if machine in ARCHES else None


def run(insns: list[Insn], arch: str, nr: int, args: tuple[int, ...] = ()) -> int:
    """Interpret the filter for one system call (what the kernel would return): the unit
    tests check the program's verdicts with this, no kernel needed."""
    audit = ARCHES[arch][0]
    data = struct.pack("=iIQ6Q", nr, audit, 0, *(list(args) + [0] * (6 - len(args))))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == _LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == _RET_K:
            return k
        else:
            hit = {_JEQ_K: acc == k, _JGE_K: acc >= k, _JSET_K: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
