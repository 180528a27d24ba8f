"""SIGTERM drains, SIGKILL loses nothing: real node processes, restarted on the same ports."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from bus.client.api import open_client
from bus.core.models import JobStatus
from crypto import read_key_file
from tests.bus.test_fencing import work_of
from tests.nodeproc import NodeProcess
from tests.scripts import announcing, wait_announced


@pytest.fixture
async def node_proc(tmp_path):
    made: list[NodeProcess] = []

    def make(name: str, **init) -> NodeProcess:
        # one python slot: each test runs one python job, and every slot is a runner process
        # each start and restart waits for (the default is one per core, and two sh slots)
        made.append(NodeProcess(tmp_path / name, name, runners={"python": 1}, **init))
        return made[-1]

    yield make
    for n in made:
        await n.close()


def slow_script(tmp_path, tag: str, nap: float = 30) -> str:
    """Sleeps as long as the file says (re-read on each attempt), then records one run; its
    files are in ``tmp_path``, the work dir of the node's context 1 (the job's cwd)."""
    (tmp_path / f"{tag}.nap").write_text(str(nap))
    return (
        "import time, pathlib; base = pathlib.Path('.')\n"
        f"time.sleep(float((base / '{tag}.nap').read_text()))\n"
        f"with open(base / '{tag}.runs', 'a') as f: f.write('run\\n')\n"
    )


async def submit_and_wait_started(node: NodeProcess, script: str, tmp_path, tag: str, **kw):
    msg, _ = await submit_and_get_pid(node, script, tag, **kw)
    return msg


async def submit_and_get_pid(node: NodeProcess, script: str, tag: str, **kw):
    """Submit a python job and wait until it runs; (message, pid of the process running it)."""
    actor = read_key_file(node.config.actor_key_path)
    async with open_client(node.redis_url) as client:
        script = announcing(node.redis_url, f"began:{tag}", script)
        msg = await client.submit_job(
            actor, 1, to=node.node_id, context_id=1, script_type="python", script=script, **kw
        )
        pid = await wait_announced(client.store, f"began:{tag}")
    return msg, pid


async def results_after_restart(node: NodeProcess, msg):
    await node.start()
    async with open_client(node.redis_url) as client:
        with trio.fail_after(30):
            return await client.wait_results(msg, timeout_s=30)


async def test_sigterm_lets_the_running_job_finish(node_proc, tmp_path):
    node = node_proc("a", grace_s=20)
    await node.start()
    tmp_path = work_of(node.home)
    msg = await submit_and_wait_started(node, slow_script(tmp_path, "t", nap=2), tmp_path, "t")
    assert await node.signal_and_wait(signal.SIGTERM, timeout_s=60) == 0
    [result] = await results_after_restart(node, msg)
    assert result.ok
    assert (tmp_path / "t.runs").read_text() == "run\n"
    assert result.result["attempts"] == "1"


async def test_sigterm_requeues_what_outlives_the_grace_period(node_proc, tmp_path):
    node = node_proc("a", grace_s=1)
    await node.start()
    tmp_path = work_of(node.home)
    msg = await submit_and_wait_started(node, slow_script(tmp_path, "g"), tmp_path, "g")
    assert await node.signal_and_wait(signal.SIGTERM, timeout_s=30) == 0
    assert not (tmp_path / "g.runs").exists()  # it was stopped, not finished
    (tmp_path / "g.nap").write_text("0")
    [result] = await results_after_restart(node, msg)
    assert result.ok
    assert result.result["attempts"] == "1"  # an interrupted attempt is not a failed one
    assert (tmp_path / "g.runs").read_text() == "run\n"


async def test_sigkill_of_node_and_job_counts_as_a_lost_runner(node_proc, tmp_path):
    """The job's process died with the node (mid-run, no outcome): it runs again."""
    node = node_proc("a")
    await node.start()
    tmp_path = work_of(node.home)
    msg, pid = await submit_and_get_pid(node, slow_script(tmp_path, "k"), "k", retries=1)
    await node.kill()
    os.killpg(pid, signal.SIGKILL)
    (tmp_path / "k.nap").write_text("0")
    [result] = await results_after_restart(node, msg)
    assert result.ok
    assert result.result["attempts"] == "2"
    assert (tmp_path / "k.runs").read_text() == "run\n"


async def test_sigkill_without_retries_ends_in_runner_lost(node_proc, tmp_path):
    node = node_proc("a")
    await node.start()
    tmp_path = work_of(node.home)
    msg, pid = await submit_and_get_pid(node, slow_script(tmp_path, "n"), "n")
    await node.kill()
    os.killpg(pid, signal.SIGKILL)
    [result] = await results_after_restart(node, msg)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("runner_lost")
