"""Acknowledged means durable on two machines: the ``WAITAOF`` behind every promise.

A promise to someone else (a client's submit returning, a link's ack to a peer) is given once
``WAITAOF L R T`` confirms that its writes are fsynced locally (L = 1) and on R replicas.
``WAITAOF`` waits for the last write of its own connection; replication has one stream, in
order, so that write covers every write the server took before it, on any connection.

Both promises make their last write themselves, so neither needs a write of its own to wait
on: :meth:`Barrier.write_and_wait` (a submit's ``MULTI``/``EXEC``) and
:meth:`Barrier.scripts_and_wait` (a ``msgs`` frame's delivery scripts, pipelined) send the write
and then ``WAITAOF`` on one connection they hold throughout, one ``WAITAOF`` for the whole
batch. Against a barrier write that saves a round trip and, on a replica, a second fsync in
series: the replica fsyncs the promise's write while its reply travels, and the
``REPLCONF GETACK`` that ``WAITAOF`` sends comes after that write, not with it.

How many replicas' fsyncs a promise waits for is bus/store/promise.py's decision (the promise
in force: every replica of the set by default); the count is asked of the Sentinels before a
promise's ``WAITAOF``, at most every ``REFRESH_S`` (one Sentinel round trip then).

The barrier (:meth:`Barrier.wait`) is left for a promise whose writes are not covered by the
connection that wrote last: a delivery batch whose last message was a redelivery (its message
stored by an earlier delivery, on another connection, maybe after this batch's own writes and
not confirmed yet). It is one write of its own, ``INCR durable`` in DB 0, then ``WAITAOF`` on
the same connection; barriers are group-committed: callers that arrive while one is in flight
wait for the next, which covers all of them.

A ``WAITAOF`` still unanswered :data:`NUDGE_AFTER_S` after it was sent is *nudged*
(:class:`Nudges`): another connection sends :data:`NUDGE`, a ``WAITAOF`` that cannot be
satisfied, so that it blocks and the primary sends every replica ``REPLCONF GETACK`` again
(server.c ``beforeSleep``: a blocked ``WAIT``/``WAITAOF`` is what makes it ask). A replica
answers a GETACK with the offset it has fsynced when it reads it (replication.c
``replicationSendAck``), and fsyncs (``appendfsync always``) only in its ``beforeSleep``, after
everything it read in that loop: a GETACK read together with the write it follows is answered
before that write's fsync, and the replica says nothing more until its periodic ack, once a
second. A replica slow to read its stream (a loaded machine) reads the write and the first
GETACK together; the nudge's GETACK, read in a later loop, is answered with the fsync, which
answers the waiting ``WAITAOF`` at once instead of at its first timeout, seen by the server
only on a clock tick (10-100 ms). A nudge confirms nothing: its own connection made none of
the writes, its reply is dropped, and the promise stays the reply of the ``WAITAOF`` on the
connection that wrote; a nudge that fails leaves that wait as it was without nudges.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import coredis.exceptions
import trio

from bus.core import keys
from bus.errors import StoreError
from bus.store.atomic import ScriptCall, evalsha_on
from bus.store.lane import Lane, LaneConnection, transaction
from bus.store.promise import ReplicasWanted
from bus.store.sentinel import (
    NUDGE,
    NUDGE_AFTER_S,
    NUDGES_AT_ONCE,
    SentinelTarget,
    nudge_gaps,
)
from bus.store.topology import Replaced

if TYPE_CHECKING:
    from bus.store.connection import Store


log = logging.getLogger(__name__)

REFUSALS_LOGGED_EVERY = 100  # a store refusing every promise says so once, then every 100th
COUNT_WAIT_S = 2.0  # longest the Sentinels are waited for when the replicas are counted

NUDGE_WAIT_S = 1.0  # longest a nudge's own reply is waited for (a stalled primary)


class NotDurable(StoreError):
    """WAITAOF did not confirm the writes in time: the promise must not be given."""


class Nudges:
    """The nudges of one store's ``WAITAOF``s (module docstring), sent on ``lane`` by one task
    in ``nursery``, started with the first wait and ended by :meth:`close`. The task sleeps
    until the newest unanswered ``WAITAOF`` is :data:`NUDGE_AFTER_S` old: a wait answered
    sooner only moves its deadline, and wakes nothing."""

    def __init__(self, nursery: trio.Nursery, lane: Lane) -> None:
        self.nursery = nursery
        self.lane = lane
        self.command = NUDGE  # what a nudge sends
        self.sent = 0  # nudges sent (for tests and the bench)
        self.failed = 0  # nudges that failed: nothing else came of them
        self._waiting = 0  # WAITAOFs sent and not answered yet
        self._waits = 0  # WAITAOFs sent so far
        self._deadline = math.inf  # when the next nudge is due
        self._timer: trio.CancelScope | None = None  # the task's sleep until then
        self._nudging = 0  # nudges sent and not answered yet
        self._quiet = trio.Event()  # set while no nudge is in flight
        self._quiet.set()
        self._started = self._closed = False

    @contextmanager
    def around(self) -> Iterator[None]:
        """Nudges while the block awaits a ``WAITAOF``'s reply (sent when the block starts)."""
        self._waiting += 1
        self._waits += 1
        self._due(trio.current_time() + NUDGE_AFTER_S)
        if not self._started and not self._closed:
            self._started = True
            self.nursery.start_soon(self._run)
        try:
            yield
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._due(math.inf)

    async def settled(self) -> None:
        """Return once no nudge is in flight. A nudge blocks on the server until its next loop,
        maybe after the wait it nudged was answered, and the server counts a command when it
        ends: tests that count a primary's ``WAITAOF``s settle the nudges first."""
        while self._nudging:
            await self._quiet.wait()

    def close(self) -> None:
        """End the task (the store is closing)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    def _due(self, deadline: float) -> None:
        self._deadline = deadline
        if self._timer is not None:
            self._timer.deadline = deadline

    async def _run(self) -> None:
        gaps, seen = nudge_gaps(), 0
        while not self._closed:
            with trio.CancelScope(deadline=self._deadline) as self._timer:
                await trio.sleep_forever()
            self._timer = None
            if self._closed:
                return
            if not self._waiting or trio.current_time() < self._deadline:
                continue
            if self._waits != seen:  # a newer WAITAOF: nudged on a schedule of its own
                gaps, seen = nudge_gaps(), self._waits
                next(gaps)  # the first gap led here
            if self._nudging < NUDGES_AT_ONCE:
                # not awaited: a nudge is answered on the server's next loop after its
                # 1 ms, and a quiet server's next loop may be its clock tick (100 ms)
                if not self._nudging:
                    self._quiet = trio.Event()
                self._nudging += 1
                self.nursery.start_soon(self._nudge)
            self._deadline = trio.current_time() + next(gaps)

    async def _nudge(self) -> None:
        try:
            await self.nudge()
        finally:
            self._nudging -= 1
            if not self._nudging:
                self._quiet.set()

    async def nudge(self) -> None:
        """Send one nudge and read its reply; a failure is counted and logged, never raised."""
        try:
            with trio.move_on_after(NUDGE_WAIT_S):  # cut short: its connection is closed
                async with self.lane.acquire(keys.ACTORS_DB) as connection:
                    reply = connection.create_request(*self.command, decode=False)
                    self.sent += 1
                    await reply
                return
            raise TimeoutError(f"no reply in {NUDGE_WAIT_S} s")
        except Exception as exc:  # a nudge stops nothing: the store's nursery holds this task
            if self._closed:  # the lane is closed (RuntimeError): nothing waits any more
                return
            if self.failed % REFUSALS_LOGGED_EVERY == 0:
                log.warning("store: a WAITAOF nudge failed (%s so far): %s", self.failed + 1, exc)
            self.failed += 1


class Barrier:
    """The durability barrier of one store (``target``: what its URL asks; ``clock``: how the
    age of the replica count is read, trio's by default; ``nudges``: how its ``WAITAOF``s are
    nudged, None: never)."""

    def __init__(
        self,
        target: SentinelTarget,
        clock: Callable[[], float] = trio.current_time,
        nudges: Nudges | None = None,
    ) -> None:
        self.target = target
        self.nudges = nudges
        self.replicas = ReplicasWanted(target.promise, target.waitaof_replicas, clock)
        self.refused = 0  # promises not given (for /metrics and the log)
        self._counting = trio.Lock()
        self._lock = trio.Lock()
        self._asked = 0  # tickets handed out
        self._covered = 0  # every ticket up to this one is durable ...
        self._covered_epoch: int | None = None  # ... if its writes were made in this epoch
        self.rounds = 0  # barriers sent (for tests and the bench)

    def close(self) -> None:
        """The store is closing: no more nudges."""
        if self.nudges is not None:
            self.nudges.close()

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
            assert store.lane is not None  # a store behind Sentinels has one
            try:  # never sent again: only the server that took the writes can vouch for them
                async with store.lane.acquire(keys.ACTORS_DB) as connection:
                    await connection.create_request(b"INCR", keys.DURABLE)
                    await self._confirm(store, connection, epoch)
            except (coredis.exceptions.RedisError, OSError) as exc:
                self._failed(store, exc)
            self._covered, self._covered_epoch = upto, epoch

    async def write_and_wait(
        self,
        store: Store,
        connection: LaneConnection,
        commands: list[tuple[Any, ...]],
        since: int,
        written: Callable[[], None] | None = None,
    ) -> None:
        """``commands`` in one ``MULTI``/``EXEC`` (:func:`bus.store.lane.transaction`), and
        once it is answered ``WAITAOF`` on the same connection: return once that write and
        every write before it are durable, else NotDurable (``since``: :attr:`Store.epoch`
        before the promise's first write). The write's own errors are coredis's, raised
        before any ``WAITAOF`` (the caller's retry policy decides about them, as for any
        transaction); ``written`` is called once the write is answered, before the wait."""
        await transaction(connection, commands)
        if written is not None:
            written()
        if since != store.epoch:
            raise NotDurable(f"redis {store.url}: not durable: a failover came meanwhile")
        await self._confirm(store, connection, since)

    async def scripts_and_wait(
        self,
        store: Store,
        connection: LaneConnection,
        calls: Sequence[ScriptCall],
        since: int,
        wrote_last: Callable[[list[Any]], bool],
    ) -> list[Any]:
        """Each call's ``EVALSHA``, pipelined on ``connection``, held throughout (a script the
        server does not know yet is loaded and run again there: :func:`evalsha_on`), and
        once all are answered ``WAITAOF`` on that connection: the results, returned once those
        writes and every write before them are durable, else NotDurable (``since``:
        :attr:`Store.epoch` before the promise's first write).

        ``wrote_last(results)``: whether the calls wrote, and no call that relies on an
        earlier write (a redelivery, finding its message stored) came after their last
        write. Otherwise that earlier write, made by another connection and maybe after this
        connection's last write, is not covered by a ``WAITAOF`` here: the barrier
        (:meth:`wait`) confirms the promise instead, at the cost of its own write."""
        results = await evalsha_on(connection, calls, store.url)
        if wrote_last(results):
            if since != store.epoch:
                raise NotDurable(f"redis {store.url}: not durable: a failover came meanwhile")
            await self._confirm(store, connection, since)
        else:
            await self.wait(store, since)
        return results

    async def count_replicas(self, store: Store, written: str | None = None) -> None:
        """Ask the Sentinels how many replicas the set has and how many they flag down, when
        the promise counts them and the count is stale (bus/store/promise.py); NotDurable if
        it was never known, or if they agree on another primary than ``written`` (ip:port,
        where the promise's writes went: an old primary woken inside their failover keeps a
        replica whose resync erases what it confirmed). A count once known outlives
        Sentinels that do not answer, every replica counted then."""
        if not self.replicas.stale():
            return
        async with self._counting:
            if not self.replicas.stale():
                return
            try:
                with trio.fail_after(COUNT_WAIT_S):  # a stalled Sentinel holds no promise long
                    self.replicas.learn(*await store.known_replicas(written))
            except Replaced as exc:  # left stale: the next promise asks them again
                self.refused += 1
                raise NotDurable(f"redis {store.url}: {exc}") from exc
            except (StoreError, trio.TooSlowError) as exc:
                why = self.replicas.unknown()
                if why is not None:
                    self.refused += 1
                    raise NotDurable(f"redis {store.url}: not durable: {why}: {exc}") from exc
                self.replicas.unanswered()
                known = self.replicas.known
                log.warning("store: replicas not counted again (%s); all %d counted", exc, known)

    async def _confirm(
        self,
        store: Store,
        connection: LaneConnection,
        epoch: int,
    ) -> None:
        """``WAITAOF`` on ``connection``, right after its last write was answered; NotDurable
        unless it confirms, in this epoch, what this store's URL asks.

        Not pipelined with the write: a replica answers the primary's REPLCONF GETACK as soon
        as it reads it, and when the write and the GETACK arrive together it answers before
        its fsync of the write, then tells again only a second later (its periodic ack):
        pipelined, a barrier took 620 ms at the median; sent after the write's reply, 0.6 ms
        (loopback, appendfsync always on the replicas)."""
        # every promise passes here: one place decides
        await self.count_replicas(store, connection.where)
        local, replicas, wanted = await self._waitaof(store, connection)
        if not self.target.confirmed(local, replicas, wanted):
            # a replica that went down since the count: counted out once the Sentinels flag
            # it, and the writes confirmed on the others, with a WAITAOF of the new count
            self.replicas.changed()
            await self.count_replicas(store, connection.where)
            if self.replicas.wanted < wanted:
                local, replicas, wanted = await self._waitaof(store, connection)
        if store.epoch != epoch:
            raise NotDurable(f"redis {store.url}: not durable: a failover came meanwhile")
        self.rounds += 1
        if not self.target.confirmed(local, replicas, wanted):
            self.replicas.changed()
            shortfall = self.target.shortfall(local, replicas, wanted)
            if self.refused % REFUSALS_LOGGED_EVERY == 0:
                log.warning("store: promise not given (%s so far): %s", self.refused + 1, shortfall)
            self.refused += 1
            raise NotDurable(f"redis {store.url}: not durable: {shortfall}")

    async def _waitaof(self, store: Store, connection: LaneConnection) -> tuple[int, int, int]:
        """The WAITAOFs of one confirmation (the count as it stands): local and replica
        fsyncs confirmed, and the replicas wanted."""
        local = replicas = 0
        wanted = self.replicas.wanted
        try:  # never sent again: only the server that took the writes can vouch for them
            for wait_ms in self.target.waits_ms():  # a second asks again after the race above
                ask = (self.target.waitaof_local, wanted, wait_ms)
                reply = connection.create_request(b"WAITAOF", *ask, decode=False)
                if self.nudges is None:
                    local, replicas = await reply
                else:
                    with self.nudges.around():
                        local, replicas = await reply
                if self.target.confirmed(int(local), int(replicas), wanted):
                    break
        except (coredis.exceptions.RedisError, OSError) as exc:
            self._failed(store, exc)
        return int(local), int(replicas), wanted

    @staticmethod
    def _failed(store: Store, exc: BaseException) -> NoReturn:
        if store.failover is not None:  # the next barrier asks the Sentinels again
            store.failover.noticed(exc)
        raise NotDurable(f"redis {store.url}: not durable: {exc}") from exc
