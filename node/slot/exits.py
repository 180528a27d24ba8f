"""A job's outcome from its exit status and output, and the processes jobs leave behind.

A runner process (node/worker/job.py) runs each job; its outcome is ``finished`` with the
script's output (stdout, stderr, exit_code) or ``error`` with a reason. A job's processes
record their pid in ``run/jobs`` while they run, so that a node restarted after a crash can
find and kill what the dead run left behind (:func:`kill_orphans`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from bus.core.models import JobStatus
from bus.core.reasons import Reason

KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class Outcome:
    status: JobStatus
    result: dict[str, str]
    reason: str = ""


def _clip(data: bytes | str, limit: int) -> str:
    if isinstance(data, str):
        return data
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {len(data) - limit} more bytes cut]" if len(data) > limit else "")


# What a job's output file is read with first: its size known from what came back, not from
# an fstat (the file held open, nothing writes it after the job's answer). One system call a
# file instead of two for what most jobs write; 64 KiB costs pread no more than 4.
HEAD_BYTES = 65536


@dataclass(frozen=True)
class Written:
    """What a job wrote to one of its output files: its first bytes (up to HEAD_BYTES) and its
    size."""

    head: bytes
    size: int


def written(fd: int) -> Written:
    """What the file open as ``fd`` holds from its start: read once, an fstat only if it is
    longer than HEAD_BYTES."""
    head = os.pread(fd, HEAD_BYTES, 0)
    return Written(head, len(head) if len(head) < HEAD_BYTES else os.fstat(fd).st_size)


def tail_of(fd: int, w: Written, n: int) -> bytes:
    """The last ``n`` bytes of what :func:`written` read as ``w``."""
    if w.size <= len(w.head):
        return w.head[-n:] if w.size else b""
    return os.pread(fd, n, max(0, w.size - n))


def read_back(fd: int, w: Written, limit: int) -> str:
    """What a script wrote to its log file (open as ``fd``, read as ``w``), bounded like
    captured output."""
    size = w.size
    if not size:
        return ""
    data = w.head if min(size, limit) <= len(w.head) else os.pread(fd, min(size, limit), 0)
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {size - limit} more bytes cut]" if size > limit else "")


def outcome_of(
    returncode: int, stdout: bytes | str, stderr: bytes | str, max_output_bytes: int
) -> Outcome:
    """The job's outcome from its exit status and output (``max_output_bytes`` 0: as given)."""
    result = {
        "stdout": _clip(stdout, max_output_bytes),
        "stderr": _clip(stderr, max_output_bytes),
        "exit_code": str(returncode),
    }
    if returncode == 0:
        return Outcome(JobStatus.FINISHED, result)
    if returncode < 0:  # killed by a signal we did not send: the runner process was lost
        name = signal.Signals(-returncode).name
        return Outcome(JobStatus.ERROR, result, f"{Reason.RUNNER_LOST}: killed by {name}")
    return Outcome(JobStatus.ERROR, result, f"exit code {returncode}")


def live_processes(pid_dir: Path, *, prune: bool = True) -> dict[int, str]:
    """The processes this node's pid files name that still run (checked by their environment,
    as a pid may have been reused): pid -> the outcome file its pid file names ("" if none).
    ``prune``: remove the other pid files (only while no job runs: one being written would
    look stale)."""
    pid_dir.mkdir(parents=True, exist_ok=True)
    alive: dict[int, str] = {}
    for path in pid_dir.iterdir():
        try:
            pid = int(path.name)
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            marker, _, outcome = path.read_text().partition("\n")
        except (ValueError, OSError):
            if prune:
                path.unlink(missing_ok=True)
            continue
        if "=" not in marker:  # a job: "<caller>:<id>"
            marker = f"HERO_JOB_ID={marker.partition(':')[2]}"
        if f"\0{marker}\0".encode() in b"\0" + environ + b"\0":
            alive[pid] = outcome
        elif prune:
            path.unlink(missing_ok=True)
    return alive


def kill_orphans(pid_dir: Path, keep: frozenset[str] = frozenset()) -> int:
    """Kill the process groups of scripts a crashed run of this node left behind, except those
    running an attempt whose outcome file is in ``keep`` (they are adopted); how many."""
    killed = 0
    for pid, outcome in live_processes(pid_dir).items():
        if outcome and outcome in keep:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        (pid_dir / str(pid)).unlink(missing_ok=True)
    return killed
