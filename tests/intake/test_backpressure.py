"""Supervisor backpressure: msg_out is materialised no further ahead of the runners than the
high-water mark (plus one batch), and every job still runs."""

from __future__ import annotations

import trio

from bus.core import keys
from bus.store import serve
from crypto import read_key_file
from node.intake import supervisor


async def test_queue_depth_stays_bounded_and_nothing_is_lost(node_factory, monkeypatch):
    monkeypatch.setattr(supervisor, "HIGH_WATER", 6)
    monkeypatch.setattr(serve, "BATCH", 3)
    alice = await node_factory("alice", runners={"python": 1})
    actor = read_key_file(alice.config.actor_key_path)
    messages = [
        await alice.client.submit_job(
            actor,
            1,
            to=alice.node_id,
            context_id=1,
            script_type="python",
            script=f"import time\ntime.sleep(0.03)\nprint({i})",
        )
        for i in range(40)
    ]
    depths: list[int] = []
    held_back: list[int] = []

    async def sample() -> None:  # observe the queues while the jobs run
        while True:
            depths.append(await alice.store.llen(1, keys.queue("python")))
            held_back.append(await alice.store.llen(1, keys.MSG_OUT))
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        with trio.fail_after(60):
            results = [(await alice.client.wait_results(m, timeout_s=60))[0] for m in messages]
        nursery.cancel_scope.cancel()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(40)]
    assert max(depths) <= 6 + 3  # the mark plus the batch that crossed it
    assert max(held_back) > 0  # the rest waited, unverified, in msg_out
