"""Warm python workers: fresh namespaces, captured output, timeouts, crashes, recycling."""

from __future__ import annotations

import pytest
import trio

from bus.models import JobStatus, RunnerJob
from node.runners.workers import PythonWorker


def job(script: str, timeout: int = 10, **env: str) -> RunnerJob:
    return RunnerJob(1, 2, 3, script, "python", timeout=timeout, env_vars=env)


@pytest.fixture
async def worker(tmp_path):
    w = PythonWorker(max_output_bytes=1000, max_jobs=3, pid_dir=tmp_path / "pids")
    yield w
    await w.close()


async def test_each_job_gets_a_fresh_namespace_and_its_own_env(worker):
    first = await worker.run(job("x = 41\nimport os\nprint(x + 1, os.environ['A'])", A="a"))
    second = await worker.run(job("import os\nprint('x' in globals(), os.environ.get('A'))"))
    assert (first.status, first.result["stdout"]) == (JobStatus.FINISHED, "42 a\n")
    assert second.result["stdout"] == "False None\n"
    assert worker.jobs == 2  # the same process ran both


async def test_output_exit_codes_and_tracebacks(worker):
    raw = await worker.run(job("import os, sys\nos.write(1, b'raw\\n')\nsys.stderr.write('e')"))
    assert raw.result["stdout"] == "raw\n"
    assert raw.result["stderr"] == "e"
    code = await worker.run(job("raise SystemExit(3)"))
    assert (code.status, code.reason, code.result["exit_code"]) == (
        JobStatus.ERROR,
        "exit code 3",
        "3",
    )
    boom = await worker.run(job("1/0"))
    assert "ZeroDivisionError" in boom.result["stderr"]
    big = await worker.run(job("print('y' * 5000)"))
    assert big.result["stdout"].endswith("more bytes cut]")


async def test_timeout_kills_the_worker_and_the_next_job_runs(worker):
    slow = await worker.run(job("import time\ntime.sleep(30)", timeout=1))
    assert slow.status is JobStatus.ERROR
    assert slow.reason.startswith("timeout")
    after = await worker.run(job("print('fresh')"))
    assert after.result["stdout"] == "fresh\n"


async def test_a_script_that_kills_its_worker_is_a_lost_runner(worker):
    lost = await worker.run(job("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    assert lost.status is JobStatus.ERROR
    assert lost.reason == "runner_lost: killed by SIGKILL"
    assert (await worker.run(job("print(1)"))).status is JobStatus.FINISHED


async def test_worker_is_recycled_after_max_jobs(worker):
    pids = []
    for _ in range(4):
        await worker.run(job("print(1)"))
        pids.append(worker.proc.pid)
    assert pids[0] == pids[1] == pids[2] != pids[3]


async def test_cancellation_kills_the_worker(worker, tmp_path):
    with trio.move_on_after(1):
        await worker.run(job("import time\ntime.sleep(30)"))
    assert worker.proc is None
    assert list((tmp_path / "pids").iterdir()) == []


async def test_jobs_run_under_batch_scheduling(worker):
    """A waking job does not preempt the node that fed it (node/runners/pyworker.py)."""
    out = await worker.run(job("import os\nprint(os.sched_getscheduler(0) == os.SCHED_BATCH)"))
    assert out.result["stdout"] == "True\n"


async def test_a_crashed_nodes_worker_is_found_and_killed_at_the_next_start(tmp_path):
    """kill_orphans (run at start-up) recognises a worker left by a dead node by its pid file
    and the marker in /proc/<pid>/environ (kept although the worker empties its environment),
    and leaves an unrelated process with a stale pid file alone."""
    import os

    from node.runners.executor import kill_orphans

    pids = tmp_path / "pids"
    left = PythonWorker(max_output_bytes=1000, pid_dir=pids)
    assert (await left.run(job("print(1)"))).result["stdout"] == "1\n"
    proc = left.proc
    assert proc is not None
    (pids / str(os.getpid())).write_text("HERO_WORKER=someone-else")  # not ours: untouched
    assert await trio.to_thread.run_sync(kill_orphans, pids) == 1
    with trio.fail_after(5):
        await proc.wait()
    assert proc.returncode == -9
    assert list(pids.iterdir()) == []
    left.proc = None  # already gone
