"""Job logs: followed live while the job runs, and read back once it has ended."""

from __future__ import annotations

import trio

from tests.runners.test_runners import submit
from tests.scripts import announcing, wait_announced

TICKER = """
import sys, time
for i in range(3):
    print(f"tick {i}", flush=True)
    time.sleep(0.4)
print("oops", file=sys.stderr)
"""


async def test_follow_a_running_job_live(node_factory):
    alice = await node_factory("alice")
    msg = await submit(alice, "python", announcing(alice.info.redis_url, "tick", TICKER))
    await wait_announced(alice.store, "tick")
    seen: list[tuple[str, str]] = []
    with trio.fail_after(20):
        async for stream, text in alice.client.job_logs(1, msg.job[0].key, follow=True):
            seen.append((stream, text))
            if len(seen) == 1:  # the first chunk came while the job still ran
                job = await alice.store.hgetall(1, msg.job[0].key)
                assert job["status"] == "started"
    out = "".join(t for s, t in seen if s == "stdout")
    assert out == "tick 0\ntick 1\ntick 2\n"
    assert "".join(t for s, t in seen if s == "stderr") == "oops\n"
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.stdout == out  # the result carries the same output


async def test_logs_of_a_short_job_come_from_its_result(node_factory):
    alice = await node_factory("alice")
    msg = await submit(alice, "sh", "echo quick; echo err >&2")
    with trio.fail_after(20):
        await alice.client.wait_results(msg, timeout_s=20)
        pairs = [p async for p in alice.client.job_logs(1, msg.job[0].key, follow=True)]
    assert pairs == [("stdout", "quick\n"), ("stderr", "err\n")]


async def test_a_job_longer_than_its_lease_keeps_it_and_its_slot_logs_are_reused(
    node_factory,
):
    """The slot's watcher renews the lease of a job that outlives its lease TTL, and the next
    job on that slot starts with clean output files."""
    alice = await node_factory("alice", runners={"python": 1}, lease_ttl_ms=600)

    async def run(script: str) -> str:
        msg = await submit(alice, "python", script)
        with trio.fail_after(20):
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        assert result.ok, result.reason
        return result.stdout

    # a refused (stale) result would never reach the client: wait_results would time out
    assert await run("import time\nprint('long')\ntime.sleep(1.5)") == "long\n"
    assert await run("print('next')") == "next\n"
