"""A retry through a real node whose runner processes connect as the ``runner`` ACL user
(embedded Valkey): the plan's retry is written as a field (``retry_of``) and cleared by the
next start under that user's rights, and the job's answer counts both attempts."""

from __future__ import annotations

import json

import trio

from bus.core import keys
from bus.core.models import JobStatus
from tests.runners.test_retry_policy import flaky, submit


async def test_a_retried_job_on_an_embedded_node_is_answered_once_with_its_attempts(
    node_factory, mock_clock, wall_clock_on_trio
):
    alice = await node_factory("alice", embedded=True)
    msg = await submit(alice, flaky("once", 75), retries=2, backoff="linear", backoff_ms=100)
    with trio.fail_after(30):
        [done] = await alice.client.wait_results(msg, timeout_s=30)
    assert (done.status, done.result["attempts"]) == (JobStatus.FINISHED, "2")
    job = await alice.store.hgetall(1, done.job_key)
    assert (job["status"], job["attempt"]) == ("finished", "2")
    assert "retry_of" not in job  # written by the retry, cleared by the next start
    log = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(done.job_key))]
    assert [(e["status"], e["reason"]) for e in log] == [
        ("error", "exit code 75"),
        ("finished", ""),
    ]
