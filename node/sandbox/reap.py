"""Ending a sandboxed worker (node/sandbox/host.py ``Sandbox``): SIGKILL for every process of
it, and the reaping of those the runner adopts.

A worker ends when it is retired (its jobs run: it is let exit first), when a job must end
before its time (timeout, stop, abort: killed at once), or when its runner leaves. The runner
is a child subreaper: whatever a killed worker leaves is adopted by it, and is reaped here,
never left a zombie whose CPU no process counts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import time

from node.sandbox.cgroups import Leaf

log = logging.getLogger("node.worker.loop")

# the processes a kill looks for under a worker with no pid namespace (isolation "none"):
# a pidfd each, held until they are reaped, within the runner's descriptors
_MAX_BELOW = 512
_REAP_WAIT_S = 5.0
RETIRE_WAIT_S = 1.0  # a retired worker's own exit, before it is killed (~8 ms here)


def kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a worker's process group, unless it was reaped (its pid may be another's now)."""
    if proc is not None and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    return out


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def pidfds_below(pid: int, whole: bool) -> list[int]:
    """Pidfds of the processes under ``pid``, taken before it is killed: its children (under
    bwrap, the pid namespace's init, whose death ends every process in the namespace) or, with
    no namespace (``whole``), every descendant. Once their parent is killed, the runner (a
    child subreaper) adopts them: unless it reaps them they stay zombies, one per retired or
    killed worker, and the CPU they used is counted in no process."""
    fds: list[int] = []
    todo = [pid]
    while todo and len(fds) < _MAX_BELOW:
        parent = todo.pop()
        for child in _children(parent):
            try:
                fd = os.pidfd_open(child)
            except OSError:  # gone already, or no pidfds (Linux < 5.3)
                continue
            if _parent(child) != parent:  # gone, and its pid another process's by now
                os.close(fd)
                continue
            fds.append(fd)
            if whole:
                todo.append(child)
    return fds


def kill_pidfds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)


def reap_adopted(fds: list[int]) -> None:
    """Wait (bounded) until each process of ``fds`` has exited, then reap those this process
    adopted (the others' parents reap them), and close the pidfds."""
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        pending, end = len(fds), time.monotonic() + _REAP_WAIT_S
        while pending and (left := end - time.monotonic()) > 0:
            for fd, _event in poller.poll(left * 1000):
                poller.unregister(fd)
                pending -= 1
        for fd in fds:
            with contextlib.suppress(OSError):  # ChildProcessError: not this process's child
                os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
    finally:
        for fd in fds:
            os.close(fd)


def end_worker(
    proc: subprocess.Popen[bytes],
    sock: socket.socket | None,
    whole: bool,
    killed: list[int],
    graceful: bool = False,
    leaf: Leaf | None = None,
) -> None:
    """End a worker with every process under it and reap them all (``killed``, the pidfds a
    ``Sandbox.kill`` already took, too). ``graceful``: first close its socket and let it
    exit (bounded wait), which is how a retired worker's CPU is counted: a pid namespace's
    init that is killed drops its children unaccounted (the kernel lets them reap themselves)."""
    below = killed + pidfds_below(proc.pid, whole) if proc.returncode is None else killed
    if graceful and sock is not None:
        sock.close()
        sock = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(RETIRE_WAIT_S)
    kill_pidfds(below)
    kill_group(proc)
    if leaf is not None:
        leaf.kill()
    if sock is not None:
        sock.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    reap_adopted(below)
    # every process of the sandbox has exited (its pid namespace's init reaped them first)
    if leaf is not None and not leaf.end():
        log.warning("cgroup %s still busy: removed when the node next starts", leaf.dirs)
