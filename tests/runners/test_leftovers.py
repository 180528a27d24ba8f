"""A job's processes end with the job: what an sh or python job leaves running is killed.

Jobs run sandboxed, in a pid namespace of their own: the pids a job prints are not the host's.
Each test gives what its job leaves a unique ``sleep`` duration and looks, on the host, for
any process whose command line still carries it once the job has ended."""

from __future__ import annotations

import os

import trio

from bus.core.models import JobStatus, RunnerJob
from crypto import read_key_file
from tests.scripts import SH, command_job_run


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


def carrying(token: str) -> list[int]:
    """The host's live processes whose command line carries ``token``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if token.encode() in argv:
            found.append(int(entry.name))
    return found


async def none_left(token: str) -> bool:
    """Every host process carrying ``token`` ends (bounded, each waited on by its pidfd)."""
    for pid in carrying(token):
        if not await ended(pid):
            return False
    return True


def test_sh_job_background_process_ends_with_the_job(tmp_path, redis_url):
    run = command_job_run(tmp_path, redis_url, SH)
    out = run(job("sleep 300.101 & echo $!", "sh"))
    assert out.status is JobStatus.FINISHED
    assert len(pids_of(out.result["stdout"])) == 1  # it did start one, in its namespace
    assert trio.run(none_left, "300.101")


SPAWNS = """\
import subprocess, sys
child = subprocess.Popen(['sleep', '300.202'])
print(child.pid)
# a grandchild whose parent exits at once (an orphan), and one in a session of its own
orphan = 'sleep 300.202 >/dev/null 2>&1 & echo $!'
print(subprocess.run(['sh', '-c', orphan], capture_output=True, text=True).stdout.strip())
print(subprocess.Popen(['sleep', '300.202'], start_new_session=True).pid)
"""


async def test_python_job_children_end_with_the_job_not_the_runner(node_factory):
    """What a python job left is killed, its own child, an orphan and one in a session of its
    own, and the sandboxed worker that forked the job lives on for the next job."""
    alice = await node_factory("alice", runners={"python": 1})
    actor = read_key_file(alice.config.actor_key_path)

    async def run(script: str):
        msg = await alice.client.submit_job(
            actor, 1, to=alice.node_id, context_id=1, script_type="python", script=script
        )
        with trio.fail_after(20):
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        return result

    out = await run("import os\nprint(os.getppid())\n" + SPAWNS)
    assert (out.status, out.result["stderr"]) == (JobStatus.FINISHED, "")
    worker_pid, *pids = pids_of(out.stdout)
    assert len(pids) == 3  # it did start three, in its namespace
    assert await none_left("300.202")
    after = await run("import os\nprint(os.getppid())")
    assert pids_of(after.stdout) == [worker_pid]  # the same worker ran the next job


def test_an_abort_after_the_job_ended_keeps_its_outcome(tmp_path, redis_url):
    """A shutdown's abort (SIGINT) that lands once the sandbox has answered: the job ran to its
    end, so its outcome is kept to be recorded, not given back to run a second time."""
    run = command_job_run(tmp_path, redis_url, SH)
    jobs = run.job_run
    answer = jobs.sandbox.run

    def answered_then_aborted(*args, **kwargs):
        reply = answer(*args, **kwargs)
        jobs.abort()  # what the SIGINT handler does, here just after the answer came
        return reply

    jobs.sandbox.run = answered_then_aborted
    out = run(job("echo ran", "sh"))
    assert out is not None, "a job that ran to its end was given back"
    assert out.status is JobStatus.FINISHED
    assert out.result["stdout"] == "ran\n"
