"""Job outcomes written where the next start of the node finds them, tied to their attempt.

A node killed while its jobs run leaves their processes running (each in its own session): they
finish, and only they know how. So the process that waits for a script writes the script's
outcome to ``run/outcomes/<ctx>-<job key>-<attempt>``: the ``sh`` wrapper around a command's
process (:func:`wrapped`), always; a runner process (node/worker/job.py) for a python job it ran
when its node has died, or when it ends a stopped or timed-out job by exiting (then with the
``reason``); and every runner process, for every job, before it asks Valkey to record the end
(node/worker/loop.py ``Runner.keep``), removing it only once Valkey has: a runner killed while
Valkey is away or hangs loses nothing. The attempt in the name is the fencing token: at start, a
slot adopts the outcome of a job's *current* attempt (node/runners/recovery.py: recover_slot),
waiting first for a process that still runs it; only a job whose process died with no outcome is
recorded ``runner_lost``. A job's pid file (``run/jobs/<pid>``) names its outcome file on its
second line, so the start-up orphan killer can spare a process that is still worth adopting.

This module is imported by the runner processes too: standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

# Runs the command, then records its exit status as the node would see it (a script killed by
# signal N as -N) and exits the same way. Shell builtins only, as it wraps every command job:
# one write of a few bytes into the outcome file, which a reader takes whole or not at all
# (read_outcome). Not fsynced: that needs another process per job, and a machine crash that
# could lose the write also kills the job and may lose Valkey's last second (appendfsync
# everysec), so such a job is run again at worst.
_WRAP = """o=$1; shift
"$@"; c=$?
if [ "$c" -gt 128 ]; then e=$((128 - c)); else e=$c; fi
printf '{"exit_code": %d}' "$e" > "$o"
if [ "$c" -gt 128 ]; then kill -"$((c - 128))" $$; fi
exit "$c"
"""


def outcome_dir(run_dir: Path) -> Path:
    return run_dir / "outcomes"


def outcome_path(run_dir: Path, ctx: int, job_key: str, attempt: int) -> Path:
    """Where attempt ``attempt`` of ``job_key`` (context ``ctx``) writes its outcome."""
    return outcome_dir(run_dir) / f"{ctx}-{job_key}-{attempt}"


def parse_outcome_name(name: str) -> tuple[int, str, int] | None:
    """(context, job key, attempt) of an outcome file's name; None if it is not one."""
    ctx, _, rest = name.partition("-")
    job_key, _, attempt = rest.rpartition("-")
    if not (ctx.isdigit() and attempt.isdigit() and job_key):
        return None
    return int(ctx), job_key, int(attempt)


def wrapped(argv: list[str], outcome: Path) -> list[str]:
    """``argv`` run under the shell wrapper that writes its outcome to ``outcome``."""
    return ["/bin/sh", "-c", _WRAP, "hero-job", str(outcome), *argv]


def write_outcome(path: Path, outcome: dict[str, Any]) -> None:
    """Write ``outcome`` whole: a temporary file renamed over ``path``, so a reader sees all of
    it or nothing. Not fsynced, like the command jobs' outcomes (see _WRAP): the file outlives
    the node's death in the page cache, and a machine crash that could lose it also loses
    Valkey's last second and the job itself, which then runs again at worst."""
    # os calls on the path's text: pathlib's per-call parsing was a tenth of a runner's
    # Python time per job (this and discard run for every job)
    name = os.fspath(path)
    fd = os.open(name + ".tmp", _FLAGS, 0o600)
    try:
        data = memoryview(json.dumps(outcome).encode())
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    os.replace(name + ".tmp", name)


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def write_durable(path: Path, outcome: dict[str, Any]) -> None:
    """Write ``outcome`` whole and fsynced (the file, then its folder, so the rename is on disk
    too): for an outcome that Valkey could not take, which then exists nowhere else. A runner
    process that is killed after this (its node's unit stopped, the restarted node's orphan
    killer, a machine crash) loses nothing: the next start adopts the file. Only on this slow
    path, so a job whose end is recorded at once costs no fsync."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(outcome, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_outcome(path: Path) -> dict[str, Any] | None:
    """The outcome recorded at ``path``, or None if there is none (or it is unreadable)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("exit_code"), int) else None


def discard(path: Path) -> None:
    """Forget an outcome the node has recorded in Valkey (or that was superseded)."""
    name = os.fspath(path)
    for each in (name, name + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(each)
