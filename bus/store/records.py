"""Named reads and writes of the bus's records: its objects (jobs, messages, flows, runners,
job logs) by key, its lists (queues, dlq, outboxes, in-flight lists, reply lists and client
inboxes: depths, heads, pops of a client's answers) and DB 0's registry (node info, peers,
actors, contexts, registry events): the door node/, bus/wire and the client take to them,
instead of generic Redis verbs. Atomic changes are in atomic/."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bus.core import keys
from bus.core.models import Hash, Peer, decode_hash
from bus.core.stats import merged_fields
from bus.store.atomic import queues
from bus.store.connection import Store


async def read_job(store: Store, ctx: int, job_key: str) -> Hash:
    """The job hash under ``job_key`` ({} if there is none). ContentError for another type."""
    return await store.hgetall(ctx, job_key)


async def read_message(store: Store, ctx: int, message_key: str) -> Hash:
    """The message hash under ``message_key`` ({} if there is none)."""
    return await store.hgetall(ctx, message_key)


async def read_flow(store: Store, ctx: int, flow_id: int) -> Hash:
    """The hash of flow ``flow_id`` ({} if there is none)."""
    return await store.hgetall(ctx, keys.flow(flow_id))


async def read_runner(store: Store, ctx: int, runner_id: str) -> Hash:
    """The registered hash of runner ``runner_id`` ({} if there is none)."""
    return await store.hgetall(ctx, keys.runner(runner_id))


async def read_record(store: Store, db: int, key: str) -> Hash:
    """The hash stored under ``key``, whichever object of the bus it is (what a user named)."""
    return await store.hgetall(db, key)


async def read_many(store: Store, db: int, names: list[str]) -> list[Hash]:
    """Several hashes in one round trip ({} for each absent one)."""
    return await store.hgetall_many(db, names)


async def read_fields(
    store: Store, db: int, names: list[str], fields: list[str]
) -> list[dict[str, str]]:
    """Some fields of several hashes in one round trip (what a listing shows)."""
    return await store.hmget_many(db, names, fields)


async def write_messages(
    store: Store,
    ctx: int,
    hashes: Sequence[tuple[str, Mapping[str, str]]],
    pushed: list[str],
    *,
    durable_since: int | None = None,
    written: Callable[[], None] | None = None,
) -> None:
    """A client's submission: HSET each message hash, then LPUSH ``pushed`` on ``msg_out``,
    in one transaction (sent again if a failover refused it unrun: Store.transact); with
    ``durable_since``, returned once it and every write before it are durable (``written``
    called in between, once the write is answered)."""

    def fill(tx: Any) -> None:  # noqa: ANN401 - the client's transaction
        for verb, key, arg in message_writes(hashes, pushed):
            getattr(tx, verb)(key, arg)

    await store.transact(ctx, fill, durable_since=durable_since, written=written)


def message_writes(
    hashes: Sequence[tuple[str, Mapping[str, str]]], pushed: list[str]
) -> list[tuple[str, str, Any]]:
    """What a submission's transaction sends, as ``(verb, key, argument)``: what both the trio
    client (:func:`write_messages`) and the blocking one (bus/store/blocking.py) run."""
    writes: list[tuple[str, str, Any]] = [("hset", key, fields) for key, fields in hashes]
    writes.append(("lpush", keys.MSG_OUT, pushed))
    return writes


async def job_and_unrouted(
    store: Store, ctx: int, job_key: str, routing: str
) -> tuple[Hash, list[str], list[str]]:
    """In one snapshot: the job hash under ``job_key``, the message keys waiting on
    ``msg_out`` and those the supervisor is routing (its in-flight list ``routing``)."""
    async with store.transaction(ctx) as tx:
        found = tx.hgetall(job_key)
        queued = tx.lrange(keys.MSG_OUT, 0, -1)
        routed = tx.lrange(routing, 0, -1)
    return decode_hash(await found), [str(k) for k in await queued], [str(k) for k in await routed]


async def field_of_many(store: Store, ctx: int, hash_keys: list[str], name: str) -> list[object]:
    """Field ``name`` of each hash (None where it has none), in one round trip."""

    async def read(r: Any) -> list[object]:  # noqa: ANN401
        async with r.pipeline(transaction=False) as pipe:
            pending = [pipe.hget(k, name) for k in hash_keys]
        return [await p for p in pending]

    return await store.call(ctx, read)


async def log_entries(
    store: Store, ctx: int, job_key: str, after: str, *, block: bool
) -> list[tuple[str, dict[str, str]]]:
    """The entries of a job's log stream past ``after`` (an entry id), as ``(id, fields)``;
    with ``block``, waiting up to a second for the first."""
    stream = keys.logs(job_key)
    if block:
        found = await store.call(ctx, lambda r: r.xread({stream: after}, count=100, block=1000))
        entries = list((found or {}).get(stream, ()))
    else:
        entries = list(await store.call(ctx, lambda r: r.xrange(stream, f"({after}")))
    return [
        (str(e.identifier), {str(k): str(v) for k, v in e.field_values.items()}) for e in entries
    ]


async def read_attempts(store: Store, ctx: int, job_key: str) -> list[str]:
    """The attempt entries of a job (JSON texts, oldest first; [] for a job run once)."""
    return await store.lrange(ctx, keys.attempts(job_key))


async def mark_message(store: Store, ctx: int, message_key: str, fields: dict[str, str]) -> None:
    """Set a message's own fields (status, reason, updated_at); not signed, not atomic with
    anything else."""
    await store.hset(ctx, message_key, fields)


async def message_exists(store: Store, ctx: int, message_key: str) -> bool:
    return await store.exists(ctx, message_key)


async def find(store: Store, db: int, pattern: str) -> list[str]:
    """Every key of ``db`` matching ``pattern`` (SCAN, for listings and scrapes)."""
    return await store.scan_keys(db, pattern)


async def find_page(
    store: Store, db: int, pattern: str, cursor: int, count: int
) -> tuple[int, list[str]]:
    """One SCAN step: the next cursor (0: the walk is over) and the keys it found."""
    return await store.scan_page(db, pattern, cursor, count)


async def replay_markers(
    store: Store, ctx: int, message_key: str, nonce_key: str
) -> tuple[bool, bool]:
    """Whether ``message_key`` was accepted within the window, and whether ``nonce_key`` (a
    field of the replay hash, keys.nonce) was: one HMGET of the replay hash."""
    seen, nonce = await store.call(
        ctx, lambda r: r.hmget(keys.REPLAY, [keys.seen(message_key), nonce_key])
    )
    return seen is not None, seen is None and nonce is not None


async def stats_totals(store: Store, ctx: int, field: str) -> str | None:
    """One totals field of ``stats:jobs`` (a runner slot's or a node's, a JSON object:
    bus/core/stats.py), or None."""
    value = await store.call(ctx, lambda r: r.hget(keys.STATS_JOBS, field))
    return None if value is None else str(value)


async def set_stats_totals(store: Store, ctx: int, field: str, text: str) -> None:
    """Write one totals field of ``stats:jobs`` (see :func:`stats_totals`)."""
    await store.hset(ctx, keys.STATS_JOBS, {field: text})


async def job_stats(store: Store, ctx: int) -> Hash:
    """The job counters of context ``ctx``: ``stats:jobs`` with its runner slots' totals
    added (bus/core/stats.py: merged_fields)."""
    return merged_fields(await store.hgetall(ctx, keys.STATS_JOBS))


# -- flows ----------------------------------------------------------------------------------


async def put_flow(store: Store, ctx: int, flow_id: int, fields: Mapping[str, str]) -> None:
    """A new flow's hash, its place in ``flows:active`` and the engine's wake-up, in one
    transaction."""
    async with store.transaction(ctx) as tx:
        tx.hset(keys.flow(flow_id), dict(fields))
        tx.sadd(keys.FLOWS_ACTIVE, [str(flow_id)])
        tx.lpush(keys.FLOW_EVENTS, [str(flow_id)])


async def wait_flow_progress(store: Store, ctx: int, flow_id: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for flow ``flow_id``'s next progress event; False if none came."""
    progress = keys.flow_progress(flow_id)
    return await store.blpop(ctx, progress, max(timeout_s, 0.01)) is not None


