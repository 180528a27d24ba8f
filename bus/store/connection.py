"""The Redis store: one coredis client per DB, object load/save, reliable queues, atomic updates.

Every coredis error is translated into :class:`StoreError` here; nothing above bus/ sees coredis.
Blocking pops take a connection of their own, so a service waiting on BLMOVE never delays
another's commands. The hot path (script calls, blocking pops, a submission's transaction, the
durability barriers) runs on the store's lane (bus/store/lane.py), whose errors are coredis'
classes and get the same translation and, behind Sentinels, the same failover policy; on a URL
without a lane (TLS, options) on coredis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import coredis
import coredis.exceptions
import trio
from coredis.commands.script import Script
from coredis.tokens import PureToken

from bus.core import keys
from bus.core.ids import now
from bus.core.models import Actor, Context, Hash, decode_hash
from bus.core.reasons import Reason
from bus.core.text import dlq_entry, printable
from bus.core.urls import redact
from bus.errors import ContentError, StoreError
from bus.store.atomic import ScriptCall, evalsha_on, queues, send_evalshas
from bus.store.durable import Barrier, Nudges
from bus.store.failover import Failover, dial
from bus.store.lane import Lane, LaneConnection, Queued, lane_for, transaction
from bus.store.sentinel import is_sentinel_url, parse_sentinel_url
from bus.store.topology import known_replicas, store_topology

log = logging.getLogger(__name__)

T = TypeVar("T")
Redis = coredis.Redis[str]

MAX_REDELIVERIES = 5


def _flat_hash(raw: Any) -> Hash:  # noqa: ANN401 - a Lua reply: flat list (or RESP3 map)
    if isinstance(raw, dict):
        return decode_hash(raw)
    pairs = iter(raw)
    if bytes not in map(type, raw):  # all text (a hash read's fields are text or bytes)
        return dict(zip(pairs, pairs, strict=True))
    return decode_hash(dict(zip(pairs, pairs, strict=True)))


# Replies that say the content a command touched is unusable, not that the server failed,
# and the reason each gives the entry that named it.
_CONTENT_ERRORS = {
    "WRONGTYPE": Reason.WRONG_TYPE,
    "not an integer": Reason.NOT_A_NUMBER,
    "overflow": Reason.NOT_A_NUMBER,
    "DB index is out of range": Reason.UNKNOWN_CONTEXT,
}


def _content_error(exc: Exception) -> ContentError | None:
    """The ContentError a reply means when it blames what a key holds, not the server."""
    text = str(exc)
    if isinstance(exc, coredis.exceptions.WrongTypeError):
        return ContentError(Reason.WRONG_TYPE, printable(text))
    if isinstance(exc, coredis.exceptions.ResponseError):
        for marker, reason in _CONTENT_ERRORS.items():
            if marker in text:
                return ContentError(reason, printable(text))
    return None


@contextmanager
def _translated(url: str, *, content: bool = True) -> Iterator[None]:
    """The one translation of coredis and socket errors into bus errors: ContentError when the
    reply blames what a key holds (a service refuses the entry that named it; only with
    ``content``), else StoreError (Redis failed). Nothing of coredis leaves this block."""
    try:
        yield
    except _FAILURES as exc:
        raise _translation(url, exc, content=content) from exc


_FAILURES = (coredis.exceptions.RedisError, OSError)  # what :func:`_translated` translates


def _translation(url: str, exc: Exception, *, content: bool = True) -> Exception:
    """What :func:`_translated` raises for ``exc`` (one of _FAILURES)."""
    return (_content_error(exc) if content else None) or StoreError(f"redis {url}: {exc}")


class Store:
    """Access to one Valkey/Redis server; ``await db(n)`` gives the client for DB n.

    coredis wants each client's connection pool entered by a parent task before other tasks
    share it, so every client is opened by a holder task in the store's own nursery.
    """

    def __init__(self, url: str, nursery: trio.Nursery) -> None:
        self.url = redact(url)  # for errors and logs; only the pool sees the password
        self._dial_url = url
        self._nursery = nursery
        self._clients: dict[int, Redis] = {}
        self._open_lock = trio.Lock()
        self._closing = trio.Event()
        self._holders: set[trio.CancelScope] = set()
        target = parse_sentinel_url(url) if is_sentinel_url(url) else None
        self.failover = Failover(self._leave) if target is not None else None
        # script calls and blocking pops on connections of the store's own (bus/store/lane.py);
        # None where coredis serves them too (TLS, options): never behind Sentinels
        self.lane: Lane | None = lane_for(url)
        self.barrier: Barrier | None = None
        if target is not None and target.durable:  # its WAITAOFs nudged on the lane's connections
            nudges = Nudges(nursery, self.lane) if self.lane is not None else None
            self.barrier = Barrier(target, nudges=nudges)
        # the registry's version as the script of the last pop whose entries are admitted
        # (pop_read_batch, pop_read_wait with ``registry``) read it, after its pops: it sees
        # every registry write made before what it popped was pushed (node/state.py's cache)
        self.registry_seen: str | None = None

    async def db(self, n: int) -> Redis:
        client = self._clients.get(n)
        if client is not None:
            return client
        async with self._open_lock:
            if n not in self._clients:
                # shielded: the holder is, so the start waits for it anyway; but trio leaves a
                # task whose starter was cancelled in the start's own nursery, where the start
                # would wait for it until the store closes, and the store's close for the start
                with trio.CancelScope(shield=True):
                    self._clients[n] = await self._nursery.start(self._hold_client, n)
        return self._clients[n]

    async def _hold_client(self, n: int, *, task_status: trio.TaskStatus[Redis]) -> None:
        """Own DB ``n``'s client until the store closes. Shielded, so that the services the
        store serves can still write (a shutdown requeue, say) while they are being cancelled;
        :func:`open_store` bounds how long that may take."""
        with (
            trio.CancelScope(shield=True) as scope,
            _translated(f"{self.url} db {n}", content=False),
        ):
            self._holders.add(scope)
            async with dial(self._dial_url, n) as client:
                task_status.started(client)
                await self._closing.wait()

    def _close(self, grace_s: float = 5.0) -> None:
        self._closing.set()
        if self.barrier is not None:
            self.barrier.close()
        if self.lane is not None:
            self.lane.close()
        for scope in self._holders:
            scope.deadline = trio.current_time() + grace_s

    # -- generic ---------------------------------------------------------------------------------

    async def call(
        self,
        db: int,
        fn: Callable[[Redis], Awaitable[T]],
        *,
        idempotent: bool = False,
        resend: bool = True,
    ) -> T:
        """Run one coredis command on DB ``db``, translating its errors.

        On a replicated store a command cut by a failover is sent again to the new primary
        (:meth:`bus.store.failover.Failover.retrying`) when it cannot have run, or when it is
        ``idempotent`` (a read); otherwise the StoreError reports it. ``resend=False``: never
        sent again (several commands, some of which may have run before the refusal)."""
        client = await self.db(db)
        try:
            with _translated(self.url):
                if self.failover is None or not resend:
                    return await fn(client)
                return await self.failover.retrying(lambda: fn(client), idempotent=idempotent)
        except RuntimeError as exc:  # coredis: the pool has exited (the store is closing)
            raise StoreError(f"redis {self.url}: store closed ({exc})") from exc

    async def read(self, db: int, fn: Callable[[Redis], Awaitable[T]]) -> T:
        """:meth:`call` for a command that only reads (sent again if a failover cuts it)."""
        return await self.call(db, fn, idempotent=True)

    def follow_failover(self) -> None:
        """Drop every connection to the old primary (the Sentinels named another): commands
        waiting on a primary that stalled or was cut off end now (StoreError, their service
        restarts) instead of when it comes back; new connections ask the Sentinels."""
        self.saw_failover()
        if self.lane is not None:
            self.lane.drop()
        for client in self._clients.values():
            client.connection_pool.disconnect()

    def _leave(self) -> None:
        """A reply came from a server that is no longer the primary: the next connections ask
        the Sentinels (those in use end their command first, :meth:`Lane.forget`)."""
        if self.lane is not None:
            self.lane.forget()
        for client in self._clients.values():
            client.connection_pool.disconnect()

    @property
    def epoch(self) -> int:
        """Grows with every sign of a failover; pass the value read before a promise's writes
        to :meth:`durable`."""
        return 0 if self.failover is None else self.failover.epoch

    def saw_failover(self) -> None:
        """The epoch grows: writes made before now may be lost (an old primary demoted)."""
        if self.failover is not None:
            self.failover.grow()

    @contextmanager
    def waking_on_failover(self, wake: Callable[[], None]) -> Iterator[None]:
        """Call ``wake()`` each time the store sees a failover (its epoch grows) within the
        block; never on a store without Sentinels.

        A write is not a promise: one the old primary took may be lost in a failover, and
        what a service writes only when its own state changes (the node's counters, link
        states, breakers, job statistics, node:info) would then leave the new primary's older
        copy standing while nothing changes. Such a service wakes its own trigger here and
        writes again (docs/operate/promise.md)."""
        if self.failover is None:
            yield
            return
        self.failover.wakes.append(wake)
        try:
            yield
        finally:
            self.failover.wakes.remove(wake)

    async def topology(self) -> dict[str, Any]:
        """Where this store's primary and replicas are (bus/store/topology.py)."""
        return await store_topology(self._dial_url)

    async def known_replicas(self, written: str | None = None) -> tuple[int, int]:
        """How many replicas the Sentinels list for this store's set, and how many of those
        they flag down (StoreError if none answers; bus/store/promise.py counts them;
        bus/store/topology.py Replaced if they name another primary than ``written``)."""
        return await known_replicas(self._dial_url, written)

    async def durable(self, since: int | None = None) -> None:
        """Return once every write made before this call is on disk as the store's URL asks
        (``WAITAOF``: bus/store/durable.py); at once on a store that asks nothing (the
        embedded single Valkey). StoreError if that is not confirmed in time: then no promise
        resting on those writes may be given."""
        if self.barrier is not None:
            await self.barrier.wait(self, since)

    @asynccontextmanager
    async def transaction(self, db: int) -> AsyncIterator[Any]:
        """A MULTI/EXEC pipeline on DB ``db``; commands queued inside run atomically on exit."""
        client = await self.db(db)
        with _translated(self.url):
            async with client.pipeline(transaction=True) as pipe:
                yield pipe

    async def transact(
        self,
        db: int,
        fill: Callable[[Any], None],
        *,
        durable_since: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> None:
        """A MULTI/EXEC of the commands ``fill`` queues on the pipeline it is given; on a
        replicated store sent again when a failover refused it before it ran (a transaction
        cut after it was sent is reported: it may have run).

        ``durable_since`` (:attr:`epoch` before a promise's first write): return only once
        this write and every write before it are durable, as :meth:`durable` would, but
        confirmed by ``WAITAOF`` on the connection that made this write, without a barrier
        write of its own (bus/store/durable.py), ``written`` called once the write is
        answered, before that wait; NotDurable if that is not confirmed."""
        if self.lane is None:  # a URL without a lane is never behind Sentinels
            async with self.transaction(db) as pipe:
                fill(pipe)
            return
        queued = Queued()
        fill(queued)
        barrier = self.barrier if durable_since is not None else None

        async def once(conn: LaneConnection) -> None:
            if barrier is not None and durable_since is not None:
                await barrier.write_and_wait(self, conn, queued.commands, durable_since, written)
            else:
                await transaction(conn, queued.commands)

        await self._on_lane(db, once)

    async def script(self, db: int, script: Script[str], keys: list[str], args: list[str]) -> Any:  # noqa: ANN401
        """Run a Lua script on DB ``db`` (:meth:`scripts`, for one call): its result.

        Not coredis's ``Script`` call, whose client, retry and command wrappers cost ~100-200
        µs more CPU per call here than the bare ``EVALSHA`` on a pooled connection, and a
        node runs a script for most steps of a message (pops, materialising, results)."""
        [result] = await self.scripts(db, [(script, keys, args)])
        return result

    async def scripts(self, db: int, calls: list[ScriptCall]) -> list[Any]:
        """Several Lua scripts in one pipelined round trip (not atomic together); results.
        Bare EVALSHAs on one connection; those the server answers NOSCRIPT (a fresh or
        restarted server: nothing of them ran) are loaded and run again
        (:func:`bus.store.atomic.evalsha_on`). On a replicated store one call is
        sent again when a failover refused it before it ran (as :meth:`call` does); a batch
        is not: some of it may have run before the refusal."""

        if self.lane is not None:
            resend = len(calls) == 1
            return await self._on_lane(db, lambda c: evalsha_on(c, calls, self.url), resend=resend)

        async def run(client: Redis) -> list[Any]:
            async with client.connection_pool.acquire() as connection:
                return await evalsha_on(connection, calls, self.url)

        return await self.call(db, run)

    async def _on_lane(
        self, db: int, fn: Callable[[LaneConnection], Awaitable[T]], *, resend: bool = True
    ) -> T:
        """``fn`` on a connection of :attr:`lane` to DB ``db``, its errors translated as
        :meth:`call` translates coredis', and behind Sentinels sent again as :meth:`call`
        does (never with ``resend=False``)."""
        lane = self.lane
        assert lane is not None

        async def once() -> T:
            # the lane's acquire block, unrolled: its enter and exit would be two coroutines
            # more on the way of each pop and script call
            conn = lane.idle(db) or await lane.fresh(db)
            try:
                return await fn(conn)
            finally:
                lane.give_back(db, conn)

        # _translated's translation, without its context manager: this runs twice for every
        # message (its pop, its script), and the generator behind such a block costs as much
        # as the rest of this method
        try:
            if self.failover is None or not resend:
                return await once()
            return await self.failover.retrying(once)
        except _FAILURES as exc:
            raise _translation(self.url, exc) from exc
        except RuntimeError as exc:  # the lane is closed (the store is closing)
            raise StoreError(f"redis {self.url}: store closed ({exc})") from exc

    async def scripts_durable(
        self,
        db: int,
        calls: list[ScriptCall],
        since: int,
        wrote_last: Callable[[list[Any]], bool],
    ) -> list[Any]:
        """:meth:`scripts` for a promise (``since``: :attr:`epoch` before its first write):
        the results, returned once these writes and every write before them are durable,
        confirmed by one ``WAITAOF`` on the connection that ran them
        (:meth:`bus.store.durable.Barrier.scripts_and_wait`, which says what ``wrote_last``
        decides); at once on a store that asks nothing. NotDurable if not confirmed."""
        barrier = self.barrier
        if barrier is None:
            return await self.scripts(db, calls)
        return await self._on_lane(
            db, lambda c: barrier.scripts_and_wait(self, c, calls, since, wrote_last), resend=False
        )

    async def ping(self) -> None:
        await self.read(0, lambda r: r.ping())

    async def hgetall(self, db: int, key: str) -> Hash:
        raw = await self.read(db, lambda r: r.hgetall(key))
        return decode_hash(raw)

    async def hset(self, db: int, key: str, fields: Mapping[str, str]) -> None:
        await self.call(db, lambda r: r.hset(key, dict(fields)))

    async def lpush(self, db: int, key: str, *values: str) -> None:
        if self.lane is not None:  # a hand-off on the job path (a peer's outbox, a reply list)
            await self._lane_request(db, "LPUSH", key, *values)
            return
        await self.call(db, lambda r: r.lpush(key, list(values)))

    async def lrange(self, db: int, key: str) -> list[str]:
        return list(await self.read(db, lambda r: r.lrange(key, 0, -1)))

    async def llen(self, db: int, key: str) -> int:
        return int(await self.read(db, lambda r: r.llen(key)))

    async def exists(self, db: int, key: str) -> bool:
        return bool(await self.read(db, lambda r: r.exists([key])))

    async def count_existing(self, db: int, names: list[str]) -> int:
        """How many of ``names`` exist (one EXISTS)."""
        return int(await self.read(db, lambda r: r.exists(names)))

    async def get(self, db: int, key: str) -> str | None:
        value = await self.read(db, lambda r: r.get(key))
        return None if value is None else str(value)

    async def set_new(self, db: int, key: str, value: str, ttl_s: int) -> bool:
        """SET ``key`` with a TTL unless it exists; True if this call set it."""
        won = await self.call(db, lambda r: r.set(key, value, condition=PureToken.NX, ex=ttl_s))
        return bool(won)

    async def smembers(self, db: int, key: str) -> set[str]:
        return {str(m) for m in await self.read(db, lambda r: r.smembers(key))}

    async def sismember(self, db: int, key: str, member: str) -> bool:
        return bool(await self.read(db, lambda r: r.sismember(key, member)))

    async def srem(self, db: int, key: str, *members: str) -> int:
        return int(await self.call(db, lambda r: r.srem(key, list(members))))

    async def blpop(self, db: int, key: str, timeout_s: float) -> str | None:
        """The oldest entry of list ``key``, waiting up to ``timeout_s``; None after that."""
        if self.lane is not None:
            popped = await self._lane_request(db, "BLPOP", key, timeout_s)
        else:
            popped = await self.call(db, lambda r: r.blpop([key], timeout=timeout_s))
        return None if popped is None else str(popped[1])

    async def blmpop(self, db: int, key: str, timeout_s: float, most: int) -> list[Any]:
        """Up to ``most`` entries off the consuming end of list ``key``, oldest first, waiting
        up to ``timeout_s`` for the first ([] if none came)."""
        if self.lane is not None:
            command = ("BLMPOP", timeout_s, 1, key, "RIGHT", "COUNT", most)
            popped = await self._lane_request(db, *command)
        else:
            popped = await self.call(
                db, lambda r: r.blmpop([key], timeout_s, PureToken.RIGHT, count=most)
            )
        return list(popped[1]) if popped else []

    async def _lane_request(self, db: int, *command: str | int | float) -> Any:  # noqa: ANN401
        """One command on a connection of :attr:`lane`: its raw reply (a blocking pop waits on
        a connection of its own, dropped if the wait is cancelled)."""
        return await self._on_lane(db, lambda c: c.create_request(*command))

    # -- reliable queues -------------------------------------------------------------------------

    async def utf8_entry(self, db: int, inflight: str, value: object, queue: str) -> str | None:
        """A popped entry as text; None if it is not UTF-8 (coredis then hands over its bytes):
        refused with reason ``not_utf8``."""
        if not isinstance(value, bytes):
            return str(value)
        detail = "the entry is not UTF-8 text"
        await self.refuse_entry(db, inflight, value, Reason.NOT_UTF8, detail, queue=queue)
        return None

    async def pop_batch(
        self, db: int, source: str, inflight: str, limit: int, *, registry: bool = False
    ) -> list[str]:
        """Move up to ``limit`` entries already queued on ``source`` to ``inflight`` (one round
        trip; the batching partner of a blocking :meth:`pop_wait`). ``registry`` as
        :meth:`pop_read_batch`'s."""
        if limit <= 0:
            return []
        moved, version = await queues.pop_batch(
            self, db, source, inflight, limit, read=False, registry=registry
        )
        return await self._texts(db, source, inflight, moved, version)

    async def pop_wait(
        self,
        db: int,
        source: str,
        inflight: str,
        limit: int,
        timeout_s: float,
        *,
        registry: bool = False,
    ) -> list[str]:
        """A blocking pop of up to ``timeout_s`` on ``source`` (moving the entry to
        ``inflight``) that takes, in the same round trip, up to ``limit`` - 1 entries queued
        after it (a script pipelined behind it: :meth:`_block_then`); [] after the timeout.
        An entry that is not UTF-8 is dead-lettered (no key of this bus is such).

        The entries stay in ``inflight`` until :meth:`ack` removes them, so a crash between
        pop and ack leaves them recoverable by :meth:`recover`. ``registry`` as
        :meth:`pop_read_batch`'s."""
        first, rest, version = await self._block_then(
            db, source, inflight, timeout_s, limit - 1, read=False, registry=registry
        )
        moved = ([] if first is None else [first]) + rest
        return await self._texts(db, source, inflight, moved, version)

    def _saw_registry(self, popped: list[Any], version: str | None) -> None:
        """Keep the registry's version a pop's script read after popping entries that will be
        admitted (:attr:`registry_seen`); a pop that took nothing leaves the last one."""
        if popped and version is not None:
            self.registry_seen = version

    async def read_popped(
        self, db: int, source: str, inflight: str, popped: list[str], have: Mapping[str, Hash]
    ) -> list[tuple[str, Hash]]:
        """Popped entries with the hash each names: from ``have`` when the caller holds it
        (written by its own process with the entry's push, unchanged since), the others read
        in one round trip; one whose key holds no hash refused (:meth:`_read_entries`)."""
        missing = [v for v in popped if v not in have]
        read: dict[str, Any] = {}
        if missing:
            read = dict(zip(missing, await queues.read_hashes(self, db, missing), strict=True))
        raw: list[Any] = []
        for v in popped:
            raw += [v, have[v] if v in have else read[v]]
        return await self._read_entries(db, source, inflight, raw, None)

    async def _texts(
        self, db: int, source: str, inflight: str, moved: list[Any], version: str | None
    ) -> list[str]:
        """The popped entries as text, those that are not UTF-8 refused (:meth:`utf8_entry`);
        ``version`` as :meth:`_read_entries`'."""
        self._saw_registry(moved, version)
        texts = [await self.utf8_entry(db, inflight, v, source) for v in moved]
        return [t for t in texts if t is not None]

    async def pop_read_batch(
        self, db: int, source: str, inflight: str, limit: int, *, registry: bool = False
    ) -> list[tuple[str, Hash]]:
        """Move up to ``limit`` entries already queued on ``source`` to ``inflight`` and read
        the hash each one names, in one round trip (entries and hashes in one Lua call): the
        batching partner of a blocking :meth:`pop_read_wait`. ``registry``: the entries will
        be admitted (node/intake/admission.py): the same script reads the registry's version
        after its pops (:attr:`registry_seen`)."""
        raw, version = await queues.pop_batch(
            self, db, source, inflight, limit, read=True, registry=registry
        )
        return await self._read_entries(db, source, inflight, raw, version)

    async def pop_read_wait(
        self,
        db: int,
        source: str,
        inflight: str,
        limit: int,
        timeout_s: float,
        *,
        registry: bool = False,
    ) -> list[tuple[str, Hash]]:
        """A blocking pop of up to ``timeout_s`` on ``source`` (moving the entry to
        ``inflight``), whose entry is read with up to ``limit`` - 1 entries queued after it
        by a script pipelined behind it (:meth:`_block_then`): one round trip. [] after the
        timeout. ``registry`` as :meth:`pop_read_batch`'s."""
        first, raw, version = await self._block_then(
            db, source, inflight, timeout_s, limit - 1, read=True, registry=registry
        )
        if first is None:  # timed out: the head read is not this pop's entry
            raw = raw[2:]
        elif raw[0] != first:  # another writer of ``inflight`` came between (none should)
            raw[:2] = [first, await queues.read_hash(self, db, str(first))]
        return await self._read_entries(db, source, inflight, raw, version)

    async def _read_entries(
        self, db: int, source: str, inflight: str, raw: list[Any], version: str | None
    ) -> list[tuple[str, Hash]]:
        """Popped entries and their hashes (flat: entry, hash, ...) as pairs; an entry that is
        not UTF-8, or whose key holds no hash, refused (:meth:`refuse_entry`)."""
        self._saw_registry(raw, version)
        out: list[tuple[str, Hash]] = []
        for value, read in zip(raw[::2], raw[1::2], strict=True):
            # utf8_entry's verdict, awaited only for bytes (the one case it refuses: no
            # coroutine per entry that is text)
            if type(value) is not str:
                if await self.utf8_entry(db, inflight, value, source) is None:
                    continue
            if isinstance(read, str | bytes):
                detail = f"{printable(value)} holds a {printable(read)}, not a hash"
                await self.refuse_entry(
                    db, inflight, value, Reason.WRONG_TYPE, detail, queue=source
                )
            else:
                out.append((str(value), _flat_hash(read)))
        return out

    async def _block_then(
        self,
        db: int,
        source: str,
        inflight: str,
        timeout_s: float,
        more: int,
        *,
        read: bool,
        registry: bool,
    ) -> tuple[Any, list[Any], str | None]:
        """BLMOVE the oldest entry of ``source`` onto ``inflight`` (up to ``timeout_s``), with
        the pop of up to ``more`` entries queued after it pipelined behind it on the same
        connection (:func:`~bus.store.atomic.queues.pop_call`; ``read``: with their hashes,
        the in-flight list's head and its hash first): Valkey runs a blocked client's next
        command as soon as its pop returns, so the script needs no round trip of its own.
        (The entry moved or None, what the script popped, the registry's version or None:
        :func:`~bus.store.atomic.queues.popped_and_version`.) Cancelled while blocked, the
        connection is dropped: what the pop moved stays in flight, requeued at the next
        start."""
        call = queues.pop_call(source, inflight, more, read=read, head=read, registry=registry)

        async def once(connection: Any) -> tuple[Any, Any]:  # noqa: ANN401 - lane's or coredis'
            moved = connection.create_request(
                b"BLMOVE",
                source,
                inflight,
                b"RIGHT",
                b"LEFT",
                timeout_s,
                disconnect_on_cancellation=True,
            )
            sent = send_evalshas(connection, [call])
            first = await moved
            try:
                [reply] = await evalsha_on(connection, [call], self.url, sent)
            except (coredis.exceptions.RedisError, OSError) as exc:
                # the pop ran: never sent again (what it moved is requeued at the restart)
                raise StoreError(f"redis {self.url}: {exc}") from exc
            return first, reply

        if self.lane is not None:
            first, reply = await self._on_lane(db, once)
        else:
            client = await self.db(db)
            with _translated(self.url):
                async with client.connection_pool.acquire() as connection:
                    first, reply = await once(connection)
        return first, *queues.popped_and_version(reply, registry=registry)

    async def refuse_entry(
        self, db: int, inflight: str, value: str | bytes, reason: str, detail: str, *, queue: str
    ) -> None:
        """Dead-letter one popped entry that cannot be used (its key holds no hash, it is not
        UTF-8, ...) and take it off ``inflight`` (by its exact bytes), in one transaction;
        logged. A retry (``dlq retry``) sends it back to ``queue``."""
        key = printable(value, 1000)
        log.warning(
            "refused entry %s of %s (db %d): %s: %s",
            printable(key),
            queue,
            db,
            reason,
            detail,
            extra={"entry": printable(key), "queue": queue, "ctx": db, "reason": reason},
        )
        entry = dlq_entry(key, reason, detail, queue)
        async with self.transaction(db) as tx:
            tx.lpush(keys.DLQ, [entry])
            tx.lpush(keys.DLQ_EVENTS, [entry])
            tx.lrem(inflight, 1, value)

    async def read_hashes(self, db: int, hash_keys: list[str]) -> list[Hash | str]:
        """Each hash of ``hash_keys`` ({} if absent), or in its place the name of the type
        its key holds instead (queues_hash_reader.lua), in one round trip: one key of the wrong type
        costs the others nothing."""
        raw = await queues.read_hashes(self, db, hash_keys)
        return [
            r.decode() if isinstance(r, bytes) else r if isinstance(r, str) else _flat_hash(r)
            for r in raw
        ]

    async def hgetall_many(self, db: int, hash_keys: list[str]) -> list[Hash]:
        """HGETALL of several hashes in one pipelined round trip."""
        client = await self.db(db)
        with _translated(self.url):
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.hgetall(k) for k in hash_keys]
            return [decode_hash(await p) for p in pending]

    async def exists_many(self, db: int, names: list[str]) -> list[bool]:
        """EXISTS of each key, in one pipelined round trip."""
        client = await self.db(db)
        with _translated(self.url):
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.exists([k]) for k in names]
            return [bool(await p) for p in pending]

    async def ack(self, db: int, inflight: str, value: str) -> None:
        await self.call(db, lambda r: r.lrem(inflight, 1, value))

    async def recover(
        self, db: int, inflight: str, source: str, *, max_redeliveries: int = MAX_REDELIVERIES
    ) -> int:
        """Move what a previous run left in ``inflight`` back to the consuming end of ``source``.

        Every such entry was delivered and never finished: a message that keeps killing its
        consumer would loop forever, so past ``max_redeliveries`` it goes to ``dlq`` instead
        (reason ``too_many_deliveries``). Returns how many entries were requeued.
        """
        moved = await queues.recover(
            self, db, inflight, source, max_deliveries=max_redeliveries, now=now()
        )
        if moved:
            log.info("recovered %d in-flight entries of %s (db %d)", moved, source, db)
        return int(moved)

    async def dead_letter(
        self, db: int, key: str, reason: str, detail: str = "", *, queue: str = ""
    ) -> None:
        """Record why ``key`` was refused; ``queue`` is where a retry would send it back."""
        entry = dlq_entry(key, reason, detail, queue)
        async with self.transaction(db) as tx:
            tx.lpush(keys.DLQ, [entry])
            tx.lpush(keys.DLQ_EVENTS, [entry])

    async def dead_letters(self, db: int) -> list[dict[str, Any]]:
        """The dead letters of DB ``db``, newest first."""
        return [json.loads(e) for e in await self.lrange(db, keys.DLQ)]

    async def retry_dead_letter(self, db: int, key: str) -> int:
        """Re-drive ``key``: its dead letters leave the dlq and it is queued again where it
        was refused. Returns how many entries were re-driven (0: none, or not re-drivable)."""
        return await queues.retry_dead(self, db, key)

    async def purge_dead_letters(self, db: int, key: str | None = None) -> int:
        """Delete the dead letters of ``key`` (all of them if None); how many went."""
        if key is None:
            count = await self.llen(db, keys.DLQ)
            await self.call(db, lambda r: r.delete([keys.DLQ]))
            return count
        return await queues.purge_dead(self, db, key)

    # -- registry objects ------------------------------------------------------------------------

    async def get_actor(self, actor_id: int) -> Actor | None:
        h = await self.hgetall(keys.ACTORS_DB, keys.actor(actor_id))
        return Actor.from_hash(h) if h else None

    async def put_actor(self, actor: Actor) -> None:
        async with self.transaction(keys.ACTORS_DB) as pipe:
            pipe.hset(keys.actor(actor.id), actor.to_hash())
            pipe.incr(keys.REGISTRY_VERSION)  # caches of actors reload (node/state.py)

    async def remove_actor(self, actor_id: int) -> bool:
        """Delete ``actor:<id>``; False if there was none."""
        async with self.transaction(keys.ACTORS_DB) as pipe:
            gone = pipe.delete([keys.actor(actor_id)])
            pipe.incr(keys.REGISTRY_VERSION)
        return bool(await gone)

    async def get_context(self, context_id: int) -> Context | None:
        h = await self.hgetall(context_id, keys.context(context_id))
        return Context.from_hash(h) if h else None

    async def put_context(self, context: Context) -> None:
        """Save a context in its own DB and announce it so a running node starts serving it."""
        if context.id < 1:
            raise StoreError("context ids start at 1 (DB 0 holds actors and peers)")
        await self.hset(context.id, keys.context(context.id), context.to_hash())
        async with self.transaction(keys.ACTORS_DB) as pipe:
            pipe.sadd(keys.CONTEXTS, [str(context.id)])
            pipe.lpush(keys.NODE_EVENTS, [keys.context(context.id)])
            pipe.incr(keys.REGISTRY_VERSION)  # after the write above: caches reload

    async def context_ids(self) -> list[int]:
        return sorted(int(m) for m in await self.smembers(keys.ACTORS_DB, keys.CONTEXTS))

    # -- plain reads and writes of presence and job logs ------------------------------------------

    async def delete(self, db: int, names: list[str]) -> None:
        if names:
            await self.call(db, lambda r: r.delete(names))

    async def expire(self, db: int, key: str, ttl_s: int) -> None:
        await self.call(db, lambda r: r.expire(key, ttl_s))

    async def scan_keys(self, db: int, pattern: str) -> list[str]:
        """Every key of DB ``db`` matching ``pattern`` (SCAN: no long block of the server)."""
        found: list[str] = []
        cursor = 0
        while True:
            cursor, batch = await self.read(
                db,
                lambda r: r.scan(cursor, match=pattern, count=500),  # noqa: B023 (awaited at once)
            )
            found.extend(str(k) for k in batch)
            if not cursor:
                return found

    async def xadd_capped(
        self, db: int, stream: str, fields: Mapping[str, str], max_entries: int
    ) -> None:
        """Append ``fields`` to ``stream``, trimmed to about ``max_entries`` entries."""
        await self.call(
            db,
            lambda r: r.xadd(
                stream,
                dict(fields),
                trim_strategy=PureToken.MAXLEN,
                threshold=max_entries,
                trim_operator=PureToken.APPROXIMATELY,
            ),
        )

    # -- bounded reads for the web console (node/web/feed.py) ------------------------------------

    async def scan_page(
        self, db: int, pattern: str, cursor: int, count: int
    ) -> tuple[int, list[str]]:
        """One SCAN step: the next cursor (0: the scan is complete) and the keys it found."""
        nxt, batch = await self.read(db, lambda r: r.scan(cursor, match=pattern, count=count))
        return int(nxt), [str(k) for k in batch]

    async def hmget_many(
        self, db: int, hash_keys: list[str], names: list[str]
    ) -> list[dict[str, str]]:
        """The fields ``names`` of each hash (absent ones left out), in one pipelined round
        trip."""
        client = await self.db(db)
        with _translated(self.url):
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.hmget(k, names) for k in hash_keys]
            rows = [await p for p in pending]
        return [
            {n: str(v) for n, v in zip(names, row, strict=True) if v is not None} for row in rows
        ]

    async def llen_many(self, db: int, names: list[str]) -> list[int]:
        """LLEN of each list, in one pipelined round trip."""
        client = await self.db(db)
        with _translated(self.url):
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.llen(k) for k in names]
            return [int(await p) for p in pending]

    async def lrange_head(self, db: int, key: str, count: int) -> list[str]:
        """The first ``count`` entries of list ``key`` (the newest of an LPUSHed list)."""
        return [str(v) for v in await self.read(db, lambda r: r.lrange(key, 0, count - 1))]


@asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Store]:
    """A connected store; raises StoreError if the server does not answer."""
    async with trio.open_nursery() as nursery:
        store = Store(url, nursery)
        try:
            await store.ping()
            yield store
        finally:
            store._close()
