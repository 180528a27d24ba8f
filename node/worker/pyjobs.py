"""A runner process's one process setting of its own: it is a child subreaper.

Its jobs run in its slot's sandbox (node/sandbox/): what a killed or retired sandbox leaves
(bwrap's pid-namespace init, under isolation "none" the job processes) is re-parented to this
process rather than to init, and node/sandbox/reap.py reaps it, so nothing a sandbox started
outlives it unseen and the CPU it used counts under this runner.
"""

from __future__ import annotations

import ctypes

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (see the module's docstring); False
    where prctl is unavailable (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux
        return False
