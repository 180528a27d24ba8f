"""serve_queue: the one loop of every reliable-queue service (recover → pop → handle → ack).

The supervisor, the consumer, the flow engine, the dlq watcher, external results and the outbox
differ only in what they do with an entry; the popping, the acknowledging and what happens when
an entry cannot be handled are here, once (the shape of trio's ``serve_listeners``: a private
loop, a public wrapper that reports ``started`` when the service is really ready).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, NoReturn, TypeVar

import msgspec
import trio

from bus.core.models import Hash
from bus.core.reasons import Reason
from bus.errors import ContentError, Refused, StoreError
from bus.store.connection import MAX_REDELIVERIES, Store

log = logging.getLogger(__name__)

BATCH = 64  # entries taken (and their hashes read) per round trip
POP_TIMEOUT_S = 5.0  # the blocking pop's bound: an idle queue costs one command per bound
# hashes a queue's writers in this process hand its pop (Known), kept at most this many: more
# (a consumer far behind) are read back as any other entry's
MAX_KNOWN = 1024

T = TypeVar("T")


class Done(Enum):
    """What a handler did with an entry it does not hand on to its batch step."""

    ACK = "ack"  # handled: serve_queue acknowledges it
    ACKED = "acked"  # handled and acknowledged by the handler's own (atomic) write


class Known:
    """The hashes this process wrote itself for entries it pushed on a queue, by entry: the pop
    that moves one takes its fields from here, not from Valkey (an ``HGETALL`` less per entry:
    a message's read-back). A writer remembers a hash only if its push and that hash's write
    are one atomic step and nothing writes the hash before the entry is popped; a restart
    forgets them all, and the entries are read back.

    A writer that cannot tell before its write whether it will store the hash (a delivery
    finds the key there already) announces the entries (:meth:`storing`) and then settles them
    (:meth:`stored`): a pop that moved an announced entry waits for that (its reply may come
    first), so what it takes is what was stored, never a guess."""

    def __init__(self, most: int = MAX_KNOWN) -> None:
        self.most = most
        self._fields: OrderedDict[str, Hash | None] = OrderedDict()  # None: being stored
        self._settled = trio.Event()

    def remember(self, entry: str, fields: Hash) -> None:
        """``entry``'s hash is ``fields`` (stored and pushed, or about to be, in one step)."""
        self._fields[entry] = fields
        self._fields.move_to_end(entry)
        while len(self._fields) > self.most:
            self._fields.popitem(last=False)

    def storing(self, entries: Iterable[str]) -> list[str]:
        """Announce entries whose hashes are about to be stored; those not known already are
        returned, for :meth:`stored` (a known one keeps its hash: the first store stands)."""
        new = [entry for entry in entries if entry not in self._fields]
        for entry in new:
            self._fields[entry] = None
        return new

    def stored(self, announced: list[str], fields: dict[str, Hash]) -> None:
        """Settle ``announced`` (:meth:`storing`): each stored with the hash ``fields`` gives,
        the others (found there already, or the write failed) forgotten."""
        for entry in announced:
            hashed = fields.get(entry)
            if hashed is None:
                self._fields.pop(entry, None)
            elif entry in self._fields:
                self.remember(entry, hashed)
        self._settled.set()
        self._settled = trio.Event()

    async def take(self, entries: list[str]) -> dict[str, Hash]:
        """The hashes known of ``entries`` (just popped), forgotten here; waits while one is
        being stored."""
        while any(e in self._fields and self._fields[e] is None for e in entries):
            await self._settled.wait()
        out: dict[str, Hash] = {}
        for entry in entries:
            hashed = self._fields.pop(entry, None)
            if hashed is not None:
                out[entry] = hashed
        return out


@dataclass(frozen=True)
class Queue:
    """A reliable queue: entries move from ``source`` to ``inflight`` when popped and leave
    ``inflight`` when acknowledged; what a crash leaves there is requeued at start."""

    db: int
    source: str
    inflight: str
    read: bool = True  # each entry names a hash, read with the pop (one round trip)
    # its entries are admitted (node/intake/admission.py): the pop reads the registry's version
    # too (Store.pop_read_batch, pop_read_wait), which the admission's cache then needs no
    # round trip for
    registry: bool = False
    timeout_s: float = POP_TIMEOUT_S
    max_redeliveries: int = MAX_REDELIVERIES
    # between two pops nothing of this queue is in flight, unless a failover lost its acks
    # (an old primary that woke took them, then was demoted): recovered then, as at start.
    # False for a queue whose entries stay in flight past their pop (acknowledged later).
    recover_after_failover: bool = True
    # (with ``read``) the hashes this process's writers pushed entries with: the pop reads
    # only the others (Known)
    known: Known | None = field(default=None, compare=False)
    # told of each pop's entries (with their hashes when it reads them) as soon as they are off
    # ``source``: what this process's writers count as waiting there (node.state.Inbound)
    # drops where it stops waiting, whatever the handler then does with them
    taken: Callable[[list[Popped]], None] | None = field(default=None, compare=False)


class Popped(msgspec.Struct, frozen=True):
    value: str  # the entry as text
    fields: Hash  # the hash it names when the queue reads them, else {}


class Handler(Generic[T]):
    """What a queue service does with its entries; serve_queue does the rest.

    ``each`` handles one entry: it returns a :class:`Done`, or a value that goes, with the
    others of its batch, to ``batch``, which then owns their acknowledgement (one atomic step
    for the whole batch). ``each`` raises :class:`Refused` for an entry it will not handle.
    """

    name = "queue"  # for log lines
    flaw = Reason.INTERNAL_ERROR  # the reason an unexpected exception gives the entry

    async def recovered(self) -> None:
        """Runs once after recovery, before ``started`` is reported."""

    async def before_pop(self) -> None:
        """Runs before every pop; raise to stop serving (e.g. a link that closed)."""

    async def each(self, popped: Popped) -> T | Done:
        raise NotImplementedError

    async def batch(self, items: list[T]) -> None:
        """The values ``each`` returned for one pop, handled together."""

    async def refuse(
        self, store: Store, queue: Queue, popped: Popped, refused: Refused, exc: Exception
    ) -> None:
        """Dead-letter an entry and acknowledge it (by default one transaction; ``exc`` is what
        was raised, ``refused`` the reason and detail the entry is refused with)."""
        await store.refuse_entry(
            queue.db,
            queue.inflight,
            popped.value,
            refused.reason,
            refused.detail,
            queue=queue.source,
        )


async def serve_queue(
    store: Store,
    queue: Queue,
    handler: Handler[T],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``queue`` with ``handler`` until cancelled: requeue what a previous run left in
    flight, run ``handler.recovered``, report started, then pop batches (what is queued
    already in one round trip; on an empty queue one blocking pop, whose entry is handled at
    once) and hand each entry to ``handler.each``, the batch's values to ``handler.batch``.

    *Error handling*: an entry is never allowed to stop the queue. :class:`Refused` (the
    handler's verdict) and :class:`ContentError` (a key the entry names holds something
    unusable) dead-letter that entry with its reason (``handler.refuse``), and serving goes on;
    any other exception is logged with its traceback and the entry dead-lettered with
    ``handler.flaw``. :class:`StoreError` (Valkey failed) and ``trio.Cancelled`` propagate: the
    service's supervisor (``resilient``) restarts it, and the entries in flight are recovered.
    They are recovered too, between two pops, when the store saw a failover (its epoch grew):
    an old primary that woke inside the failover may have taken an entry's acknowledgement and
    lost it, with no error here. What ``recovered``, ``before_pop`` and ``batch`` raise
    propagates unchanged.
    """
    await store.recover(
        queue.db, queue.inflight, queue.source, max_redeliveries=queue.max_redeliveries
    )
    await handler.recovered()
    task_status.started()
    await _serve(store, queue, handler)


async def _serve(store: Store, queue: Queue, handler: Handler[T]) -> NoReturn:
    drained = False  # the last pop left the queue empty
    epoch = store.epoch
    while True:
        if queue.recover_after_failover and store.epoch != epoch:
            epoch = store.epoch  # read first: a failover during the recovery is seen next time
            await store.recover(
                queue.db, queue.inflight, queue.source, max_redeliveries=queue.max_redeliveries
            )
        await handler.before_pop()
        items: list[T] = []
        entries, drained = await pop_entries(store, queue, block_first=drained)
        for popped in entries:
            done = await guarded(store, queue, handler, popped)
            if done is Done.ACK:
                await store.ack(queue.db, queue.inflight, popped.value)
            elif not isinstance(done, Done):
                items.append(done)
        if items:
            await handler.batch(items)


async def guarded(store: Store, queue: Queue, handler: Handler[T], popped: Popped) -> T | Done:
    """``handler.each(popped)`` under the error ladder (see :func:`serve_queue`); a refused
    entry is dead-lettered and acknowledged (Done.ACKED)."""
    caught: Exception
    try:
        return await handler.each(popped)
    except StoreError:
        raise
    except Refused as exc:
        refused, caught = exc, exc
    except ContentError as exc:  # a key the entry names holds something unusable
        refused, caught = Refused(exc.reason, str(exc)), exc
    except Exception as exc:  # a flaw must not stop the queue: record it and go on
        log.exception("%s failed on %r (db %d)", handler.name, popped.value[:200], queue.db)
        refused, caught = Refused(handler.flaw, repr(exc)), exc
    await handler.refuse(store, queue, popped, refused, caught)
    return Done.ACKED


async def pop_entries(
    store: Store, queue: Queue, *, block_first: bool = False
) -> tuple[list[Popped], bool]:
    """What ``queue`` holds already (up to BATCH, with the hashes when it reads them), in one
    round trip; only when it is empty a blocking pop of up to ``queue.timeout_s``; and whether
    the queue was left empty (fewer than BATCH came). ``block_first``: start with the blocking
    pop, which takes what came after its entry in the same round trip (the last pop left the
    queue empty: a pop that does not block would most likely find nothing)."""
    popped: list[Popped] = [] if block_first else await _queued(store, queue)
    if not popped:
        popped = await _waited(store, queue)
    if popped and queue.taken is not None:
        queue.taken(popped)
    return popped, len(popped) < BATCH


async def _queued(store: Store, queue: Queue) -> list[Popped]:
    """Up to BATCH entries ``queue`` holds already (with their hashes if it reads them)."""
    db, source, inflight = queue.db, queue.source, queue.inflight
    if queue.read and queue.known is not None:
        values = await store.pop_batch(db, source, inflight, BATCH, registry=queue.registry)
        return await _with_hashes(store, queue, values)
    if queue.read:
        read = await store.pop_read_batch(db, source, inflight, BATCH, registry=queue.registry)
        return [Popped(value, fields) for value, fields in read]
    return [Popped(value, {}) for value in await store.pop_batch(db, source, inflight, BATCH)]


async def _waited(store: Store, queue: Queue) -> list[Popped]:
    """A blocking pop of up to ``queue.timeout_s`` and, in the same round trip, up to BATCH - 1
    entries queued after its entry (with their hashes if it reads them)."""
    db, source, inflight, timeout_s = queue.db, queue.source, queue.inflight, queue.timeout_s
    if queue.read and queue.known is not None:
        values = await store.pop_wait(
            db, source, inflight, BATCH, timeout_s, registry=queue.registry
        )
        return await _with_hashes(store, queue, values)
    if queue.read:
        read = await store.pop_read_wait(
            db, source, inflight, BATCH, timeout_s, registry=queue.registry
        )
        return [Popped(value, fields) for value, fields in read]
    return [Popped(v, {}) for v in await store.pop_wait(db, source, inflight, BATCH, timeout_s)]


async def _with_hashes(store: Store, queue: Queue, values: list[str]) -> list[Popped]:
    """Popped ``values`` with their hashes: those ``queue.known`` holds from it, the others
    read (one round trip, none when it holds them all)."""
    if not values:
        return []
    have = await queue.known.take(values) if queue.known is not None else {}
    read = await store.read_popped(queue.db, queue.source, queue.inflight, values, have)
    return [Popped(value, fields) for value, fields in read]
