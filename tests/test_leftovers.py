"""A job's processes end with the job: what an sh or python job leaves running is killed."""

from __future__ import annotations

import os

import trio

from bus.core.models import JobStatus, RunnerJob
from crypto import read_key_file
from tests.scripts import command_job_run

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


def test_sh_job_background_process_ends_with_the_job(tmp_path, redis_url):
    run = command_job_run(tmp_path, redis_url, SH)
    out = run(job("sleep 300 & echo $!", "sh"))
    assert out.status is JobStatus.FINISHED
    [pid] = pids_of(out.result["stdout"])
    assert trio.run(ended, pid)


SPAWNS = """\
import subprocess, sys
child = subprocess.Popen(['sleep', '300'])
print(child.pid)
# a grandchild whose parent exits at once (an orphan), and one in a session of its own
orphan = 'sleep 300 >/dev/null 2>&1 & echo $!'
print(subprocess.run(['sh', '-c', orphan], capture_output=True, text=True).stdout.strip())
print(subprocess.Popen(['sleep', '300'], start_new_session=True).pid)
"""


async def test_python_job_children_end_with_the_job_not_the_runner(node_factory):
    """The runner process (a child subreaper) kills what a python job left, its own child, an
    orphan re-parented to it and one in a session of its own, and lives on for the next job."""
    alice = await node_factory("alice", runners={"python": 1})
    actor = read_key_file(alice.config.actor_key_path)

    async def run(script: str):
        msg = await alice.client.submit_job(
            actor, 1, to=alice.node_id, context_id=1, script_type="python", script=script
        )
        with trio.fail_after(20):
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        return result

    out = await run("import os\nprint(os.getpid())\n" + SPAWNS)
    assert (out.status, out.result["stderr"]) == (JobStatus.FINISHED, "")
    runner_pid, *pids = pids_of(out.stdout)
    assert len(pids) == 3
    for pid in pids:
        assert await ended(pid), pid
    after = await run("import os\nprint(os.getpid())")
    assert pids_of(after.stdout) == [runner_pid]  # the same process ran the next job
