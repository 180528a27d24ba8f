"""A peer flooding ``msgs`` frames is held back on the link, nothing lost (issue 46): while the
receiving node takes no new jobs (its store near its maxmemory: node/intake/pressure.py) its
link stores nothing, the sender's window fills and the rest waits in the sender's durable
outbox; once the receiver has room again every message is delivered and runs, the link
storing no more than ``max_msg_in_per_peer`` ahead of the consumer."""

from __future__ import annotations

import trio

from bus.core import keys
from bus.store import records
from node.intake.pressure import STORE_MEMORY
from tests.nodes import link_to, until_read

FLOOD = 300  # more than one window (bus/wire/outbox.py: 256 unacknowledged per link)
MB = 1024 * 1024


async def test_a_flooding_peer_waits_in_its_outbox_while_the_receiver_has_no_room(node_factory):
    # a fresh Valkey is past 99% of 64 MiB already: alice holds new jobs from the start
    alice = await node_factory(
        "alice",
        embedded=True,
        runners={"python": 0, "sh": 2},
        store_max_memory_mb=64,
        store_headroom_pct=99,
        pressure_check_s=0.2,
        max_msg_in_per_peer=50,  # well under the flood: the link also waits for the consumer
    )
    bob = await node_factory("bob")
    state = alice.info.state
    assert state is not None
    with trio.fail_after(20):
        while STORE_MEMORY not in state.pressure.hold.held:
            await state.pressure.hold.wait_changed()
    actor = await link_to(bob, alice)
    messages = [
        await bob.client.submit_job(
            actor, 1, to=alice.node_id, context_id=1, script_type="sh", script=f"echo {i}"
        )
        for i in range(FLOOD)
    ]

    async def window_full() -> bool:  # bob sent a window's worth; the rest waits in its outbox
        waiting, sent = await records.outbox_depths(bob.store, alice.node_id)
        return waiting > 0 and waiting + sent == FLOOD

    assert await until_read(window_full, 30)
    assert await alice.store.llen(1, keys.MSG_IN) == 0  # nothing stored past the hold
    assert await alice.store.count_existing(1, [m.key for m in messages]) == 0
    assert state.counters.metrics.get("link_held_back", 0) >= 1

    await alice.store.call(0, lambda r: r.config_set({"maxmemory": str(1024 * MB)}))
    with trio.fail_after(90):
        results = [(await bob.client.wait_results(m, timeout_s=90))[0] for m in messages]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(FLOOD)]

    async def outbox_empty() -> bool:  # alice's acks of the last frames may come after
        # their results (an acks frame and a result are two frames, on two links)
        return await records.outbox_depths(bob.store, alice.node_id) == (0, 0)

    assert await until_read(outbox_empty, 30)
    assert state.pressure.inbound.waiting[bob.node_id] == 0  # the consumer took every one
