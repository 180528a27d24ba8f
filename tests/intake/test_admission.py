"""One admission check on every path: a job is its message's caller's, no message overwrites
another's job, sizes are bounded, and a job message past its signed ack deadline never runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bus.core import keys
from bus.core.deadlines import deadline_times
from bus.core.envelope import sign_message
from bus.core.ids import new_id, now, set_clock
from bus.core.models import JobStatus, Message
from bus.store.atomic.queues import JobWrite, materialise_batch
from bus.store.atomic.routing import deadline_members
from bus.store.connection import Store
from crypto import KeyPair, read_key_file
from node.config import NodeConfig
from node.intake.admission import check_ack_deadline, delivery_problem, stored_size
from node.intake.deadlines import fail_due
from node.intake.messages import Rejected
from node.state import NodeState
from tests.intake.test_rejections import Ran, job_message, push_in, run_and_wait
from tests.nodes import link_to

VICTIM = 9  # another actor of alice's context 1, whose finished job a forger aims at


def marker_script(marker: Ran) -> str:
    return f"open({marker.name!r}, 'w').write('ran')"


def resigned(message: Message, signer: KeyPair, **changes: object) -> Message:
    """``message`` with ``changes`` (fields of its one job), signed again by ``signer``."""
    job = replace(message.job[0], **changes)  # type: ignore[arg-type]
    return sign_message(replace(message, job=[job], signatures=[]), signer)


async def finished_job_of(node, signer: KeyPair, caller: int) -> dict[str, str]:  # noqa: ANN001
    msg = await node.client.submit_job(
        signer, caller, to=node.node_id, context_id=1, script_type="python", script="print(7)"
    )
    with trio.fail_after(15):
        [result] = await node.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.FINISHED
    return await node.store.hgetall(1, msg.job[0].key)


# -- item 2: a job is its message's, and is never another message's job ------------------------


@pytest.mark.parametrize("aim", ["caller", "new_job_of_caller", "context"])
async def test_local_job_of_another_caller_or_context_is_refused(node_factory, tmp_path, aim):
    """The supervisor path (a message to this node's own runners) refuses what the consumer
    path refuses: a job naming another caller or context than its signed message."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    victim = KeyPair.generate()
    await alice.client.register_actor(VICTIM, victim.public_hex)
    await alice.client.register_context(1, admins=[1], executors=[VICTIM])
    before = await finished_job_of(alice, victim, VICTIM)
    marker = Ran(tmp_path)
    base = job_message(actor, 1, alice.node_id, alice.node_id, marker_script(marker))
    if aim == "caller":  # actor 1 signs a job that names actor 9's finished job
        forged = resigned(base, actor, caller_id=VICTIM, id=int(before["id"]))
    elif aim == "new_job_of_caller":  # ... or a job key of actor 9's not taken yet
        forged = resigned(base, actor, caller_id=VICTIM)
    else:
        forged = resigned(base, actor, context_id=2)
    await push_in(alice, forged, queue=keys.MSG_OUT)
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(forged, timeout_s=15)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("malformed")
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    reasons = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert reasons == {forged.key: "malformed"}
    assert await alice.store.hgetall(1, keys.job(VICTIM, int(before["id"]))) == before
    assert not await alice.store.exists(1, keys.job(VICTIM, base.job[0].id))  # no squatting
    assert not marker.exists()


async def test_message_reusing_a_finished_job_id_is_refused_whole(node_factory, tmp_path):
    """A validly signed message naming a job key another message materialised is refused at
    materialisation (atomically, in the Lua): the finished job keeps its script, message and
    result, and nothing of the new message runs."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    before = await finished_job_of(alice, actor, 1)
    marker = Ran(tmp_path)
    base = job_message(actor, 1, alice.node_id, alice.node_id, marker_script(marker))
    reuse = resigned(base, actor, id=int(before["id"]))
    await push_in(alice, reuse, queue=keys.MSG_OUT)
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(reuse, timeout_s=15)
    assert result.reason.startswith("job_exists")
    assert before["message_key"] in result.reason
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    assert await alice.store.hgetall(1, reuse.job[0].key) == before
    assert not marker.exists()
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == (reuse.key, "job_exists")


def _write(message: Message, job_key: str) -> JobWrite:
    return JobWrite(job_key, "queue:python", {"script": "x", "message_key": message.key})


async def test_materialise_refuses_a_message_naming_another_messages_job(store: Store):
    """In one batch: the first message takes job key K; the second names a fresh key and K:
    it is refused whole (its fresh job is not written either, nor queued, nor acknowledged)."""
    actor = KeyPair.generate()
    first = job_message(actor, 1, "a" * 64, "a" * 64, "print(1)")
    second = job_message(actor, 1, "a" * 64, "a" * 64, "print(2)")
    taken, fresh = keys.job(1, new_id()), keys.job(1, new_id())
    await store.lpush(1, "inflight", first.key)
    await store.lpush(1, "inflight", second.key)
    batch = [
        (first, [_write(first, taken)]),
        (second, [_write(second, fresh), _write(second, taken)]),
    ]
    codes, _, owners = await materialise_batch(
        store, 1, "inflight", batch, now=now(), window_s=60, depth_of=[]
    )
    assert codes == [0, 3]
    assert owners == ["", f"{taken} {first.key}"]
    assert (await store.hgetall(1, taken))["message_key"] == first.key
    assert not await store.exists(1, fresh)
    assert await store.call(1, lambda r: r.hget(keys.REPLAY, keys.seen(second.key))) is None
    assert await store.call(1, lambda r: r.lrange("queue:python", 0, -1)) == [taken]
    assert await store.call(1, lambda r: r.lrange("inflight", 0, -1)) == [second.key]


# -- item 2: sizes ------------------------------------------------------------------------------


async def test_oversize_script_is_refused_locally(node_factory, tmp_path):
    """The default max_script_bytes (1 MiB) holds on the local path too (links were the only
    bound: a 4 MiB frame)."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    marker = Ran(tmp_path)
    big = marker_script(marker) + "\n#" + "x" * (1024 * 1024 + 1)
    msg = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script=big
    )
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.reason.startswith("oversize")
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == (msg.key, "oversize")
    assert not marker.exists()


