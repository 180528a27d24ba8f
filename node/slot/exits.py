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
