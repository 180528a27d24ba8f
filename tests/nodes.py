"""Wiring in-process test nodes (conftest.py's node_factory) into a two-node bus."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from crypto import KeyPair, read_key_file


async def link_to(origin, dest) -> KeyPair:  # noqa: ANN001 - conftest.RunningNode
    """Let ``origin``'s actor run jobs in ``dest``'s context 1: ``origin`` dials ``dest``,
    ``dest`` knows ``origin`` (without an address, so there is one link) and its actor (an
    executor there). Returns the actor's key."""
    actor = read_key_file(origin.config.actor_key_path)
    await origin.client.add_peer(dest.node_id, dest.info.ws_url, name=dest.config.name)
    await dest.client.add_peer(origin.node_id, "", name=origin.config.name)
    await dest.client.register_actor(origin.config.actor_id, actor.public_hex)
    await dest.client.register_context(1, admins=[2], executors=[origin.config.actor_id])
    return actor


async def add_known_peers(node, *peers: KeyPair) -> None:  # noqa: ANN001 - conftest.RunningNode
    """Register ``peers`` (no address: they never dial) and return once ``node`` knows them:
    it loads its peers on the registry event each registration sends, and a result from a
    peer it does not know yet is refused as ``unknown_signer``."""
    for peer in peers:
        await node.client.add_peer(peer.public_hex, "", name=peer.public_hex[:6])
    known = node.info.state.peers.is_known_node
    with trio.fail_after(20):
        while not all(known(peer.public_hex) for peer in peers):
            await tick(node.store)


async def until(check: Callable[[], bool], timeout_s: float) -> bool:
    """Wait (bounded) for ``check()`` on the state of other processes (their files, a server
    they run); False if it did not hold in time."""
    with trio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110 - another process's state: nothing to block on
            await trio.sleep(0.05)
        return True
    return False


async def until_read(check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    """:func:`until` for a check that reads another process's state over a connection (a
    hash another node publishes, say): bounded, re-read every 0.1 s."""
    with trio.move_on_after(timeout_s):
        while not await check():  # noqa: ASYNC110 - another process's state: nothing to block on
            await trio.sleep(0.1)
        return True
    return False


async def tick(store) -> None:  # noqa: ANN001 - a Store
    """A bounded wait between two looks at another service's lists (a BLPOP that times out)."""
    await store.call(1, lambda r: r.blpop(["never"], timeout=0.1))