async def test_oversize_message_is_refused_on_both_paths(node_factory, tmp_path):
    """max_message_bytes bounds the whole message (here its env): refused by the supervisor
    of its origin, and by the link of a destination whose limit is lower (nacked oversize)."""
    alice = await node_factory("alice", max_message_bytes=100_000)
    bob = await node_factory("bob", max_message_bytes=20_000)
    actor = await link_to(alice, bob)
    marker = Ran(tmp_path)
    for to, limit in ((alice.node_id, "100000"), ("bob", "20000")):
        msg = await alice.client.submit_job(
            actor,
            1,
            to=to,
            context_id=1,
            script_type="python",
            script=marker_script(marker),
            env_vars={"PAD": "x" * (30_000 if to == "bob" else 150_000)},
        )
        with trio.fail_after(20):
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        assert result.status is JobStatus.ERROR
        assert "oversize" in result.reason
        assert limit in result.reason
    assert not marker.exists()


async def test_the_size_judged_is_the_hash_as_stored(node_factory, tmp_path):
    """A message hash padded with fields no message has is as large as it is stored: refused
    oversize from either queue, though the message parsed from it is small."""
    alice = await node_factory("alice", max_message_bytes=20_000)
    actor = read_key_file(alice.config.actor_key_path)
    marker = Ran(tmp_path)
    padded = []
    for queue in (keys.MSG_OUT, keys.MSG_IN):
        msg = job_message(actor, 1, alice.node_id, alice.node_id, marker_script(marker))
        async with alice.store.transaction(1) as tx:
            tx.hset(msg.key, msg.to_hash() | {"padding": "x" * 30_000})
            tx.lpush(queue, [msg.key])
        padded.append(msg.key)
        if queue == keys.MSG_OUT:  # its sender is told
            with trio.fail_after(15):
                [result] = await alice.client.wait_results(msg, timeout_s=15)
            assert result.status is JobStatus.ERROR
            assert result.reason.startswith("oversize")
        else:  # a good message behind it ran: it was judged
            assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    reasons = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert reasons == dict.fromkeys(padded, "oversize")
    assert not marker.exists()


# -- item 5: the signed ack deadline ------------------------------------------------------------


