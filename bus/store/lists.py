"""Named reads of the bus's lists (queues, dlq, outboxes, in-flight lists, client inboxes)
and their plain writes (a client's reply list, an outbox's acknowledged entries): the door
node/, bus/wire and the client take to them, instead of generic verbs."""

from __future__ import annotations

from collections.abc import Sequence

from bus.core import keys
from bus.store.atomic import queues
from bus.store.connection import Store


async def depth(store: Store, db: int, name: str) -> int:
    """How many entries list ``name`` holds."""
    return await store.llen(db, name)


async def depths(store: Store, db: int, names: list[str]) -> list[int]:
    """How many entries each list holds, in one round trip."""
    return await store.llen_many(db, names)


async def held_depth(store: Store, ctx: int) -> int:
    """How many job messages context ``ctx`` holds until they are acknowledged again
    (``msg_held``, a sorted set: node/intake/held.py)."""
    return int(await store.read(ctx, lambda r: r.zcard(keys.MSG_HELD)))


async def is_held(store: Store, ctx: int, peer: str, message_key: str) -> bool:
    """Whether context ``ctx`` holds ``message_key`` until it is acknowledged again to
    ``peer`` (``msg_held``: node/intake/held.py)."""
    member = keys.held_member(peer, message_key)
    return await store.read(ctx, lambda r: r.zscore(keys.MSG_HELD, member)) is not None


async def queue_depths(store: Store, ctx: int, script_types: set[str]) -> list[int]:
    """The depth of each type's queue in context ``ctx``."""
    return [await store.llen(ctx, keys.queue(t)) for t in script_types]


async def queue_names(store: Store, ctx: int) -> list[str]:
    """Every ``queue:*`` list of context ``ctx`` (targeted queues included)."""
    return await store.scan_keys(ctx, "queue:*")


async def outbox_depths(store: Store, peer_id: str) -> tuple[int, int]:
    """``(waiting, in flight)`` of the durable outbox to ``peer_id``."""
    waiting = await store.llen(keys.ACTORS_DB, keys.outbox(peer_id))
    return waiting, await store.llen(keys.ACTORS_DB, keys.outbox_inflight(peer_id))


async def remove_outbox_inflight(store: Store, peer_id: str, entries: Sequence[str]) -> int:
    """Drop acknowledged entries from ``peer_id``'s in-flight list (one round trip); how many
    were there."""
    if not entries:
        return 0
    inflight = keys.outbox_inflight(peer_id)
    return await queues.ack_many(store, keys.ACTORS_DB, inflight, list(entries))


async def head(store: Store, db: int, name: str, count: int) -> list[str]:
    """The first ``count`` entries of list ``name`` (what a view shows)."""
    return await store.lrange_head(db, name, count)


async def entries(store: Store, db: int, name: str) -> list[str]:
    """Every entry of list ``name`` (an in-flight list: short by construction)."""
    return await store.lrange(db, name)


async def dlq_beyond(store: Store, db: int, limit: int) -> list[str]:
    """The dead letters past the first ``limit`` (the oldest), oldest first; [] within it."""
    if limit <= 0 or await store.llen(db, keys.DLQ) <= limit:
        return []
    overflow = await store.call(db, lambda r: r.lrange(keys.DLQ, limit, -1))
    return [str(e) for e in reversed(overflow)]


async def pop_inbox(store: Store, ctx: int, inbox: str, wait_s: float, most: int) -> list[str]:
    """Up to ``most`` answers off a client's inbox, oldest first, blocking up to ``wait_s`` for
    the first ([] if none came)."""
    return await store.blmpop(ctx, inbox, wait_s, most)


async def pop_reply(store: Store, ctx: int, reply: str, timeout_s: float) -> str | None:
    """The oldest answer on a reply list, waiting up to ``timeout_s``; None after that."""
    return await store.blpop(ctx, reply, timeout_s)


async def holds(store: Store, db: int, name: str, value: str) -> bool:
    """Whether list ``name`` holds ``value`` (LPOS: where a message waits, for a status)."""
    return await store.call(db, lambda r: r.lpos(name, value)) is not None


async def push_replies(store: Store, ctx: int, reply: str, replies: list[str], ttl_s: int) -> None:
    """Answer a waiting client on its reply list, which expires after ``ttl_s``."""
    await store.lpush(ctx, reply, *replies)
    await store.expire(ctx, reply, ttl_s)


async def quota_depths(store: Store, ctx: int) -> dict[str, int]:
    """Jobs queued and not started yet in context ``ctx``, by actor id, and under
    ``keys.QUOTA_ALL`` in all: what the queue bounds count (bus/store/atomic/lua/quota_depth.lua).
    A field that holds no number (written by hand) reads as 0. The whole is the sum of the
    actors' counts, as admission checks the context's bound (data model v3: no field of its own)."""
    found = await store.hgetall(ctx, keys.QUOTA_DEPTH)
    depths = {name: int(v) if v.lstrip("-").isdigit() else 0 for name, v in found.items()}
    depths.pop(keys.QUOTA_ALL, None)  # a v2 store's, not migrated yet
    return depths | {keys.QUOTA_ALL: sum(depths.values())}
