"""Wiring in-process test nodes (conftest.py's node_factory) into a two-node bus."""

from __future__ import annotations

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
