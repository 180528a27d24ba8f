"""Atomic steps of the reliable queues and the dead-letter list (``queues_*.lua``).

Each function runs one script on DB ``db`` of a :class:`~bus.store.connection.Store` and returns
its reply
as the script gives it (entries may still be bytes that are not UTF-8: the Store refuses those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bus.core import keys
from bus.store.atomic import ScriptCall, script

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = [
    "ack_many",
    "pop_batch",
    "pop_call",
    "popped_and_version",
    "purge_dead",
    "read_hash",
    "read_hashes",
    "recover",
    "retry_dead",
]


async def ack_many(store: Store, db: int, inflight: str, entries: list[str]) -> int:
    """Remove each of ``entries`` once from ``inflight`` (atomic, one command); how many were
    there."""
    return int(await store.script(db, script("queues_ack_many"), [inflight], entries))


async def pop_batch(
    store: Store,
    db: int,
    source: str,
    inflight: str,
    limit: int,
    *,
    read: bool,
    registry: bool = False,
) -> tuple[list[Any], str | None]:
    """Move up to ``limit`` entries of ``source`` to ``inflight``: (the entries, each followed
    (``read``) by the hash it names or the name of the type its key holds instead; with
    ``registry``, the registry's version read after the pops, else None)."""
    call = pop_call(source, inflight, limit, read=read, registry=registry)
    return popped_and_version(await store.script(db, *call), registry=registry)


def pop_call(
    source: str,
    inflight: str,
    limit: int,
    *,
    read: bool,
    head: bool = False,
    registry: bool = False,
) -> ScriptCall:
    """The ``queues_pop_batch`` call of :func:`pop_batch`; ``head`` (with ``read``): the
    in-flight list's head and its hash come first (the entry a blocking pop pipelined just
    before moved: :meth:`Store.pop_read_wait`); ``registry``: the reply is ``[version, that
    reply]``, the registry's version read after the pops (:func:`popped_and_version`)."""
    args = [str(limit), "1" if read else "0", "1" if head else ""]
    if registry:
        args += [str(keys.ACTORS_DB), keys.REGISTRY_VERSION]
    return script("queues_pop_batch"), [source, inflight], args


def popped_and_version(reply: Any, *, registry: bool) -> tuple[list[Any], str | None]:  # noqa: ANN401
    """A :func:`pop_call` reply as (what it popped, the registry's version or None)."""
    if not registry:
        return list(reply), None
    version, popped = reply
    return list(popped), (version.decode() if isinstance(version, bytes) else str(version))


async def read_hash(store: Store, db: int, key: str) -> Any:
    """The hash ``key`` names as a flat list ([] if absent), or the type it holds instead."""
    return await store.script(db, script("queues_read_hash"), [key], [])


async def read_hashes(store: Store, db: int, hash_keys: list[str]) -> list[Any]:
    """:func:`read_hash` of each key, in one round trip."""
    return list(await store.script(db, script("queues_read_hashes"), hash_keys, []))


async def recover(
    store: Store, db: int, inflight: str, source: str, *, max_deliveries: int, now: int
) -> int:
    """Requeue what ``inflight`` holds on ``source``; an entry delivered more than
    ``max_deliveries`` times is dead-lettered instead. How many were requeued."""
    names = [inflight, source, keys.REDELIVERIES, keys.DLQ, keys.DLQ_EVENTS]
    args = [str(max_deliveries), str(now), source]
    return int(await store.script(db, script("queues_recover"), names, args))


async def retry_dead(store: Store, db: int, key: str) -> int:
    """Re-drive the dead letters of ``key`` onto the queue they name; how many there were."""
    names = [keys.DLQ, keys.REDELIVERIES]
    return int(await store.script(db, script("queues_retry_dead"), names, [key]))


async def trim_dead(store: Store, db: int, oldest: list[str]) -> int:
    """Drop ``oldest`` (oldest first) from the old end of the dlq, as long as they are still
    there in that order; how many went."""
    return int(await store.script(db, script("queues_trim_dead"), [keys.DLQ], oldest))


async def purge_dead(store: Store, db: int, key: str) -> int:
    """Delete the dead letters of ``key``; how many there were."""
    return int(await store.script(db, script("queues_purge_dead"), [keys.DLQ], [key]))
