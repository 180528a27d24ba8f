"""Run one job's script in a child process: stdin carries the script, env the job's variables.

Returns the job's final status and result map (stdout, stderr, exit_code). A timeout kills the
whole process group (SIGTERM, then SIGKILL) and ends the job in ``error`` with reason ``timeout``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from bus.models import JobStatus, RunnerJob
from node.proc import die_with_parent

KILL_GRACE_S = 2.0

BUILTIN_COMMANDS: dict[str, list[str]] = {
    "python": [sys.executable, "-u", "-"],
    "sh": ["/bin/sh", "-s"],
}


@dataclass(frozen=True)
class Outcome:
    status: JobStatus
    result: dict[str, str]
    reason: str = ""


def job_env(job: RunnerJob) -> dict[str, str]:
    base = {
        k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    }
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


def _clip(data: bytes, limit: int) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {len(data) - limit} more bytes cut]" if len(data) > limit else "")


async def execute(
    job: RunnerJob,
    command: list[str],
    *,
    max_output_bytes: int,
    env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run ``job.script`` through ``command``; never raises for what the script does."""

    async def kill_group(proc: trio.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            with trio.move_on_after(KILL_GRACE_S):
                await proc.wait()
                return
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timed_out = True
    with trio.move_on_after(job.timeout or 1e9):
        try:
            done = await trio.run_process(
                command,
                stdin=job.script.encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=dict(env if env is not None else job_env(job)),
                start_new_session=True,
                deliver_cancel=kill_group,
                preexec_fn=die_with_parent(),
            )
        except OSError as exc:
            return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, f"cannot start runner: {exc}")
        timed_out = False
    if timed_out:
        return Outcome(JobStatus.ERROR, {}, f"timeout: killed after {job.timeout} s")
    result = {
        "stdout": _clip(done.stdout, max_output_bytes),
        "stderr": _clip(done.stderr, max_output_bytes),
        "exit_code": str(done.returncode),
    }
    if done.returncode == 0:
        return Outcome(JobStatus.FINISHED, result)
    if done.returncode < 0:  # killed by a signal we did not send: the runner process was lost
        name = signal.Signals(-done.returncode).name
        return Outcome(JobStatus.ERROR, result, f"runner_lost: killed by {name}")
    return Outcome(JobStatus.ERROR, result, f"exit code {done.returncode}")
