"""Batch frames: ``msgs`` (several messages) answered by one ``acks`` (acks and nacks).

Pure checks of the frame codec, the outbox's batching and its window, then a node over an
authenticated link: a bad message inside a batch is refused alone, a redelivered batch is
acked without being stored twice, and one acks frame answers what the node sent.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from bus.core import keys
from bus.core.frames import (
    MAX_BATCH,
    Ack,
    MsgItem,
    Nack,
    answers_of,
    decode_frame,
    encode_frame,
    encode_msg_item,
    encode_msgs,
    msgs_frame_size,
    msgs_of,
)
from bus.core.models import Message
from bus.errors import FrameError, TransportError
from bus.wire import outbox
from bus.wire.outbox import PeerOutbox
from bus.wire.transport import Link, TransportConfig, Window
from tests.faults.test_faults import Peer, good_message_runs, link_of, linked_peer, sent_in
from tests.intake.test_rejections import job_message

# -- the codec ---------------------------------------------------------------------------------


def item(n: int, **fields: str) -> str:
    return encode_msg_item(1, f"message:50:{n}", {"id": str(n), **fields})


def test_msgs_frame_round_trip_and_size():
    items = [item(1), item(2, body="é ✓")]  # non-ASCII is escaped: characters are bytes
    frame = encode_msgs(items)
    assert len(frame.encode()) == len(frame) == msgs_frame_size(sum(map(len, items)), 2)
    decoded = decode_frame(frame)
    assert decoded.type == "msgs"
    assert [m["key"] for m in decoded.body["msgs"]] == ["message:50:1", "message:50:2"]
    assert decoded.body["msgs"][1]["fields"]["body"] == "é ✓"


BAD_BATCH_FRAMES = {
    "no message": {"t": "msgs", "msgs": []},
    "item not an object": {"t": "msgs", "msgs": ["message:1:1"]},
    "item without key": {"t": "msgs", "msgs": [{"ctx": 1, "fields": {}}]},
    "ctx a bool": {"t": "msgs", "msgs": [{"ctx": True, "key": "k", "fields": {}}]},
    "too many": {"t": "msgs", "msgs": [{"ctx": 1, "key": "k", "fields": {}}] * (MAX_BATCH + 1)},
    "acks without nacks": {"t": "acks", "acks": []},
    "nack without reason": {"t": "acks", "acks": [], "nacks": [{"ctx": 1, "key": "k"}]},
    "ack key not a string": {"t": "acks", "acks": [{"ctx": 1, "key": 5}], "nacks": []},
}


@pytest.mark.parametrize("name", BAD_BATCH_FRAMES)
def test_bad_batch_frames(name):
    with pytest.raises(FrameError):
        decode_frame(json.dumps(BAD_BATCH_FRAMES[name]))


def test_fields_that_are_not_strings_do_not_spoil_a_batch():
    """They make that one message refused (nacked) by the receiver, not the whole frame."""
    odd = decode_frame(
        json.dumps({"t": "msgs", "msgs": [{"ctx": 1, "key": "k", "fields": {"id": 1}}]})
    )
    assert odd.body["msgs"][0]["fields"] == {"id": 1}
    acks = decode_frame(encode_frame("acks", acks=[{"ctx": 1, "key": "k"}], nacks=[]))
    assert acks.body["acks"] == [{"ctx": 1, "key": "k"}]


def test_batch_bodies_decode_to_dataclasses_and_a_nack_keeps_its_reason_apart():
    """A nack's reason travels as one ``"<reason>: <detail>"`` string and comes back as the
    pair; the detail may itself hold ": "."""
    sent = Nack(2, "message:1:2", "malformed", "field 'x': not a string")
    frame = decode_frame(encode_frame("acks", acks=[{"ctx": 1, "key": "k"}], nacks=[sent.item()]))
    assert frame.body["nacks"][0]["reason"] == "malformed: field 'x': not a string"
    assert answers_of(frame) == ([Ack(1, "k")], [sent])
    bare = decode_frame(encode_frame("acks", acks=[], nacks=[Nack(1, "k", "oversize").item()]))
    assert answers_of(bare) == ([], [Nack(1, "k", "oversize", "")])
    msgs = decode_frame(encode_msgs([encode_msg_item(3, "message:1:1", {"id": "1"})]))
    assert msgs_of(msgs) == [MsgItem(3, "message:1:1", {"id": "1"})]


def test_outbox_splits_batches_by_bytes_count_and_window():
    def box(max_frame_bytes: int, window: int = 256) -> PeerOutbox:
        config = TransportConfig(max_frame_bytes=max_frame_bytes, window=window)
        return PeerOutbox(None, SimpleNamespace(config=config), "p", None)  # type: ignore[arg-type]

    items = [item(n, pad="x" * 100) for n in range(10)]
    one = len(items[0])
    assert box(10**6)._chunks(items) == [items]
    three = msgs_frame_size(3 * one, 3)
    chunks = box(three)._chunks(items)
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert all(len(encode_msgs(c)) <= three for c in chunks)
    assert [len(c) for c in box(10**6, window=4)._chunks(items)] == [4, 4, 2]
    assert [x for c in chunks for x in c] == items  # order kept


async def test_window_counts_messages_not_frames(autojump_clock):
    window = Window(4)
    await window.acquire(3, 10)
    got: list[int] = []

    async def take(n: int) -> None:
        await window.acquire(n, 10)
        got.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # 3 + 2 > 4
        window.release(1)
    assert got == [2]
    assert window.unacked == 4
    with pytest.raises(TransportError):
        await window.acquire(1, 10)  # nothing acks: the link is given up after the timeout


# -- a node over a link ------------------------------------------------------------------------


def msg_item(msg: Message, **override: str) -> str:
    return encode_msg_item(msg.context_id, msg.key, msg.to_hash() | override)


async def answer_to(peer: Peer, key: str) -> dict:
    frame = await peer.wait_frame(
        lambda f: f.type == "acks" and key in [a["key"] for a in f.body["acks"] + f.body["nacks"]]
    )
    return {"acks": [a["key"] for a in frame.body["acks"]], "nacks": frame.body["nacks"]}


async def result_for(peer: Peer, msg: Message) -> dict:
    """The result message the node sent back for ``msg`` (in a msgs frame)."""
    frame = await peer.wait_frame(
        lambda f: any(m["fields"].get("message", "").find(msg.key) >= 0 for m in sent_in(f))
    )
    return next(m for m in sent_in(frame) if m["fields"]["message"].find(msg.key) >= 0)


async def test_a_bad_message_in_a_batch_is_refused_alone(node_factory, nursery):
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    link = await link_of(transport, alice.node_id)
    me, dest = peer.key.public_hex, alice.node_id
    good1, unknown_ctx, odd_fields, mismatch, good2 = (
        job_message(actor, 50, me, dest, f"print({n})") for n in range(5)
    )
    frame = encode_msgs(
        [
            msg_item(good1),
            encode_msg_item(77, unknown_ctx.key, unknown_ctx.to_hash()),
            json.dumps({"ctx": 1, "key": odd_fields.key, "fields": {"id": 1}}),
            encode_msg_item(1, mismatch.key, mismatch.to_hash() | {"id": "1"}),
            msg_item(good2),
        ]
    )
    await link.send_raw(frame)
    answer = await answer_to(peer, good1.key)
    assert answer["acks"] == [good1.key, good2.key]
    reasons = {n["key"]: n["reason"] for n in answer["nacks"]}
    assert reasons[unknown_ctx.key].startswith("unknown_context")
    assert reasons[odd_fields.key].startswith("malformed")
    assert reasons[mismatch.key].startswith("malformed")
    for good in (good1, good2):  # the good ones ran and were answered
        assert (await result_for(peer, good))["fields"]["origin"] == alice.node_id
        job = await alice.store.hgetall(1, good.job[0].key)
        assert job["status"] == "finished"
    refused = {e["key"]: e["reason"] for e in await alice.store.dead_letters(0)}
    assert refused == dict.fromkeys(
        [unknown_ctx.key, odd_fields.key, mismatch.key], "refused_delivery"
    )
    assert not await alice.store.exists(1, mismatch.key)


async def test_a_redelivered_batch_is_acked_and_stored_once(node_factory, nursery):
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    link = await link_of(transport, alice.node_id)
    msgs = [job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(7)") for _ in "ab"]
    frame = encode_msgs([msg_item(m) for m in msgs])
    await link.send_raw(frame)
    await link.send_raw(frame)  # as after a reconnect: the peer resends what it had no ack for
    with trio.fail_after(20):
        while len(peer.acks()) < 4:  # in one acks frame or two (answers merge)
            await peer.got.wait()
    assert peer.acks() == [m.key for m in msgs] * 2  # each delivery acked, in order
    assert peer.nacks() == {}
    # a later message's result means msg_in was worked off up to it: nothing queued twice
    await good_message_runs(alice, peer, link, actor, "after a redelivery")
    for m in msgs:
        assert (await result_for(peer, m))["fields"]["origin"] == alice.node_id
    results = [m for f in peer.frames for m in sent_in(f)]
    assert len(results) == len({m["key"] for m in results}) == 3
    assert await alice.store.dead_letters(1) == []  # no replay was even queued
    assert await alice.store.llen(1, keys.MSG_IN) == 0


async def test_one_acks_frame_answers_a_batch_the_node_sent(node_factory, nursery):
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    link = await link_of(transport, alice.node_id)
    msgs = [job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(1)") for _ in "abc"]
    await link.send_raw(encode_msgs([msg_item(m) for m in msgs]))
    results = [await result_for(peer, m) for m in msgs]  # the fake peer acks nothing yet...
    inflight = keys.outbox_inflight(peer.key.public_hex)
    sent = {keys.outbox_entry(r["ctx"], r["key"]) for r in results}
    assert sent <= set(await alice.store.lrange(0, inflight))  # ...so they wait for an ack
    first, *rest = results
    await link.send(
        "acks",
        acks=[{"ctx": r["ctx"], "key": r["key"]} for r in rest],
        nacks=[{"ctx": first["ctx"], "key": first["key"], "reason": "unknown_request: test"}],
    )
    probe = job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(2)")
    await link.send_raw(encode_msgs([encode_msg_item(77, probe.key, probe.to_hash())]))
    await answer_to(peer, probe.key)  # frames are handled in order: the acks frame was applied
    assert not sent & set(await alice.store.lrange(0, inflight))
    for r in rest:
        stored = await alice.store.hgetall(1, r["key"])
        assert stored["status"] == "acknowledged"
        assert stored["acked_at"]
    refused = await alice.store.hgetall(1, first["key"])
    assert (refused["status"], refused["reason"]) == ("error", "peer_refused_unknown_request")


async def test_acks_from_another_peer_change_nothing(node_factory, nursery):
    """Only the peer a message was sent to can acknowledge it (the ack script checks)."""
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    link: Link = await link_of(transport, alice.node_id)
    msg = job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(3)")
    await link.send_raw(encode_msgs([msg_item(msg)]))
    await answer_to(peer, msg.key)
    # msg is stored at alice with destination alice: an ack from the peer must not touch it
    await link.send("acks", acks=[{"ctx": 1, "key": msg.key}], nacks=[])
    probe = job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(4)")
    await link.send_raw(encode_msgs([encode_msg_item(77, probe.key, probe.to_hash())]))
    await answer_to(peer, probe.key)
    assert "acked_at" not in await alice.store.hgetall(1, msg.key)


async def test_an_outbox_sends_what_the_supervisor_read_without_reading_it_again(store, redis_url):
    """The supervisor hands the outbox the message hashes it just read with their entries:
    their first pop reads nothing; a resend (the next pop of the entry) and entries it was
    not handed are read from Valkey; it keeps at most MAX_REMEMBERED of them."""
    import redis

    box = PeerOutbox(store, None, "p", None)  # type: ignore[arg-type]
    await store.call(keys.ACTORS_DB, lambda r: r.sadd(keys.CONTEXTS, ["1"]))  # served
    await store.hset(1, "message:1:1", {"id": "1", "v": "stored"})
    await store.hset(1, "message:1:2", {"id": "2", "v": "stored"})
    box.remember("1|message:1:1", {"id": "1", "v": "read by the supervisor"})
    one, two = (1, "message:1:1", "1|message:1:1"), (1, "message:1:2", "1|message:1:2")

    def evalsha_calls() -> int:
        stats = redis.Redis.from_url(redis_url).info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    before = evalsha_calls()
    assert await box._load([one]) == [("1|message:1:1", {"id": "1", "v": "read by the supervisor"})]
    assert evalsha_calls() == before  # nothing read
    assert await box._load([one, two]) == [
        ("1|message:1:1", {"id": "1", "v": "stored"}),
        ("1|message:1:2", {"id": "2", "v": "stored"}),
    ]
    for n in range(outbox.MAX_REMEMBERED + 1):
        box.remember(f"1|message:1:{n}", {"id": str(n)})
    assert len(box._remembered) == outbox.MAX_REMEMBERED
    assert "1|message:1:0" not in box._remembered


async def test_the_peers_acks_open_the_window_of_their_link(node_factory, nursery):
    """What the outbox sent on a link holds places in that link's window until the peer's acks,
    read on the same link, open them again (node/links/frames.py)."""
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    link = await link_of(transport, alice.node_id)
    msgs = [job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(5)") for _ in "ab"]
    await link.send_raw(encode_msgs([msg_item(m) for m in msgs]))
    results = [await result_for(peer, m) for m in msgs]  # the fake peer acks nothing yet
    state = alice.info.state
    assert state is not None
    assert state.peers.transport is not None
    alices = state.peers.transport.link(peer.key.public_hex)
    assert alices is not None
    assert alices.window.unacked == 2
    await link.send("acks", acks=[{"ctx": r["ctx"], "key": r["key"]} for r in results], nacks=[])
    probe = job_message(actor, 50, peer.key.public_hex, alice.node_id, "print(6)")
    await link.send_raw(encode_msgs([encode_msg_item(77, probe.key, probe.to_hash())]))
    await answer_to(peer, probe.key)  # frames are handled in order: the acks frame was applied
    assert alices.window.unacked == 0
