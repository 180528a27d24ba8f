"""The node's cache of actors and contexts is never stale: after an actor is removed or a
permission withdrawn, the very next message is judged with the new state (the writes bump
``registry:version``, which admission reads after each pop: every message it judges was popped
first, as here)."""

from __future__ import annotations

import pytest

from bus.core import keys
from bus.core.models import Actor, Context, Message
from bus.store.connection import Store
from crypto import KeyPair
from node.config import NodeConfig
from node.intake.admission import authorise_caller
from node.intake.messages import Rejected
from node.state import NodeState
from tests.intake.test_rejections import job_message

ACTOR = 9


async def popped(store: Store, message: Message) -> Message:
    """``message`` after it went through a queue, as the supervisor and the consumer take it
    (the pop reads the registry's version too)."""
    await store.lpush(1, "queue:test", message.key)
    [(key, _)] = await store.pop_read_batch(1, "queue:test", "inflight:test", 64, registry=True)
    assert key == message.key
    return message


async def _warm(store: Store, tmp_path) -> tuple[NodeState, KeyPair]:  # noqa: ANN001
    node = NodeState(NodeConfig(home=tmp_path), KeyPair.generate(), store)
    actor = KeyPair.generate()
    await store.put_actor(Actor(id=ACTOR, pubkey=actor.public_hex))
    await store.put_context(Context(id=1, admins=[1], executors=[ACTOR]))
    # admitted, and the actor and the context are now cached
    first = await popped(
        store, job_message(actor, ACTOR, node.identity.node_id, node.identity.node_id, "1")
    )
    await authorise_caller(node, 1, first)
    assert {k for k, _ in node.registry._cache} == {"actor", "context"}
    return node, actor


async def test_next_message_after_actor_remove_is_refused(store, tmp_path):
    node, actor = await _warm(store, tmp_path)
    assert await store.remove_actor(ACTOR)
    message = await popped(
        store, job_message(actor, ACTOR, node.identity.node_id, node.identity.node_id, "1")
    )
    with pytest.raises(Rejected) as refused:
        await authorise_caller(node, 1, message)
    assert refused.value.reason == "unknown_signer"


async def test_next_message_after_permission_withdrawn_is_refused(store, tmp_path):
    node, actor = await _warm(store, tmp_path)
    await store.put_context(Context(id=1, admins=[1], executors=[]))
    message = await popped(
        store, job_message(actor, ACTOR, node.identity.node_id, node.identity.node_id, "1")
    )
    with pytest.raises(Rejected) as refused:
        await authorise_caller(node, 1, message)
    assert refused.value.reason == "permission_denied"


async def test_next_message_after_key_change_is_judged_with_the_new_key(store, tmp_path):
    node, old = await _warm(store, tmp_path)
    new = KeyPair.generate()
    await store.put_actor(Actor(id=ACTOR, pubkey=new.public_hex))
    # the old key no longer signs for the actor; the new one does, at once
    with pytest.raises(Rejected):
        await authorise_caller(
            node,
            1,
            await popped(
                store, job_message(old, ACTOR, node.identity.node_id, node.identity.node_id, "1")
            ),
        )
    await authorise_caller(
        node,
        1,
        await popped(
            store, job_message(new, ACTOR, node.identity.node_id, node.identity.node_id, "1")
        ),
    )


async def test_unchanged_registry_is_served_from_the_cache(store, tmp_path):
    node, actor = await _warm(store, tmp_path)
    # a write that bypasses the registry API is not seen (the version did not move): proof
    # that the second admission used the cache, one GET instead of two HGETALLs
    await store.hset(keys.ACTORS_DB, keys.actor(ACTOR), {"pubkey": KeyPair.generate().public_hex})
    message = await popped(
        store, job_message(actor, ACTOR, node.identity.node_id, node.identity.node_id, "1")
    )
    await authorise_caller(node, 1, message)


async def test_messages_of_one_popped_batch_share_one_version_read(store, tmp_path):
    node, _ = await _warm(store, tmp_path)
    before = await node.registry.version()
    await store.call(keys.ACTORS_DB, lambda r: r.incr(keys.REGISTRY_VERSION))
    # nothing popped since the last read: no message can depend on that write yet
    assert await node.registry.version() == before
    # a pop whose entries are not admitted (an outbox's, say) changes nothing either
    await store.lpush(1, "queue:test", "x")
    await store.pop_read_batch(1, "queue:test", "inflight:test", 64)
    assert await node.registry.version() == before
    await store.lpush(1, "queue:test", "y")
    await store.pop_read_batch(1, "queue:test", "inflight:test", 64, registry=True)
    assert await node.registry.version() != before


@pytest.mark.parametrize("block_first", [False, True])
async def test_the_pop_reads_the_version_so_admission_needs_no_round_trip(
    store, tmp_path, block_first
):
    """The version comes with the pop (its script reads it after its pops): admitting what
    it popped costs no GET, and a registry write made before a message was submitted is seen
    by that message's admission (the removed actor is refused)."""
    node, actor = await _warm(store, tmp_path)
    assert await store.remove_actor(ACTOR)
    message = job_message(actor, ACTOR, node.identity.node_id, node.identity.node_id, "1")
    await store.lpush(1, "queue:test", message.key)
    if block_first:  # the blocking pop, with the script that reads behind it
        popped = await store.pop_read_wait(1, "queue:test", "inflight:test", 64, 1.0, registry=True)
    else:
        popped = await store.pop_read_batch(1, "queue:test", "inflight:test", 64, registry=True)
    assert [key for key, _ in popped] == [message.key]
    gets = await _calls(store, "get")
    with pytest.raises(Rejected) as refused:
        await authorise_caller(node, 1, message)
    assert refused.value.reason == "unknown_signer"
    # the refusal's own fresh read is a HGETALL of the actor; the version needed no GET
    assert await _calls(store, "get") == gets


async def _calls(store: Store, command: str) -> int:
    stats = await store.call(0, lambda r: r.info("commandstats"))
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