async def active_flows(store: Store, ctx: int) -> set[str]:
    """The ids in ``flows:active`` (flows not final yet)."""
    return await store.smembers(ctx, keys.FLOWS_ACTIVE)


async def forget_active_flow(store: Store, ctx: int, flow_id: int) -> None:
    await store.srem(ctx, keys.FLOWS_ACTIVE, str(flow_id))


async def claim_flow_job(
    store: Store, ctx: int, job_key: str, message_key: str, ttl_s: int
) -> str | None:
    """Claim ``job_key`` for the flow job message ``message_key`` (with a TTL); None if the
    claim is this message's, else the message key holding it."""
    claim = keys.flow_job_claim(job_key)
    if await store.set_new(ctx, claim, message_key, ttl_s):
        return None
    holder = await store.get(ctx, claim)
    return None if holder == message_key else (holder or "")


# -- runner presence ------------------------------------------------------------------------


async def presence_names(store: Store, ctx: int) -> list[str]:
    return await store.scan_keys(ctx, keys.PRESENCE_RUNNER_PATTERN)


async def presence(store: Store, ctx: int, name: str) -> str | None:
    """A runner's presence value (JSON), None once it expired."""
    return await store.get(ctx, name)


async def clear_presence(store: Store, ctx: int, runner_ids: list[str]) -> None:
    await store.delete(ctx, [keys.presence_runner(r) for r in runner_ids])


async def memory_use(store: Store) -> tuple[int, int]:
    """The store's ``used_memory`` and ``maxmemory`` in bytes (INFO memory; maxmemory 0: no
    bound), what the node's intake hold watches (node/intake/pressure.py)."""
    info = await store.read(keys.ACTORS_DB, lambda r: r.info("memory"))
    return int(str(info.get("used_memory", 0))), int(str(info.get("maxmemory", 0)))


# -- the lists: queues, dlq, outboxes, in-flight lists, reply lists, client inboxes ---------


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


# -- the registry (DB 0) --------------------------------------------------------------------

NODE_ID_FIELD = "id"  # of node:info: the id of the node serving this store


async def node_info(store: Store) -> Hash:
    """``node:info``: what the running node publishes (id, address, counters, links, ...)."""
    return await store.hgetall(keys.ACTORS_DB, keys.NODE_INFO)


async def node_id(store: Store) -> str | None:
    """The id of the node serving this store; None if no node ever ran on it."""
    found = await store.call(keys.ACTORS_DB, lambda r: r.hget(keys.NODE_INFO, NODE_ID_FIELD))
    return str(found) if found else None


async def publish_node_info(store: Store, fields: dict[str, str]) -> None:
    await store.hset(keys.ACTORS_DB, keys.NODE_INFO, fields)


async def peer_ids(store: Store) -> set[str]:
    return await store.smembers(keys.ACTORS_DB, keys.PEERS)


async def read_peer(store: Store, peer_id: str) -> Hash:
    return await store.hgetall(keys.ACTORS_DB, keys.peer(peer_id))


async def knows_peer(store: Store, peer_id: str) -> bool:
    """Whether ``peer_id`` is registered as a peer of this node."""
    return await store.exists(keys.ACTORS_DB, keys.peer(peer_id))


async def put_peer(store: Store, peer: Peer) -> None:
    """Register ``peer`` and tell the running node (a registry event), in one transaction."""
    async with store.transaction(keys.ACTORS_DB) as tx:
        tx.hset(keys.peer(peer.id), peer.to_hash())
        tx.sadd(keys.PEERS, [peer.id])
        tx.lpush(keys.NODE_EVENTS, [keys.peer(peer.id)])


async def remove_peer(store: Store, node_id: str) -> None:
    """The peer's hash and its place in ``peers``, in one transaction."""
    async with store.transaction(keys.ACTORS_DB) as tx:
        tx.delete([keys.peer(node_id)])
        tx.srem(keys.PEERS, [node_id])


async def actor_hashes(store: Store) -> list[Hash]:
    """The hash of every ``actor:*`` key, in key order."""
    found = await store.scan_keys(keys.ACTORS_DB, keys.ACTOR_PATTERN)
    return await store.hgetall_many(keys.ACTORS_DB, sorted(found))


async def remove_actor(store: Store, actor_id: int) -> bool:
    """Whether there was such an actor (removed, and the registry's version bumped so that
    every cache of it reloads: Store.remove_actor)."""
    return await store.remove_actor(actor_id)


async def registry_version(store: Store) -> str:
    """``registry:version``: bumped by every write of an actor or a context, so caches of
    them can tell a stale entry (node/state.py)."""
    return await store.get(keys.ACTORS_DB, keys.REGISTRY_VERSION) or "0"


async def serves_context(store: Store, ctx: int) -> bool:
    """Whether context ``ctx`` is registered on this node."""
    return await store.sismember(keys.ACTORS_DB, keys.CONTEXTS, str(ctx))


async def next_registry_event(store: Store, timeout_s: float) -> str | None:
    """The next registration event (``node:events``), waiting up to ``timeout_s``."""
    return await store.blpop(keys.ACTORS_DB, keys.NODE_EVENTS, timeout_s)
