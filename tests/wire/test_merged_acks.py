"""Acks merged: a node answers a burst of ``msgs`` frames with fewer ``acks`` frames, each
message acked exactly once and only once it is stored; a lone message is answered alone.

A real node (its own Valkey) on one side, our own Transport dialling it as a fake peer on the
other (tests/faults/test_faults.py: Peer): the burst is sent back to back, so that frames wait
in the node's read while it stores the ones before them.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio
import trio.testing

from bus.core.frames import MAX_BATCH, Frame, decode_frame, encode_msg_item, encode_msgs
from bus.wire.transport import HELD_ANSWERS, Link, Transport, answer_frames
from crypto import KeyPair
from tests.faults.test_faults import Peer, link_of, linked_peer, msg_frame
from tests.intake.test_rejections import job_message

BURST = 40


class CheckingPeer(Peer):
    """A peer that checks, as each acks frame arrives, that the node holds what it acks."""

    def __init__(self, store_of_node) -> None:  # noqa: ANN001 - the node's Store
        super().__init__()
        self.node_store = store_of_node
        self.acked_missing: list[str] = []

    async def on_frame(self, link: Link, frame: Frame) -> None:
        if frame.type == "acks":
            for ack in frame.body["acks"]:
                if not await self.node_store.exists(ack["ctx"], ack["key"]):
                    self.acked_missing.append(ack["key"])
        await super().on_frame(link, frame)


def acks_frames(peer: Peer) -> list[Frame]:
    return [f for f in peer.frames if f.type == "acks"]


async def test_a_burst_is_acked_in_fewer_frames_each_message_once(node_factory, nursery):
    alice = await node_factory("alice")
    peer, transport, actor = await linked_peer(nursery, alice)
    checking = CheckingPeer(alice.store)
    checking.key = peer.key
    transport._on_frame = checking.on_frame  # the same peer, checking what it is told
    link = await link_of(transport, alice.node_id)
    me = peer.key.public_hex
    msgs = [job_message(actor, 50, me, alice.node_id, f"print({n})") for n in range(BURST)]
    for msg in msgs:  # one msgs frame each, as an idle outbox sends them
        await link.send_raw(msg_frame(msg))
    sent = {m.key for m in msgs}
    with trio.fail_after(30):
        while not sent <= set(checking.acks()):
            await checking.got.wait()
    answered = Counter(k for k in checking.acks() if k in sent)
    assert answered == Counter(dict.fromkeys(sent, 1))  # every one, exactly once
    assert checking.acked_missing == []  # stored before acked
    frames = acks_frames(checking)
    assert len(frames) < BURST  # merged: what waited in one read, in one acks frame
    assert all(len(f.body["acks"]) <= HELD_ANSWERS for f in frames)
    # a lone message after the burst is answered alone, without waiting for another
    lone = job_message(actor, 50, me, alice.node_id, "print('lone')")
    await link.send_raw(msg_frame(lone))
    frame = await checking.wait_frame(
        lambda f: f.type == "acks" and lone.key in [a["key"] for a in f.body["acks"]]
    )
    assert [a["key"] for a in frame.body["acks"]] == [lone.key]


def test_answers_never_exceed_a_frame():
    """Answers that waited together leave in frames of at most MAX_BATCH entries (a peer
    refuses a bigger acks frame), acks before nacks, in order, none lost."""
    acks = [{"ctx": 1, "key": f"message:1:{n}"} for n in range(MAX_BATCH + 10)]
    nacks = [{"ctx": 1, "key": f"message:2:{n}", "reason": "malformed: x"} for n in range(5)]
    frames = [decode_frame(f) for f in answer_frames(acks, nacks)]
    assert [len(f.body["acks"]) + len(f.body["nacks"]) for f in frames] == [MAX_BATCH, 15]
    assert [a for f in frames for a in f.body["acks"]] == acks
    assert [n for f in frames for n in f.body["nacks"]] == nacks
    assert answer_frames([], []) == []


class Holding:
    """A receiver that answers every msgs frame, and stops reading at frame ``stop``, as a
    node held back does (node/links/frames.py: _room_for): after ``answer_now``, or not."""

    def __init__(self, stop: int, answer_now: bool) -> None:
        self.stop, self.answer_now = stop, answer_now
        self.seen = 0
        self.go = trio.Event()  # the first frame waits for it: the others pile up behind
        self.held = trio.Event()

    async def on_frame(self, link: Link, frame: Frame) -> None:
        if frame.type != "msgs":
            return
        if self.seen == 0:
            await self.go.wait()
        self.seen += 1
        link.post_answers([{"ctx": m["ctx"], "key": m["key"]} for m in frame.body["msgs"]], [])
        if self.seen == self.stop:
            if self.answer_now:
                link.answer_now()
            self.held.set()
            await trio.sleep_forever()

    async def on_bad_frame(self, link: Link, detail: str) -> None:
        raise AssertionError(detail)


@pytest.mark.parametrize("answer_now", [True, False])
async def test_a_reader_that_waits_answers_first(nursery, answer_now):
    """Answers held for frames read together go when the reader is about to wait for
    something else (``answer_now``): without it they would wait for that wait to end."""
    a, b = KeyPair.generate(), KeyPair.generate()
    holding, sender = Holding(stop=2, answer_now=answer_now), Peer()
    tb = Transport(b, lambda: {a.public_hex}, holding.on_frame, holding.on_bad_frame)
    ta = Transport(a, lambda: {b.public_hex}, sender.on_frame, sender.on_bad_frame)
    port = await nursery.start(tb.serve, "127.0.0.1", 0)
    nursery.start_soon(ta.dial_forever, b.public_hex, f"ws://127.0.0.1:{port}")
    link = await link_of(ta, b.public_hex)
    keys = [f"message:1:{n}" for n in range(8)]
    for key in keys:
        await link.send_raw(encode_msgs([encode_msg_item(1, key, {"id": key})]))
    # every frame received: the first one waits in on_frame, the second and third in
    # trio-websocket's queue, so the second is read with others waiting behind it
    await trio.testing.wait_all_tasks_blocked()
    holding.go.set()
    with trio.fail_after(10):
        await holding.held.wait()
    with trio.move_on_after(10 if answer_now else 1):
        while keys[1] not in sender.acks():
            await sender.got.wait()
    # the second frame's answer waits for the frames behind it, until the reader says it
    # will wait for something else; then the answers held so far go
    if answer_now:
        assert sender.acks() == keys[:2]
    else:
        assert keys[1] not in sender.acks()
