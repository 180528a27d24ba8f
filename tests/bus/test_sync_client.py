"""The blocking client (bus/client/sync.py) runs the trio client's plan from a plain thread:
against a real node, connected as the client role, a batch of jobs is queued and answered."""

from __future__ import annotations

import trio

from bus.client.api import new_job
from bus.client.sync import open_sync_client
from bus.core.models import JobStatus
from crypto import read_key_file
from node.host.acl import CLIENT, reachable_url, role_url


def _run(url: str, key_path: str) -> list[tuple[str, str]]:
    key = read_key_file(key_path)
    with open_sync_client(url) as client:
        jobs = [new_job(1, 1, "python", f"print({n} * 2)") for n in range(3)]
        messages = client.submit_many(key, 1, to="self", context_id=1, jobs=jobs)
        assert len({m.key for m in messages}) == 3
        return [
            (r.status.value, r.stdout)
            for m in messages
            for r in client.wait_results(m, timeout_s=60)
        ]


async def test_sync_client_submits_a_batch_and_waits_for_each_result(node_factory):
    alice = await node_factory("alice", embedded=True)
    url = role_url(alice.config, reachable_url(alice.config), CLIENT)
    with trio.fail_after(120):
        got = await trio.to_thread.run_sync(_run, url, str(alice.config.actor_key_path))
    assert got == [(JobStatus.FINISHED.value, f"{n * 2}\n") for n in range(3)]
