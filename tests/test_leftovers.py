"""A job's processes end with the job: what an sh or python job leaves running is killed."""

from __future__ import annotations

import os

import pytest
import trio

from bus.models import JobStatus, RunnerJob
from node.runners.executor import execute
from node.runners.workers import PythonWorker

SH = ["/bin/sh", "-s"]


def job(script: str, script_type: str = "python") -> RunnerJob:
    return RunnerJob(1, 2, 3, script, script_type, timeout=60)


async def ended(pid: int) -> bool:
    """Wait (bounded) until ``pid`` exits; False if it still runs after 10 s. A pidfd becomes
    readable when its process exits, child of ours or not: no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with trio.move_on_after(10):
            await trio.lowlevel.wait_readable(fd)
            return True
        return False
    finally:
        os.close(fd)


def pids_of(stdout: str) -> list[int]:
    return [int(line) for line in stdout.split()]


@pytest.mark.parametrize("live_logs", [False, True])
async def test_sh_job_background_process_ends_with_the_job(tmp_path, live_logs):
    logs = (tmp_path / "out", tmp_path / "err") if live_logs else None
    with trio.fail_after(20):  # captured output: a live sleep holds its stdout open
        out = await execute(job("sleep 300 & echo $!", "sh"), SH, max_output_bytes=1000, logs=logs)
    assert out.status is JobStatus.FINISHED
    [pid] = pids_of(out.result["stdout"])
    assert await ended(pid)


@pytest.fixture
async def worker(tmp_path):
    w = PythonWorker(max_output_bytes=1000, pid_dir=tmp_path / "pids")
    yield w
    await w.close()


SPAWNS = """\
import subprocess, sys
child = subprocess.Popen(['sleep', '300'])
print(child.pid)
# a grandchild whose parent exits at once (an orphan), and one in a session of its own
orphan = 'sleep 300 >/dev/null 2>&1 & echo $!'
print(subprocess.run(['sh', '-c', orphan], capture_output=True, text=True).stdout.strip())
print(subprocess.Popen(['sleep', '300'], start_new_session=True).pid)
"""


async def test_python_job_children_end_with_the_job_not_the_worker(worker):
    with trio.fail_after(20):
        out = await worker.run(job(SPAWNS))
    assert (out.status, out.result["stderr"]) == (JobStatus.FINISHED, "")
    pids = pids_of(out.result["stdout"])
    assert len(pids) == 3
    for pid in pids:
        assert await ended(pid), pid
    assert worker.proc is not None
    assert worker.proc.returncode is None  # the worker itself lives on and runs the next job
    worker_pid = worker.proc.pid
    with trio.fail_after(20):
        after = await worker.run(job("print('next')"))
    assert (after.result["stdout"], worker.proc.pid) == ("next\n", worker_pid)
