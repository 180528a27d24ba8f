"""Acknowledged means durable on two machines: the ``WAITAOF`` barrier behind every promise.

A promise to someone else (a link's ack to a peer, a client's submit returning) rests on writes
already made, often by other connections of the pool. ``WAITAOF`` only waits for the writes of
its own connection, so the barrier is one write of its own, ``INCR durable`` in DB 0, followed
on the same connection by ``WAITAOF L R T``: replication has one stream, in order, so once the
barrier is fsynced locally (L = 1) and on R replicas, so is every write made before it.

Barriers are group-committed: callers that arrive while one is in flight wait for the next,
which covers all of them, so under load one round trip serves many promises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from bus.core import keys
from bus.errors import StoreError
from bus.store.sentinel import SentinelTarget

if TYPE_CHECKING:
    from bus.store.connection import Store


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
        self._covered = 0  # every ticket up to this one is durable
        self.rounds = 0  # barriers sent (for tests and the bench)

    async def wait(self, store: Store) -> None:
        self._asked += 1
        ticket = self._asked  # any barrier that starts from now on covers this caller's writes
        async with self._lock:
            if self._covered >= ticket:
                return
            upto = self._asked
            local, replicas = await store.call(keys.ACTORS_DB, self._round)
            self.rounds += 1
            if local < self.local or replicas < self.replicas:
                raise NotDurable(
                    f"redis {store.url}: not durable: WAITAOF confirmed {local} local and "
                    f"{replicas} replica fsync(s) in {self.timeout_ms} ms; "
                    f"{self.local} and {self.replicas} wanted"
                )
            self._covered = upto

    async def _round(self, client: Any) -> tuple[int, int]:  # noqa: ANN401 - coredis client
        async with client.pipeline(transaction=False) as pipe:
            pipe.incr(keys.DURABLE)
            done = [pipe.waitaof(self.local, self.replicas, t) for t in self.steps_ms()]
        local, replicas = (await done[-1]) if done else (0, 0)
        return int(local), int(replicas)

    def steps_ms(self) -> list[int]:
        """The timeouts of the WAITAOFs a barrier sends, growing to ``timeout_ms`` in all.

        A replica asked for its fsynced offset (REPLCONF GETACK, sent as a WAITAOF blocks) may
        answer before its fsync of the same write, and then tells again only a second later;
        each WAITAOF that blocks asks again, so a short one followed by longer ones is
        answered in milliseconds (one WAITAOF of 1 s waited up to 1 s: 0.55 s and 0.87 s
        measured; 5, 10, 20 ... ms: 16 ms at worst on a loaded machine). One that is met
        returns at once, and so do the ones after it."""
        steps: list[int] = []
        step, total = 5, 0
        while total < self.timeout_ms:
            steps.append(min(step, self.timeout_ms - total))
            total += steps[-1]
            step *= 2
        return steps or [0]
