"""Run one job's script in a child process: stdin carries the script, env the job's variables.

Returns the job's final status and result map (stdout, stderr, exit_code). A timeout kills the
whole process group (SIGTERM, then SIGKILL) and ends the job in ``error`` with reason ``timeout``;
when the script exits, what it left running in its group is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bus.models import JobStatus, RunnerJob
from bus.reasons import Reason
from node.runners.commands import prepared
from node.runners.outcomes import wrapped

KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class Outcome:
    status: JobStatus
    result: dict[str, str]
    reason: str = ""


_PASSED_ON = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # of the node's own environment


def job_env(job: RunnerJob) -> dict[str, str]:
    base = {k: v for k in _PASSED_ON if (v := os.environ.get(k)) is not None}
    base.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return (
        base
        | dict(job.env_vars)
        | {
            "HERO_JOB_ID": str(job.id),
            "HERO_CALLER_ID": str(job.caller_id),
            "HERO_CONTEXT_ID": str(job.context_id),
        }
    )


def _clip(data: bytes | str, limit: int) -> str:
    if isinstance(data, str):
        return data
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {len(data) - limit} more bytes cut]" if len(data) > limit else "")


async def execute(
    job: RunnerJob,
    command: list[str],
    *,
    max_output_bytes: int,
    env: Mapping[str, str] | None = None,
    pid_dir: Path | None = None,
    logs: tuple[Path, Path] | None = None,
    outcome: Path | None = None,
) -> Outcome:
    """Run ``job.script`` through ``command``; never raises for what the script does.
    With ``logs``, stdout and stderr are written there as the script runs (followed live).
    With ``outcome``, the exit status is also written there by a wrapper process, even if the
    node dies meanwhile (see node/runners/outcomes.py); the pid file names that file.

    ``command`` is a template (see node/runners/commands.py): ``{script_file}`` and the other
    placeholders are expanded first; with ``{script_file}`` the script goes in a 0600 file
    (in ``pid_dir``) that is removed afterwards, else on stdin.
    With ``pid_dir``, the child's pid is recorded there while it runs, so that a node restarted
    after a crash can kill what the dead node left running (see :func:`kill_orphans`).
    """
    try:
        with prepared(command, job, pid_dir) as (argv, fed):
            argv = wrapped(argv, outcome) if outcome is not None else argv
            return await _execute(fed, argv, max_output_bytes, env, pid_dir, logs, outcome)
    except OSError as exc:  # the script file could not be written
        return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, f"cannot start runner: {exc}")


async def _execute(
    job: RunnerJob,
    command: list[str],
    max_output_bytes: int,
    env: Mapping[str, str] | None,
    pid_dir: Path | None,
    logs: tuple[Path, Path] | None = None,
    outcome: Path | None = None,
) -> Outcome:
    completed: list[subprocess.CompletedProcess[bytes]] = []
    files = [p.open("w+b") for p in logs] if logs else []  # noqa: ASYNC230 - local, tiny
    streams: dict[str, Any] = (
        {"stdout": files[0], "stderr": files[1]}
        if files
        else {"capture_stdout": True, "capture_stderr": True}
    )

    async def run(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        completed.append(
            await trio.run_process(
                command,
                stdin=job.script.encode(),
                **streams,
                check=False,
                env=dict(env if env is not None else job_env(job)),
                start_new_session=True,
                deliver_cancel=_kill_group,
                task_status=task_status,
            )
        )

    pidfile: Path | None = None
    try:
        with trio.move_on_after(job.timeout or 1e9):
            async with trio.open_nursery() as nursery:
                proc = await nursery.start(run)
                pidfile = _record(pid_dir, proc.pid, job, outcome)
                nursery.start_soon(_end_group_after, proc)
    except OSError as exc:
        return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, f"cannot start runner: {exc}")
    finally:
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)
        output = [_read_back(f, max_output_bytes) for f in files]
    if not completed:
        return Outcome(JobStatus.ERROR, {}, f"{Reason.TIMEOUT}: killed after {job.timeout} s")
    done = completed[0]
    out, err = output if files else (done.stdout, done.stderr)
    return outcome_of(done.returncode, out, err, max_output_bytes)


def _read_back(f: Any, limit: int) -> str:  # noqa: ANN401 - a binary file
    """What a script wrote to its log file, bounded like captured output; closes the file."""
    with f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        text: str = f.read(limit).decode("utf-8", "replace")
    return text + (f"\n[... {size - limit} more bytes cut]" if size > limit else "")


async def _kill_group(proc: trio.Process) -> None:
    """Cancellation (timeout, stop, shutdown): SIGTERM the script's process group, then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        with trio.move_on_after(KILL_GRACE_S):
            await proc.wait()
            return
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _end_group_after(proc: trio.Process) -> None:
    """Once the script exits, kill what it left running in its process group (``cmd &``):
    a job's processes end with the job, and their open pipes no longer hold its output open.
    A process that left the group with setsid() escapes (README "Runners")."""
    await proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


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


def _record(
    pid_dir: Path | None, pid: int, job: RunnerJob, outcome: Path | None = None
) -> Path | None:
    if pid_dir is None:
        return None
    path = pid_dir / str(pid)
    path.write_text(f"{job.caller_id}:{job.id}" + (f"\n{outcome}" if outcome else ""))
    return path


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
