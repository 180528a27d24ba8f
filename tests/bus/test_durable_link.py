"""A link's acks on a replicated store are given once the delivered messages are durable,
confirmed by one WAITAOF on the connection that stored them (bus/store/durable.py): no barrier
write (``INCR durable``) for a delivery, one WAITAOF for a whole batch, the barrier only for a
redelivery that the batch's own writes do not cover, and no ack while no replica confirms."""

from __future__ import annotations

import signal

import coredis
import pytest
import trio

from bench.replicated import primary_calls
from bus.client.api import Client
from bus.core import keys
from bus.core.frames import encode_msg_item, encode_msgs
from bus.errors import StoreError
from bus.store.atomic import routing, script
from bus.store.connection import Store, open_store
from bus.wire.transport import Transport, TransportConfig
from crypto import read_key_file
from node.host.acl import NODE
from tests.bus.test_durable_submit import _replicas_ready
from tests.bus.test_store import _SHAPES, misnamed
from tests.faults.test_faults import Peer, link_of
from tests.intake.test_rejections import job_message
from tests.replicated_rig import Rig, replicated_node

CTX = 1


def _message(n: int, tag: str = "m") -> tuple[str, dict[str, str]]:
    return f"message:7:{tag}{n}", {"id": f"{tag}{n}", "caller_id": "7", "context_id": str(CTX)}


async def _deliver_durably(store: Store, batch: list[tuple[str, dict[str, str]]]) -> list[bool]:
    return await routing.deliver(store, CTX, batch, durable_since=store.epoch)


async def test_a_delivered_batch_waits_once_on_its_own_connection(replicated):
    async with open_store(replicated.url(NODE, waitaof="1,1")) as store:
        await _replicas_ready(store)
        assert store.barrier is not None
        nudges = store.barrier.nudges
        assert nudges is not None
        await nudges.settled()
        before, rounds = await primary_calls(replicated), store.barrier.rounds
        nudged = nudges.sent
        # the first batch also loads the delivery script (NOSCRIPT, then run again)
        assert await _deliver_durably(store, [_message(n) for n in range(5)]) == [True] * 5
        assert await _deliver_durably(store, [_message(n) for n in range(5, 9)]) == [True] * 4
        await nudges.settled()  # a nudge still blocked on the primary is not counted there yet
        after, rounds = await primary_calls(replicated), store.barrier.rounds - rounds
        nudged = nudges.sent - nudged
        assert len(await store.lrange(CTX, keys.MSG_IN)) == 9
    assert rounds == 2  # one confirmation per batch ...
    # ... each one WAITAOF, or two when a replica's fsync outlasts the first short wait; a
    # wait unanswered for a while is nudged by a WAITAOF on another connection (how many
    # depends on the machine's load, not on the batch: counted apart)
    waits = after.get("waitaof", 0) - before.get("waitaof", 0) - nudged
    assert rounds <= waits <= 2 * rounds
    assert after.get("incr", 0) == before.get("incr", 0)  # no ``INCR durable``


async def test_only_a_delivery_that_stored_nothing_takes_the_barrier(replicated):
    """A redelivered message was stored by an earlier delivery, maybe on another connection.
    The delivery script is atomic: what it finds stored was written before what it stores, so
    its own write's WAITAOF covers the frame; one that stores nothing takes the barrier."""
    async with open_store(replicated.url(NODE, waitaof="1,1")) as store:
        await _replicas_ready(store)
        await _deliver_durably(store, [_message(1)])
        before = await primary_calls(replicated)
        # a new message then a redelivered one, a redelivery then a new one: covered
        assert await _deliver_durably(store, [_message(2), _message(1)]) == [True, False]
        assert await _deliver_durably(store, [_message(1), _message(3)]) == [False, True]
        middle = await primary_calls(replicated)
        # a redelivery alone
        assert await _deliver_durably(store, [_message(2)]) == [False]
        after = await primary_calls(replicated)
    assert middle.get("incr", 0) == before.get("incr", 0)
    assert after.get("incr", 0) - middle.get("incr", 0) == 1


async def _known(store: Store, sha: str) -> bool:
    return bool((await store.call(CTX, lambda r: r.script_exists([sha])))[0])


