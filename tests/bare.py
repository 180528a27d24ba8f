"""A bare machine, as far as the sandbox goes, for the node processes of a test.

:func:`without_system_bwrap` runs a command in a mount namespace of its own where every
``bwrap`` in PATH is covered by /dev/null (nothing outside that namespace sees a change): the
machine a newcomer has, with no bubblewrap package. :func:`namespaces_refused` runs it under
the seccomp filter a container's default profile amounts to (``unshare``, ``mount``, clone with
a namespace flag refused, ``clone3`` ENOSYS): the node's own filter, node/sandbox/seccomp.py,
installed on the process itself (tests/refuse_namespaces.py), so no sandbox can be built.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def system_bwraps() -> list[str]:
    """Every bwrap in PATH (the resolved files, once each)."""
    seen: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(d or ".") / "bwrap"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            real = str(candidate.resolve())
            if real not in seen:
                seen.append(real)
    return seen


def without_system_bwrap() -> list[str]:
    """A command prefix that hides the system's bwrap from what it runs (skipped, failed under
    CI, where a mount namespace cannot be made: it takes root)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        why = "hiding the system's bwrap takes root and unshare(1)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    mounts = " && ".join(f"mount --bind /dev/null {path}" for path in system_bwraps()) or "true"
    script = f'{mounts} && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "bare"]


def namespaces_refused() -> list[str]:
    """A command prefix that runs what follows where no namespace can be made."""
    return [sys.executable, str(HERE / "refuse_namespaces.py")]