def test_ack_deadline_is_created_at_plus_timeout_ack():
    actor = KeyPair.generate()
    msg = replace(job_message(actor, 1, "a" * 64, "b" * 64, "print(1)"), timeout_ack=30)
    check_ack_deadline(msg, msg.created_at + 30)  # on the deadline: still accepted
    with pytest.raises(Rejected) as refused:
        check_ack_deadline(msg, msg.created_at + 31)
    assert refused.value.reason == "expired"
    config = NodeConfig(home=Path("/nonexistent"))
    fields = msg.to_hash()
    assert delivery_problem(fields, config, msg.created_at + 30) is None
    late = delivery_problem(fields, config, msg.created_at + 31)
    assert late is not None
    assert late.reason == "expired"
    result_like = fields | {"message_type": "result"}  # no deadline of its origin
    assert delivery_problem(result_like, config, msg.created_at + 3600) is None


async def test_consumer_refuses_a_job_message_taken_after_its_deadline(node_factory, tmp_path):
    """A peer's job message that waited in msg_in past created_at + timeout_ack is refused
    (expired) and does not run, though it is fresh and validly signed."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    marker = Ran(tmp_path)
    peer = KeyPair.generate().public_hex
    late = job_message(actor, 1, peer, alice.node_id, marker_script(marker))
    late = sign_message(replace(late, created_at=now() - 40, timeout_ack=30, signatures=[]), actor)
    await push_in(alice, late)
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == (late.key, "expired")
    assert not marker.exists()


async def test_destination_nacks_a_job_message_received_after_its_deadline(node_factory, tmp_path):
    """What a frozen peer reads off its socket after the deadline is refused on arrival: the
    origin's client is told (peer_refused_expired) and nothing runs at the destination."""
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    marker = Ran(tmp_path)
    late = job_message(actor, 1, alice.node_id, bob.node_id, marker_script(marker))
    late = sign_message(replace(late, created_at=now() - 40, timeout_ack=30, signatures=[]), actor)
    await push_in(alice, late, queue=keys.MSG_OUT)
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(late, timeout_s=20)
    assert result.reason.startswith("peer_refused_expired")
    [refused] = await bob.store.dead_letters(keys.ACTORS_DB)
    assert (refused["key"], refused["reason"]) == (late.key, "refused_delivery")
    assert not await bob.store.exists(1, late.key)
    assert not marker.exists()


@pytest.fixture
def clock() -> Iterator[list[float]]:
    """The wall clock of bus.core.ids, set by the test: ``clock[0]`` is now."""
    fake = [float(now())]
    previous = set_clock(lambda: fake[0])
    yield fake
    set_clock(previous)


async def _sent_to_a_peer(store, tmp_path, clock, *, skew_s: int):
    """A node (``max_skew_s`` = ``skew_s``), a peer's id, and a job message signed now
    (``clock``) with timeout_ack 30, stored at the origin with its job copy and its deadlines
    armed, as the supervisor leaves a message it sent to that peer."""
    config = NodeConfig(home=tmp_path, max_skew_s=skew_s)
    node = NodeState(config, KeyPair.generate(), store)
    peer = KeyPair.generate().public_hex
    actor = KeyPair.generate()
    msg = job_message(actor, 1, node.identity.node_id, peer, "print(1)")
    msg = sign_message(replace(msg, created_at=int(clock[0]), timeout_ack=30, signatures=[]), actor)
    async with store.transaction(1) as tx:
        tx.hset(msg.key, msg.to_hash())
        tx.hset(msg.job[0].key, msg.job[0].to_hash() | {"message_key": msg.key})
        tx.zadd(keys.DEADLINES, deadline_members(msg.key, *deadline_times(msg, config.max_skew_s)))
    return node, peer, msg


async def test_origin_fails_only_after_deadline_plus_skew_and_withdraws(store, tmp_path, clock):
    """The origin's ack deadline is the signed one plus max_skew_s; when it passes, the entry
    leaves the outbox and its in-flight list (one transaction) and the client is told."""
    node, peer, msg = await _sent_to_a_peer(store, tmp_path, clock, skew_s=60)
    entry = keys.outbox_entry(1, msg.key)
    await store.lpush(keys.ACTORS_DB, keys.outbox(peer), entry)
    await store.lpush(keys.ACTORS_DB, keys.outbox_inflight(peer), entry)

    clock[0] = msg.created_at + 30 + 59  # past the signed deadline, within the skew
    assert await fail_due(node, 1) == (msg.created_at + 90) * 1000
    assert (await store.hgetall(1, msg.key))["status"] == "dispatched"

    clock[0] = msg.created_at + 91
    await fail_due(node, 1)
    fields = await store.hgetall(1, msg.key)
    assert (fields["status"], fields["reason"][:11]) == ("error", "timeout_ack")
    for listed in (keys.outbox(peer), keys.outbox_inflight(peer)):
        assert await store.call(keys.ACTORS_DB, lambda r, k=listed: r.lrange(k, 0, -1)) == []
    reply = await store.call(1, lambda r: r.lrange(keys.reply(msg.key), 0, -1))
    assert json.loads(reply[0])["reason"].startswith("timeout_ack")
    assert (await store.hgetall(1, msg.job[0].key))["status"] == "error"


