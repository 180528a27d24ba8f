"""Acknowledged means durable on two machines: the ``WAITAOF`` barrier behind every promise.

A promise to someone else (a link's ack to a peer, a client's submit returning) rests on writes
already made, often by other connections of the pool. ``WAITAOF`` only waits for the writes of
its own connection, so the barrier is one write of its own, ``INCR durable`` in DB 0, followed
on the same connection by ``WAITAOF L R T``: replication has one stream, in order, so once the
barrier is fsynced locally (L = 1) and on R replicas, so is every write made before it.

Barriers are group-committed: callers that arrive while one is in flight wait for the next,
which covers all of them, so under load one round serves many promises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import coredis.exceptions
import trio

from bus.core import keys
from bus.errors import StoreError
from bus.store.sentinel import SentinelTarget

if TYPE_CHECKING:
    from bus.store.connection import Store


# The first WAITAOF's timeout (the server checks it on its clock ticks, 100 ms apart at the
# default hz 10), before a second one asks the replicas again.
FIRST_WAIT_MS = 10


class NotDurable(StoreError):
    """WAITAOF did not confirm the writes in time: the promise must not be given."""


class Barrier:
    """The durability barrier of one store (``target``: what its URL asks)."""

    def __init__(self, target: SentinelTarget) -> None:
        self.local = target.waitaof_local
        self.replicas = target.waitaof_replicas
        self.timeout_ms = target.waitaof_timeout_ms
        self._lock = trio.Lock()
        self._asked = 0  # tickets handed out
        self._covered = 0  # every ticket up to this one is durable ...
        self._covered_epoch: int | None = None  # ... if its writes were made in this epoch
        self.rounds = 0  # barriers sent (for tests and the bench)

    async def wait(self, store: Store, since: int | None = None) -> None:
        """Return once the writes made before this call are durable; NotDurable if that is not
        confirmed, or if a failover may have come between them and the barrier (``since``:
        :attr:`Store.epoch` before the writes): a barrier on a new primary says nothing of
        writes the old one took."""
        self._asked += 1
        ticket = self._asked  # any barrier that starts from now on covers this caller's writes
        async with self._lock:
            if self._covered >= ticket and since in (None, self._covered_epoch):
                return
            upto, epoch = self._asked, store.epoch
            if since is not None and since != epoch:
                raise NotDurable(f"redis {store.url}: not durable: a failover came meanwhile")
            client = await store.db(keys.ACTORS_DB)
            try:  # never sent again: only the server that took the writes can vouch for them
                local, replicas = await self._round(client)
            except (coredis.exceptions.RedisError, OSError) as exc:
                if store.failover is not None:  # the next barrier asks the Sentinels again
                    store.failover.noticed(exc, client)
                raise NotDurable(f"redis {store.url}: not durable: {exc}") from exc
            if store.epoch != epoch:
                raise NotDurable(f"redis {store.url}: not durable: a failover came meanwhile")
            self.rounds += 1
            if local < self.local or replicas < self.replicas:
                raise NotDurable(
                    f"redis {store.url}: not durable: WAITAOF confirmed {local} local and "
                    f"{replicas} replica fsync(s) in {self.timeout_ms} ms; "
                    f"{self.local} and {self.replicas} wanted"
                )
            self._covered, self._covered_epoch = upto, epoch

    async def _round(self, client: Any) -> tuple[int, int]:  # noqa: ANN401 - coredis client
        """``INCR durable``, its reply, then ``WAITAOF`` on the same connection (held for the
        round, so no other command shares it meanwhile).

        Not pipelined: a replica answers the primary's REPLCONF GETACK as soon as it reads it,
        and when the write and the GETACK arrive together it answers before its fsync of the
        write, then tells again only a second later (its periodic ack): pipelined, a barrier
        took 620 ms at the median; sent after the write's reply, 0.6 ms (loopback, appendfsync
        always on the replicas)."""
        first = min(self.timeout_ms, FIRST_WAIT_MS)
        async with client.connection_pool.acquire() as connection:
            await connection.create_request(b"INCR", keys.DURABLE)
            local, replicas = await connection.create_request(
                b"WAITAOF", self.local, self.replicas, first, decode=False
            )
            if (local < self.local or replicas < self.replicas) and self.timeout_ms > first:
                # the race above, lost all the same: a WAITAOF that blocks asks again
                local, replicas = await connection.create_request(
                    b"WAITAOF", self.local, self.replicas, self.timeout_ms - first, decode=False
                )
        return int(local), int(replicas)
