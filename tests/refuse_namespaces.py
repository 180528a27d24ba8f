"""``python tests/refuse_namespaces.py CMD ARGS...``: run CMD where namespaces are refused.

Installs the node's own sandbox filter (node/sandbox/seccomp.py) on this process, with
no_new_privs, then executes CMD, which inherits it: every ``unshare`` and namespace-making
``clone`` fails with EPERM, as under a container runtime's default seccomp profile.
"""

from __future__ import annotations

import ctypes
import os
import sys

from node.sandbox import seccomp

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def main() -> None:
    arch = seccomp.native_arch()
    if arch is None:
        raise SystemExit(f"no seccomp filter for {arch}")
    program = seccomp.encode(seccomp.program(arch))
    insns = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(insns))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SystemExit(f"seccomp: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
