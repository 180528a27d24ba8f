"""Attempts, retries, leases and lost runners, against real nodes and real processes."""

from __future__ import annotations

import json
import os
import random
import signal

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bus.core import keys
from bus.core.attempts import after_attempt, backoff_s
from bus.core.models import JobStatus
from bus.store.atomic import runs_trio
from crypto import read_key_file
from tests.leases import lapse
from tests.scripts import announcing, wait_announced


@given(st.integers(1, 30), st.integers(0, 30), st.sampled_from(list(JobStatus)))
def test_retry_decision(attempt, retries, status):
    nxt = after_attempt(status, "exit code 1", attempt, retries, rand=random.Random(1))
    assert nxt.retry == (status is not JobStatus.FINISHED and attempt <= retries)
    if nxt.retry:
        ceiling = min(60.0, 0.5 * 2 ** (attempt - 1))
        assert ceiling / 2 <= nxt.delay_s <= ceiling


def test_never_retry_a_stopped_job():
    assert not after_attempt(JobStatus.ERROR, "stopped: by actor 1", 1, 5).retry
    assert backoff_s(100) <= 60.0


async def submit(node, script: str, **kw):
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor, 1, to=node.node_id, context_id=1, script_type="python", script=script, **kw
    )


async def test_failing_job_is_retried_then_finishes(
    node_factory, tmp_path, mock_clock, wall_clock_on_trio
):
    alice = await node_factory("alice")
    # in the context's work dir (the job's cwd): the one place a sandboxed job writes
    counter = alice.config.home / "work" / "1" / "count"
    script = (
        "import pathlib; p = pathlib.Path('count')\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "raise SystemExit(0 if n >= 3 else 1)\n"
    )
    msg = await submit(alice, script, retries=2)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.ok
    assert result.result["attempts"] == "3"
    assert counter.read_text() == "3"
    log = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(result.job_key))]
    assert [(e["attempt"], e["status"]) for e in log] == [
        (1, "error"),
        (2, "error"),
        (3, "finished"),
    ]


async def test_retries_run_out(node_factory, mock_clock, wall_clock_on_trio):
    alice = await node_factory("alice")
    msg = await submit(alice, "raise SystemExit(4)", retries=1)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.status is JobStatus.ERROR
    assert result.reason == "exit code 4"
    assert result.result["attempts"] == "2"


def long_script(node, marker: str) -> str:
    return announcing(
        node.info.redis_url,
        f"pid:{marker}",
        "import os, time\ntime.sleep(float(os.environ.get('NAP', '30')))\nprint('survived')\n",
    )


@pytest.mark.parametrize("retries", [0, 1])
async def test_runner_killed_mid_job(node_factory, retries):
    alice = await node_factory("alice")
    marker = f"kill{retries}"
    msg = await submit(alice, long_script(alice, marker), retries=retries, env_vars={"NAP": "30"})
    pid = await wait_announced(alice.store, f"pid:{marker}")
    os.kill(pid, signal.SIGKILL)
    if retries:  # the second attempt runs; kill it too, nothing is left: error
        os.kill(await wait_announced(alice.store, f"pid:{marker}"), signal.SIGKILL)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("runner_lost")
    assert result.result["attempts"] == str(retries + 1)


async def test_stale_runner_result_is_refused(node_factory):
    alice = await node_factory("alice", runners={"python": 1})  # one slot: jobs run in order
    msg = await submit(alice, long_script(alice, "stale"), env_vars={"NAP": "1"}, retries=0)
    await wait_announced(alice.store, "pid:stale")
    job_key = msg.job[0].key
    # another attempt starts (as if this runner had been presumed dead): this one is superseded
    await alice.store.call(1, lambda r: r.hincrby(job_key, "attempt", 1))
    await alice.store.hset(1, job_key, {"runner": "another-runner"})
    await lapse(alice.store, job_key, 600_000)  # the other runner holds its lease
    after = await submit(alice, "print('next')")  # runs once the stale attempt has concluded
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(after, timeout_s=20)
    assert result.stdout == "next\n"
    # the late result was refused: the job keeps the new owner's state, nothing was answered
    assert (await alice.store.hgetall(1, job_key))["status"] == "started"
    assert await alice.store.llen(1, keys.reply(msg.key)) == 0


async def test_jobstore_fences_transitions_by_attempt(store, sync_runs):
    await store.hset(1, "job:1:1", {"status": "dispatched", "attempt": "0"})
    started = sync_runs.start("job:1:1", "tok", 10_000, "")
    assert (started["attempt"], started["status"], started["runner"]) == ("1", "started", "tok")
    assert await runs_trio.renew(store, 1, "job:1:1", "tok", 10_000, 1)
    assert not await runs_trio.renew(store, 1, "job:1:1", "other", 10_000, 2)  # not its attempt
    assert not sync_runs.requeue("job:1:1", 2, "inflight:x", "queue:python")
    assert sync_runs.requeue("job:1:1", 1, "inflight:x", "queue:python")
    assert await store.lrange(1, "queue:python") == ["job:1:1"]
    job = await store.hgetall(1, "job:1:1")
    assert (job["status"], job["attempt"]) == ("dispatched", "0")
    await store.hset(1, "job:1:1", {"status": "finished"})
    assert sync_runs.start("job:1:1", "tok", 10_000, "") == {}
