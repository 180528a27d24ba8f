"""Child processes die with the node: Linux parent-death signals, set between fork and exec."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the node dies (even by
    SIGKILL), so no job or Valkey process outlives it; None where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec
