"""Named reads and writes of DB 0's registry (node info, peers, actors, contexts, registry
events): the door node/ and the client take to it, instead of generic Redis verbs."""

from __future__ import annotations

from bus.core import keys
from bus.core.models import Hash, Peer
from bus.store.connection import Store

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


async def version(store: Store) -> str:
    """``registry:version``: bumped by every write of an actor or a context, so caches of
    them can tell a stale entry (node/state.py)."""
    return await store.get(keys.ACTORS_DB, keys.REGISTRY_VERSION) or "0"


async def serves_context(store: Store, ctx: int) -> bool:
    """Whether context ``ctx`` is registered on this node."""
    return await store.sismember(keys.ACTORS_DB, keys.CONTEXTS, str(ctx))


async def next_registry_event(store: Store, timeout_s: float) -> str | None:
    """The next registration event (``node:events``), waiting up to ``timeout_s``."""
    return await store.blpop(keys.ACTORS_DB, keys.NODE_EVENTS, timeout_s)
