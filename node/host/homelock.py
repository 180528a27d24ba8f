"""One node per home: an exclusive ``flock`` on ``run/node.lock``, held for the node's life.

A second node on the same home would stop the first one's Valkey (see
:func:`node.host.valkey.stop_stale`) and share its queues; the lock is taken before anything else is
touched. The kernel drops it when the holder exits, however it exits (SIGKILL included), and the
file is opened close-on-exec, so no child (Valkey, a job) keeps it after the node is gone. So the
lock also tells clients whether ``run/node.json`` describes a running node or a stopped one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from node.errors import HomeInUse

LOCK_FILE = "node.lock"
_PROBE_WAIT_S = 1.0  # a client's probe holds the lock (shared) for microseconds
_RETRY_S = 0.01


@contextlib.contextmanager
def hold_home(home: Path, run_dir: Path) -> Iterator[None]:
    """Hold ``home``'s lock (with this process's pid in the file) for the ``with`` block.

    Raises HomeInUse, touching nothing, if another node holds it.
    """
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _take(fd, home)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _take(fd: int, home: Path) -> None:
    """LOCK_EX on ``fd``; HomeInUse if a live node holds it. A holder that is not a live
    process is a client probing (or a node that has not written its pid yet): retried briefly."""
    deadline = time.monotonic() + _PROBE_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid = _pid_in(fd)
        if (pid and _alive(pid)) or time.monotonic() > deadline:
            raise HomeInUse(home, pid)
        time.sleep(_RETRY_S)


def holder(run_dir: Path) -> int | None:
    """The pid of the node holding the home whose run directory is ``run_dir`` (0: a node holds
    it but its pid is not written yet), or None if no node runs there."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid_in(fd)
    else:
        return None
    finally:
        os.close(fd)


def _pid_in(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
