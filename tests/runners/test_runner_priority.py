"""Runner processes run below the node's CPU priority (node/runners/processes.py
``lower_priority``, the setting ``runner_nice``), and the job processes they start with them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from crypto import read_key_file
from tests.runners.test_runner_procs import runner_processes_of


def nice_of(pid: int) -> int:
    """The nice value of process ``pid`` (field 19 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(stat[16])


def autogroup_of(pid: int) -> tuple[str, int] | None:
    """(name, nice) of the autogroup of ``pid``, None where the kernel has none: no file, or
    an empty one (a process in a cpu cgroup other than the root's belongs to no autogroup)."""
    try:
        name, _, nice = Path(f"/proc/{pid}/autogroup").read_text().split()
    except (OSError, ValueError):
        return None
    return name, int(nice)


async def test_runners_and_their_jobs_run_below_the_node(node_factory) -> None:  # noqa: ANN001
    alice = await node_factory("alice", runners={"python": 1, "sh": 1})
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + alice.config.runner_nice)
    assert alice.config.runner_nice == 10  # the default
    runners = runner_processes_of(alice.config.run_dir)
    assert len(runners) == 2
    own = autogroup_of(os.getpid())
    for pid in runners:
        assert nice_of(pid) == expected
        group = autogroup_of(pid)
        if group is not None and own is not None:  # a session of its own: its group too
            assert group[0] != own[0]
            assert group[1] == min(19, own[1] + alice.config.runner_nice)
    assert autogroup_of(os.getpid()) == own  # the node's own group is untouched
    # the job process, in its sandbox, inherits it (its own /proc: the pid namespace's)
    actor = read_key_file(alice.config.actor_key_path)
    script = "print(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[16])"
    msg = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script=script
    )
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.ok, result
    assert int(result.stdout) == expected


async def test_runner_nice_0_leaves_runners_at_the_node_priority(node_factory) -> None:  # noqa: ANN001
    alice = await node_factory("alice", runners={"python": 1, "sh": 0}, runner_nice=0)
    [pid] = runner_processes_of(alice.config.run_dir)
    assert nice_of(pid) == os.getpriority(os.PRIO_PROCESS, 0)
    own = autogroup_of(os.getpid())
    group = autogroup_of(pid)
    if group is not None and own is not None:
        assert group[1] == own[1]


# run in a session of its own, so that a guard that failed would lower that session's group,
# not the test runner's
_SHARED_SESSION = """
import os, subprocess, sys
from pathlib import Path
from node.runners.processes import lower_priority
def group():
    return Path("/proc/self/autogroup").read_text()
before = group()
child = subprocess.Popen(["sleep", "30"])  # this session, this autogroup
try:
    lower_priority(child.pid, 5)
    stat = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
    print(stat[16], os.getpriority(os.PRIO_PROCESS, 0), before == group())
finally:
    child.kill()
"""


def test_a_process_in_the_callers_session_keeps_the_callers_group() -> None:
    """Lowering the group of a process that shares the caller's session would lower the
    caller: only the process itself is lowered then."""
    if autogroup_of(os.getpid()) is None:
        pytest.skip("no autogroup on this kernel")
    done = subprocess.run(
        [sys.executable, "-c", _SHARED_SESSION],
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[2],
    )
    child, own, group_kept = done.stdout.split()
    assert int(child) == min(19, int(own) + 5)
    assert group_kept == "True"