async def test_both_script_paths_reload_what_the_server_forgot(replicated):
    """After a ``SCRIPT FLUSH`` (as after a restart) a delivery, durable or not, loads its
    script again on the connection that runs it and runs once; both paths decode replies
    alike; a script still unknown after its load is a StoreError, with no WAITAOF sent."""
    deliver = script("routing_deliver").sha
    async with open_store(replicated.url(NODE, waitaof="1,1")) as store:
        await _replicas_ready(store)
        assert await _deliver_durably(store, [_message(1)]) == [True]
        await store.call(CTX, lambda r: r.script_flush())
        assert not await _known(store, deliver)
        nudges = store.barrier.nudges if store.barrier else None
        assert nudges is not None
        await nudges.settled()
        before, nudged = await primary_calls(replicated), nudges.sent
        assert await _deliver_durably(store, [_message(2), _message(3)]) == [True, True]
        await nudges.settled()
        durable, nudged = await primary_calls(replicated), nudges.sent - nudged
        assert await _known(store, deliver)
        await store.call(CTX, lambda r: r.script_flush())
        assert await routing.deliver(store, CTX, [_message(4), _message(1)]) == [True, False]
        plain = await primary_calls(replicated)
        assert await _known(store, deliver)
        assert len(await store.lrange(CTX, keys.MSG_IN)) == 4

        shapes = [(_SHAPES, [], ["x", "5"])]
        assert await store.scripts_durable(CTX, shapes, store.epoch, lambda _: True) == [
            ["x", 5, None, ["x", 7]]
        ]
        assert await store.scripts(CTX, shapes) == [["x", 5, None, ["x", 7]]]

        waits = (await primary_calls(replicated)).get("waitaof", 0)
        with pytest.raises(StoreError, match="still missing after SCRIPT LOAD"):
            await store.scripts_durable(CTX, [(misnamed(), [], [])], store.epoch, lambda _: True)
        assert (await primary_calls(replicated)).get("waitaof", 0) == waits
    for after, was in ((durable, before), (plain, durable)):
        assert after["script|load"] - was.get("script|load", 0) == 1
        # one call for the two messages (routing_deliver.lua), run again once
        assert after["evalsha"] - was["evalsha"] == 2
    # one barrier for the reloaded delivery: one WAITAOF, or two when the first, short one
    # misses a replica (bus/store/durable.py Barrier._confirm), as the test above allows;
    # the nudges of a slow wait (as many as the machine's load makes) counted apart
    assert 1 <= durable["waitaof"] - before.get("waitaof", 0) - nudged <= 2


async def _fake_peer(nursery: trio.Nursery, rig: Rig) -> tuple[Peer, Transport]:
    """A peer the node knows (it dials the node), with an authenticated link up."""
    peer = Peer()
    async with open_store(rig.node_url) as store:
        await Client(store).add_peer(peer.key.public_hex, "", name="fake")
    transport = Transport(
        peer.key, lambda: {rig.ready.node_id}, peer.on_frame, peer.on_bad_frame, TransportConfig()
    )
    nursery.start_soon(transport.dial_forever, rig.ready.node_id, rig.ready.ws_url)
    return peer, transport


def _frame(rig: Rig, peer: Peer, n: int) -> tuple[list[str], str]:
    """``n`` job messages of the node's own actor (admin of context 1), sent by ``peer``."""
    actor = read_key_file(rig.home / "actor.key")
    msgs = [
        job_message(actor, 1, peer.key.public_hex, rig.ready.node_id, "true", "sh")
        for _ in range(n)
    ]
    items = [encode_msg_item(m.context_id, m.key, m.to_hash()) for m in msgs]
    return [m.key for m in msgs], encode_msgs(items)


async def test_a_link_ack_waits_without_a_barrier_write(tmp_path, nursery):
    async with replicated_node(tmp_path) as rig:
        peer, transport = await _fake_peer(nursery, rig)
        link = await link_of(transport, rig.ready.node_id)
        async with open_store(rig.node_url) as store:
            await _replicas_ready(store)
        sent, frame = _frame(rig, peer, 1)
        await link.send_raw(frame)  # connections made, scripts loaded
        await peer.wait_frame(lambda f: f.type == "acks" and sent[0] in peer.acks())
        before = await primary_calls(rig.servers)
        sent, frame = _frame(rig, peer, 3)
        await link.send_raw(frame)
        await peer.wait_frame(lambda f: f.type == "acks" and set(sent) <= set(peer.acks()))
        after = await primary_calls(rig.servers)
    assert after.get("waitaof", 0) > before.get("waitaof", 0)
    assert after.get("incr", 0) == before.get("incr", 0)  # no ``INCR durable``


async def _stored(store: Store, message_keys: list[str]) -> None:
    with trio.fail_after(8):
        while True:  # polls the store: nothing here to wait on
            if await store.count_existing(CTX, message_keys) == len(message_keys):
                return
            await trio.sleep(0.01)


async def _waitaof_blocked(rig: Rig) -> None:
    """Until the primary holds a client blocked in WAITAOF (the node's, for the delivery)."""
    primary = coredis.Redis(
        host="127.0.0.1",
        port=rig.servers.data_ports[0],
        username=NODE,
        password=rig.servers.passwords[NODE],
        decode_responses=True,
    )
    async with primary:
        with trio.fail_after(8):
            while True:  # polls the server: nothing here to wait on
                found = await primary.client_list()
                if any(c["cmd"] == "waitaof" and "b" in c["flags"] for c in found):
                    return
                await trio.sleep(0.01)


async def test_no_link_ack_before_a_replica_confirms(tmp_path, nursery):
    """Both replicas stopped: the node stores the messages (the primary takes writes within
    min-replicas-max-lag) but acks them only once a replica has fsynced them, after SIGCONT."""
    async with replicated_node(tmp_path, waitaof_timeout_ms=60_000) as rig:
        peer, transport = await _fake_peer(nursery, rig)
        link = await link_of(transport, rig.ready.node_id)
        async with open_store(rig.node_url) as store:
            await _replicas_ready(store)
            sent, frame = _frame(rig, peer, 2)
            replicas = [rig.servers.child(port) for port in rig.servers.data_ports[1:]]
            for replica in replicas:
                replica.signal(signal.SIGSTOP)
            try:
                await link.send_raw(frame)
                await _stored(store, sent)
                await _waitaof_blocked(rig)
                await trio.sleep(0.5)  # an ack posted before that WAITAOF would be here by now
                assert not set(sent) & set(peer.acks())
            finally:
                for replica in replicas:
                    replica.signal(signal.SIGCONT)
            await peer.wait_frame(lambda f: f.type == "acks" and set(sent) <= set(peer.acks()))
