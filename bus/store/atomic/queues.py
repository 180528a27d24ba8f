"""The intake queues' atomic steps (``queues_*.lua``): pop a batch, ack it, materialise its
job messages' jobs on the run queues; and the recovery of what a crash left in flight, and the
dead-letter list.

Each function runs one script on DB ``db`` (``ctx``: a context's) of a
:class:`~bus.store.connection.Store`; the pops return their reply as the script gives it
(entries may still be bytes that are not UTF-8: the Store refuses those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from bus.core import keys
from bus.core.models import Message, flat_fields, json_arg
from bus.store.atomic import ScriptCall, script

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = [
    "JobWrite",
    "ack_many",
    "materialise_batch",
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


def _here(message: Message) -> bool:
    """Whether ``message`` names one node as its origin and destination (submitted there)."""
    return bool(message.origin) and message.origin == message.destination


class JobWrite(msgspec.Struct, frozen=True):
    """One job hash to write, and the queue to put its key on ("" for none)."""

    key: str
    queue: str
    fields: dict[str, str]


async def materialise_batch(
    store: Store,
    ctx: int,
    inflight: str,
    batch: list[tuple[Message, list[JobWrite]]],
    *,
    now: int,
    window_s: int,
    depth_of: list[str],
    bounds: tuple[int, int] = (0, 0),
    fair_share_jobs: int = 0,
    counted: list[str] | None = None,
) -> tuple[list[int], int, list[str]]:
    """Write each message's jobs unless the message (key or nonce) was accepted before or one
    of its job keys is another message's, in one atomic script. Returns one code per message
    (0 written; 1 replay of its key, 2 of its nonce, 3 a job key held by another message:
    nothing written for it; 4 its queued jobs would take its actor past ``bounds[0]`` queued
    jobs, 5 the context past ``bounds[1]``, 0: no bound), the depth of the deepest queue of
    ``depth_of`` afterwards, and per message the job key refused and its holder, or for 4 and
    5 "<depth> <bound>" ("" if none). ``fair_share_jobs``: the most jobs of one actor in the
    context's queues, the rest wait in its list (0: none; node/intake/fair_share.py).
    ``counted``: the job statistics are not written but added to this list (``[field,
    increment, ...]``), for the caller to count."""
    payload = [
        {
            "key": message.key,
            "seen": keys.seen(message.key),
            "nonce": keys.nonce(message.caller_id, message.nonce) if message.nonce else "",
            "event": "submitted" if _here(message) else "received",
            "jobs": [
                {"key": j.key, "queue": j.queue, "fields": flat_fields(j.fields)} for j in jobs
            ],
        }
        for message, jobs in batch
    ]
    args = [json_arg(payload), str(now), str(window_s), "1" if counted is not None else ""]
    args += [str(bounds[0]), str(bounds[1]), str(fair_share_jobs)]
    materialise = script("queues_materialise")
    codes, depth, owners, figures = await store.script(
        ctx, materialise, [inflight, *depth_of], args
    )
    if counted is not None:
        counted += [str(f) for f in figures]
    return [int(c) for c in codes], int(depth), [str(o) for o in owners]


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