class HeldLink:
    """A TCP proxy between two nodes whose forward direction can be held: what the origin
    sends waits unread, as on the socket of a frozen peer, until released."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.url = ""
        self.gate = trio.Event()
        self.gate.set()

    def hold(self) -> None:
        self.gate = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"ws://127.0.0.1:{listener.socket.getsockname()[1]}"
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, [listener])
            task_status.started()

    async def _handle(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, True, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, False, nursery.cancel_scope)

    async def _pump(
        self, src: trio.SocketStream, dst: trio.SocketStream, gated: bool, both: trio.CancelScope
    ) -> None:
        try:
            async for chunk in src:
                if gated:
                    await self.gate.wait()
                await dst.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


async def test_told_failed_never_runs_on_a_frozen_peer(node_factory, nursery, tmp_path):
    """Frames sent to a peer that reads them only after the origin declared timeout_ack are
    refused there (expired): the client was told failed, and the job never runs."""
    alice = await node_factory("alice", max_skew_s=1)
    bob = await node_factory("bob")
    link = HeldLink(int(bob.info.ws_url.rsplit(":", 1)[1]))
    await nursery.start(link.serve)
    actor = read_key_file(alice.config.actor_key_path)
    await alice.client.add_peer(bob.node_id, link.url, name="bob")  # through the proxy
    await bob.client.add_peer(alice.node_id, "", name="alice")
    await bob.client.register_actor(1, actor.public_hex)
    await bob.client.register_context(1, admins=[2], executors=[1])
    warm = await alice.client.submit_job(
        actor, 1, to="bob", context_id=1, script_type="python", script="print(1)"
    )
    with trio.fail_after(20):
        await alice.client.wait_results(warm, timeout_s=20)
    link.hold()
    marker = Ran(tmp_path)
    msg = await alice.client.submit_job(
        actor,
        1,
        to="bob",
        context_id=1,
        script_type="python",
        script=marker_script(marker),
        timeout_ack_s=2,
    )
    with trio.fail_after(20):
        [told] = await alice.client.wait_results(msg, timeout_s=20)
    assert told.reason.startswith("timeout_ack")
    link.gate.set()
    probe = await alice.client.submit_job(  # same connection: read after the held frames
        actor, 1, to="bob", context_id=1, script_type="python", script="print('after')"
    )
    with trio.fail_after(20):
        [after] = await alice.client.wait_results(probe, timeout_s=20)
    assert after.stdout == "after\n"
    refused = [(e["key"], e["reason"]) for e in await bob.store.dead_letters(keys.ACTORS_DB)]
    assert refused == [(msg.key, "refused_delivery")]
    assert not await bob.store.exists(1, msg.key)
    assert not marker.exists()


async def test_a_hostile_deadline_member_costs_the_others_nothing(store, tmp_path, clock):
    """Due deadline members are popped together: one naming a key of another type is
    dead-lettered alone and the message due with it still fails on time."""
    node, _peer, msg = await _sent_to_a_peer(store, tmp_path, clock, skew_s=0)
    async with store.transaction(1) as tx:
        tx.lpush("message:9:9", ["not a hash"])
        tx.zadd(keys.DEADLINES, {"ack|message:9:9": 0})
    clock[0] = msg.created_at + 31
    await fail_due(node, 1)
    assert (await store.hgetall(1, msg.key))["status"] == "error"
    [dead] = await store.dead_letters(1)
    assert (dead["key"], dead["reason"]) == ("message:9:9", "wrong_type")


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=6))
def test_the_stored_size_counts_each_value_as_its_own_encode_would(fields):
    """stored_size encodes the values joined, in one call: the count is what encoding each
    value alone gives (lone surrogates, which cannot be encoded, count one byte each)."""
    one_by_one = sum(len(k) + len(v.encode("utf-8", "replace")) for k, v in fields.items())
    assert stored_size(fields) == one_by_one
