"""Per-peer link state (bus/wire/linkstate.py): recorded by the transport as links come and go,
with the round trip of its pings, and published in node:info by node/observe/linkinfo.py."""

from __future__ import annotations

import socket

import trio

from bus.core import keys
from bus.core.ids import set_clock
from bus.wire.linkstate import LinkStates
from crypto import KeyPair
from node.observe.linkinfo import read_links
from tests.wire.test_handshake import Recorder, serve

A, B = KeyPair.generate(), KeyPair.generate()


def test_an_outage_keeps_its_first_moment_across_failed_redials():
    clock = [100.0]
    previous = set_clock(lambda: clock[0])
    try:
        states = LinkStates()
        states.down("p", "OSError: refused")
        clock[0] = 160.0
        states.down("p", "OSError: refused again")  # still down since 100
        first = states.snapshot()["p"]
        clock[0] = 200.0
        states.up("p")
        up = states.snapshot()["p"]
        clock[0] = 260.0
        states.down("p", "")
        down = states.snapshot()["p"]
    finally:
        set_clock(previous)
    assert first == {
        "state": "down",
        "since": 100,
        "last_seen": 0,
        "rtt_ms": -1.0,
        "error": "OSError: refused again",
        "encryption": "",
        "plaintext": "",
    }
    assert up["state"] == "up"
    assert up["since"] == 200
    assert up["last_seen"] == 200
    assert up["error"] == ""
    assert down["state"] == "down"
    assert down["since"] == 260
    assert down["error"] == "link closed"  # never an empty reason


def test_a_snapshot_rearms_the_change_event():
    states = LinkStates()
    states.rtt("p", 0.0025)
    assert states.changed.is_set()
    assert states.snapshot()["p"]["rtt_ms"] == 2.5
    assert not states.changed.is_set()
    states.of("p").last_seen = 300  # as a link's reader stamps each frame
    assert not states.changed.is_set()  # frames alone are published with the next change
    assert states.get("p").last_seen == 300


async def wait_for(states: LinkStates, peer: str, test) -> dict:  # noqa: ANN001
    """The peer's state once ``test(state)`` holds, waiting on the change event."""
    while True:
        state = states.snapshot().get(peer)
        event = states.changed  # the one armed by this snapshot
        if state is not None and test(state):
            return state
        await event.wait()


async def test_a_link_records_up_round_trip_and_down(nursery):
    ra, rb = Recorder(), Recorder()
    ta, _ = await serve(nursery, A, {B.public_hex}, ra)
    tb, url_b = await serve(nursery, B, {A.public_hex}, rb)
    dialling = trio.CancelScope()

    async def dial() -> None:
        with dialling:
            await ta.dial_forever(B.public_hex, url_b)

    nursery.start_soon(dial)
    with trio.fail_after(10):
        up = await wait_for(ta.states, B.public_hex, lambda s: s["rtt_ms"] >= 0)
        seen_by_b = await wait_for(tb.states, A.public_hex, lambda s: s["state"] == "up")
    assert up["state"] == "up"
    assert up["since"] > 0
    assert up["last_seen"] >= up["since"]
    assert seen_by_b["since"] > 0
    dialling.cancel()  # dial_forever's link ends with its task
    with trio.fail_after(10):
        down = await wait_for(tb.states, A.public_hex, lambda s: s["state"] == "down")
    assert down["error"] == "link closed"


async def test_a_refused_dial_records_why(nursery):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ta, _ = await serve(nursery, A, {B.public_hex}, Recorder())
    nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{port}")
    with trio.fail_after(10):
        down = await wait_for(ta.states, B.public_hex, lambda s: s["state"] == "down")
    assert down["since"] > 0
    assert down["error"], down  # never empty: the error that says why
    assert "refused" in down["error"].lower(), down


async def published_link(store, peer: str, test) -> dict:  # noqa: ANN001
    """The link state ``node:info`` publishes for ``peer`` once ``test(state)`` holds, woken
    by keyspace events on node:info (the test's own Valkey: it may set them)."""
    client = await store.db(keys.ACTORS_DB)
    current = await client.config_get(["notify-keyspace-events"])
    flags = set(str(next(iter(current.values()), "") or ""))
    await client.config_set({"notify-keyspace-events": "".join(sorted(flags | {"K", "h"}))})
    channel = f"__keyspace@{keys.ACTORS_DB}__:{keys.NODE_INFO}"
    async with client.pubsub(channels=[channel], ignore_subscribe_messages=True) as ps:
        while True:
            info = await store.hgetall(keys.ACTORS_DB, keys.NODE_INFO)
            state = read_links(info).get(peer)
            if state is not None and test(state):
                return state
            await ps.get_message(timeout=5)


async def test_a_node_publishes_its_links_in_node_info(node_factory):
    from tests.nodes import link_to

    alice = await node_factory("alice")
    bob = await node_factory("bob")
    with trio.fail_after(30):
        await link_to(alice, bob)
        up = await published_link(alice.store, bob.node_id, lambda s: s["rtt_ms"] >= 0)
    assert up["state"] == "up"
    assert up["since"] > 0
    assert up["error"] == ""
    bob.stop()
    with trio.fail_after(30):
        down = await published_link(alice.store, bob.node_id, lambda s: s["state"] == "down")
    assert down["since"] >= up["since"]
    assert down["error"]
