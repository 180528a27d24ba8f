"""serve_queue across a failover: an old primary that woke inside it may take an entry's
acknowledgement and lose it when it is demoted, with no error for the service that sent it;
the entry is then in flight again on the new primary, and served again without a restart
(bus/store/serve.py), on a real replicated store."""

from __future__ import annotations

import coredis.exceptions
import trio

from bus.store.connection import open_store
from bus.store.serve import Done, Handler, Popped, Queue, serve_queue
from node.host.acl import NODE

SOURCE, INFLIGHT = "test:source", "test:inflight"


class Seen(Handler[None]):
    name = "seen"

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[str](10)

    async def each(self, popped: Popped) -> Done:
        await self.send.send(popped.value)
        return Done.ACK


async def test_an_entry_a_failover_left_in_flight_is_served_again(replicated):
    async with open_store(replicated.url(NODE)) as store, trio.open_nursery() as nursery:
        handler = Seen()
        queue = Queue(1, SOURCE, INFLIGHT, read=False, timeout_s=0.2)
        await nursery.start(serve_queue, store, queue, handler)  # recovered at start: nothing
        # as the new primary holds it: popped before the stall, its ack taken by the woken
        # old primary and lost with it
        await store.lpush(1, INFLIGHT, "ack-lost")
        # what a failed command tells the store (an epoch of its own); the service's pops go on
        store.failover.noticed(
            coredis.exceptions.ConnectionError("Unable to establish a connection")
        )
        with trio.fail_after(10):
            assert await handler.receive.receive() == "ack-lost"
        await store.lpush(1, SOURCE, "next")  # and serving goes on
        with trio.fail_after(10):
            assert await handler.receive.receive() == "next"
        # acknowledged before the next pop: one loop, entry after entry
        assert "ack-lost" not in await store.lrange(1, INFLIGHT)
        nursery.cancel_scope.cancel()
