"""timeout_ack and timeout_result: the origin gives up on a silent peer and says why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from bus.client.api import new_job
from bus.core import keys
from bus.core.frames import MAX_BATCH
from bus.core.ids import now, now_ms
from bus.core.models import JobStatus, Message
from bus.core.submission import job_messages
from bus.store import records
from bus.store.atomic import routing
from bus.store.connection import open_store
from bus.wire.transport import Link
from crypto import KeyPair, read_key_file
from node.intake import deadlines
from node.links import frames
from node.links.frames import delivery_fields
from node.state import OwedAcks, WakeUps
from tests.faults_proxy import TcpProxy
from tests.nodes import link_to, tick
from tests.scripts import announcing, wait_announced


async def test_a_deadline_armed_later_than_the_next_look_wakes_nothing(
    monkeypatch: pytest.MonkeyPatch, mock_clock, wall_clock_on_trio
):
    """The deadline service looks (a round trip to the store) at the next deadline its last
    look found, or at an earlier one armed meanwhile; one armed for later wakes nothing."""
    node = SimpleNamespace(wakeups=WakeUps())
    looks: list[int] = []

    async def look(_node: object, _ctx: int) -> int:
        looks.append(now_ms())
        return now_ms() + 10_000  # the next deadline in the store

    monkeypatch.setattr(deadlines, "fail_due", look)
    async with trio.open_nursery() as nursery:
        await nursery.start(deadlines.run_deadlines, node, 1)
        await trio.testing.wait_all_tasks_blocked()
        [start] = looks
        node.wakeups.deadline_armed(1, start + 20_000)  # after the one found: no look for it
        await trio.sleep(5)
        assert looks == [start]
        node.wakeups.deadline_armed(1, start + 7_000)  # before it: looked at when due
        await trio.sleep(4)
        assert len(looks) == 2
        assert abs(looks[1] - (start + 7_000)) <= 1
        nursery.cancel_scope.cancel()


async def test_unreachable_peer_times_out_the_ack(node_factory, mock_clock, wall_clock_on_trio):
    alice = await node_factory("alice", max_skew_s=1)  # the ack fails at created_at + 1 + 1
    ghost = KeyPair.generate()  # a known peer that never comes up
    await alice.client.add_peer(ghost.public_hex, "ws://127.0.0.1:9", name="ghost")
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit_job(
        actor, 1, to="ghost", context_id=1, script_type="sh", script="true", timeout_ack_s=1
    )
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("timeout_ack")
    assert (await alice.store.hgetall(1, msg.key))["status"] == "error"


async def test_slow_answer_times_out_the_result_and_a_late_one_is_refused(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob", runners={"python": 1})  # one slot: bob answers in order
    actor = await link_to(alice, bob)
    script = announcing(bob.info.redis_url, "slow", "import time\ntime.sleep(3)\n")
    msg = await alice.client.submit_job(
        actor, 1, to="bob", context_id=1, script_type="python", script=script, timeout_result_s=1
    )
    await wait_announced(bob.store, "slow")
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.reason.startswith("timeout_result")
    # bob finishes anyway; alice refuses the late answer and keeps the timeout
    follow = await alice.client.submit_job(
        actor, 1, to="bob", context_id=1, script_type="python", script="print(1)"
    )
    with trio.fail_after(20):
        await alice.client.wait_results(follow, timeout_s=20)  # after bob's slow job, in order
        while not any(e["reason"] == "late_result" for e in await alice.store.dead_letters(1)):
            await alice.store.call(1, lambda r: r.blpop(["never"], timeout=0.2))  # bounded wait
    assert (await alice.store.hgetall(1, msg.job[0].key))["status"] == "error"


async def test_a_message_stored_before_a_crash_runs_only_once_acknowledged(node_factory, nursery):
    """carol stored two job messages from alice and was killed before her acks left (each
    written as her link writes it, by a boot that is gone). Restarted while her link to alice
    is down, she runs neither: the one whose ack deadline passes meanwhile is refused as
    expired, never run (alice tells its client it failed); the other runs once her new link
    has acknowledged it. Without the hold, both run at once, unacknowledged: alice, hearing
    of them only when she sends them again, may have told their clients they failed."""
    alice, carol, proxy, actor = await _carol_stopped_behind_a_cut_link(node_factory, nursery)

    async def submit(timeout_ack_s: int) -> Message:
        return await alice.client.submit_job(
            actor, 1, to="carol", context_id=1, script_type="sh", script="true",
            timeout_ack_s=timeout_ack_s,
        )  # fmt: skip

    kept, late = await submit(120), await submit(6)
    sent = [(m.key, await alice.store.hgetall(1, m.key)) for m in (kept, late)]
    await _stored_by_a_gone_boot(carol, alice.node_id, sent)
    carol = await node_factory("carol", again=carol)
    inflight = keys.inflight("consumer")
    with trio.fail_after(20):  # the consumer has taken both
        while await carol.store.llen(1, keys.MSG_IN) or await carol.store.llen(1, inflight):
            await tick(carol.store)
    held = [key for _, key, _ in await routing.held(carol.store, 1)]
    assert kept.key in held
    assert not await carol.store.exists(1, kept.job[0].key)  # not materialised: not run
    status = await carol.client.delivery_status(1, kept.key)  # hero-node msg status
    assert status is not None
    assert status["state"].startswith("held")

    with trio.fail_after(20):  # late's deadline passes with no link: refused, never run
        while not any(
            e["key"] == late.key and e["reason"] == "expired"
            for e in await carol.store.dead_letters(1)
        ):
            await tick(carol.store)
    assert not await carol.store.exists(1, late.job[0].key)

    await proxy.restore()  # the link comes up: acknowledged, then run, once
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(kept, timeout_s=30)
    assert result.status is JobStatus.FINISHED
    assert (await carol.store.hgetall(1, kept.job[0].key))["attempt"] == "1"
    assert await routing.held(carol.store, 1) == []
    assert (await alice.store.hgetall(1, kept.key)).get("acked_at")


async def test_held_messages_are_acknowledged_in_frames_the_peer_accepts(node_factory, nursery):
    """More messages held for one peer than an acks frame may carry (MAX_BATCH), all held
    before the link comes up: carol's restarted boot acknowledges them all, in frames alice
    accepts (none is a bad frame)."""
    alice, carol, proxy, actor = await _carol_stopped_behind_a_cut_link(node_factory, nursery)
    count = MAX_BATCH + 44
    messages = job_messages(
        actor,
        alice.config.actor_id,
        origin=alice.node_id,
        to=carol.node_id,
        context_id=1,
        jobs=[new_job(alice.config.actor_id, 1, "sh", "true") for _ in range(count)],
        timeout_s=60,
        timeout_ack_s=120,
        timeout_result_s=600,
        reply_to="",
    )
    await _stored_by_a_gone_boot(carol, alice.node_id, [(m.key, m.to_hash()) for m in messages])
    carol = await node_factory("carol", again=carol)
    with trio.fail_after(30):  # all held before the link comes up
        while len(await routing.held(carol.store, 1)) < count:
            await tick(carol.store)
    counters = alice.info.state.counters.metrics
    await proxy.restore()
    with trio.fail_after(30):  # every ack alice took, or a frame she refused
        while counters.get("acks_received", 0) < count and not counters.get("bad_frames"):
            await tick(alice.store)
    assert counters.get("bad_frames", 0) == 0
    assert counters["acks_received"] >= count


async def test_a_message_whose_ack_never_left_runs_only_once_acknowledged(node_factory, nursery):
    """carol's link stored a job message from alice and queued it, then ended before its
    writer wrote the ack (a kill there, a link lost). Her consumer, in the same boot, must not
    run it: alice never heard of it and tells its client ``timeout_ack`` at the deadline. It
    is held until a link acknowledges it, then runs once. Without the owed ack, carol's
    consumer runs it at once, acknowledged in this boot as far as the store says."""
    alice, carol, proxy, actor = await _carol_stopped_behind_a_cut_link(node_factory, nursery)
    carol = await node_factory("carol", again=carol)
    message = await alice.client.submit_job(
        actor, 1, to="carol", context_id=1, script_type="sh", script="true"
    )
    state = carol.info.state
    ack = {"ctx": 1, "key": message.key}
    state.pressure.inbound.owed.owe(1, [message.key])  # as carol's link did before storing
    extra = delivery_fields(alice.node_id, state.identity.boot, now())
    await routing.deliver(carol.store, 1, [(message.key, {**message.to_hash(), **extra})])
    with trio.fail_after(20):  # popped by the consumer, which waits for its ack's fate
        while await carol.store.llen(1, keys.MSG_IN):
            await tick(carol.store)
    await tick(carol.store)
    assert not await carol.store.exists(1, message.job[0].key)  # not run while its ack is owed
    state.pressure.inbound.owed.settle([ack], written=False)  # the link ended first
    with trio.fail_after(20):
        while message.key not in [key for _, key, _ in await routing.held(carol.store, 1)]:
            await tick(carol.store)
    assert not await carol.store.exists(1, message.job[0].key)  # not materialised: not run

    await proxy.restore()  # a link comes up: acknowledged, then run, once
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(message, timeout_s=30)
    assert result.status is JobStatus.FINISHED
    assert (await carol.store.hgetall(1, message.job[0].key))["attempt"] == "1"
    assert (await alice.store.hgetall(1, message.key)).get("acked_at")


def test_a_link_says_which_acks_it_never_wrote():
    """The acks still posted when a link ends are reported unwritten, once."""
    told: list[tuple[list[dict[str, object]], bool]] = []
    never_written = SimpleNamespace(is_client=True)
    link = Link("ab" * 32, never_written, initiator=True)  # type: ignore[arg-type]
    link.acks_out = lambda acks, written: told.append((list(acks), written))
    link.post_answers([{"ctx": 1, "key": "message:1:2"}], [{"ctx": 1, "key": "message:1:3"}])
    link.unwritten()
    link.unwritten()
    assert told == [([{"ctx": 1, "key": "message:1:2"}], False)]


async def _carol_stopped_behind_a_cut_link(node_factory, nursery):  # noqa: ANN001, ANN202
    """alice, and carol who dials alice through a TCP proxy and runs alice's actor's jobs;
    carol stopped and the proxy cut. Returns (alice, carol, proxy, alice's actor key)."""
    alice = await node_factory("alice")
    carol = await node_factory("carol")
    proxy = TcpProxy(int(alice.info.ws_url.rsplit(":", 1)[1]))
    await nursery.start(proxy.run)
    actor = read_key_file(alice.config.actor_key_path)
    await alice.client.add_peer(carol.node_id, "", name="carol")
    await carol.client.add_peer(alice.node_id, proxy.url, name="alice")
    await carol.client.register_actor(alice.config.actor_id, actor.public_hex)
    await carol.client.register_context(1, admins=[2], executors=[alice.config.actor_id])
    await carol.stopped()
    await proxy.cut()
    return alice, carol, proxy, actor


async def _stored_by_a_gone_boot(carol, peer: str, messages) -> None:  # noqa: ANN001
    """Store (message key, hash) ``messages`` in (stopped) carol's context 1 as her link stores
    what ``peer`` sends, by a boot of hers that is gone: as if she died before acking them."""
    extra = delivery_fields(peer, "a boot that is gone", now())
    async with open_store(carol.info.redis_url) as store:
        await routing.deliver(store, 1, [(key, {**fields, **extra}) for key, fields in messages])


class _Died(Exception):
    """The node killed right after one step of applying a peer's acks."""


@pytest.mark.parametrize("killed_after", ["mark_acked", "remove_outbox_inflight"])
async def test_a_node_killed_applying_acks_keeps_no_entry_it_would_fail(
    store, monkeypatch: pytest.MonkeyPatch, killed_after: str
):
    """Applying a peer's acks takes two round trips: the messages marked acknowledged, their
    entries taken off the outbox's in-flight list. A node killed between them must not keep
    a message unacknowledged whose entry is gone: nothing would send it again for a second
    ack, and its deadline service would tell its client ``timeout_ack`` while the peer runs
    it (told failed, but ran). So the ack is recorded first, and the entry left is sent again
    after the restart (the peer acks a message it stored once more)."""
    ctx, peer, key = 1, "ab" * 32, "message:5:7"
    await store.hset(ctx, key, {"destination": peer, "status": "dispatched"})
    await store.call(
        0, lambda r: r.rpush(keys.outbox_inflight(peer), [keys.outbox_entry(ctx, key)])
    )
    module = routing if killed_after == "mark_acked" else records
    step = getattr(module, killed_after)

    async def then_die(*args, **kwargs):
        await step(*args, **kwargs)
        raise _Died

    monkeypatch.setattr(module, killed_after, then_die)
    node = SimpleNamespace(
        store=store,
        config=SimpleNamespace(valkey_databases=16),
        counters=SimpleNamespace(count=lambda *_: None),
    )
    link = SimpleNamespace(peer_id=peer, window=SimpleNamespace(release=lambda _n: None))
    with pytest.raises(_Died):
        await frames.LinkHandler(node, {ctx}).on_frame(  # type: ignore[arg-type]
            link,  # type: ignore[arg-type]
            frames.Frame("acks", {"acks": [{"ctx": ctx, "key": key}], "nacks": []}),
        )
    status = (await store.hgetall(ctx, key))["status"]
    left = await store.lrange(0, keys.outbox_inflight(peer))
    assert status == "acknowledged" or left == [keys.outbox_entry(ctx, key)], (status, left)


async def test_an_ack_not_written_in_its_grace_holds_its_message_and_no_other(autojump_clock):
    """A peer that stops reading blocks its link's writer, and so the acks it is owed: the
    consumer waits at most ``grace_s`` from when they were owed (then it holds the message),
    once for all of them, not once per message; an ack written in time says so."""
    owed = OwedAcks(grace_s=2.0)
    owed.owe(1, [f"message:1:{n}" for n in range(100)])
    owed.owe(1, ["message:1:written"])
    owed.settle([{"ctx": 1, "key": "message:1:written"}], written=True)
    start = trio.current_time()
    assert await owed.written(1, "message:1:written")
    assert [await owed.written(1, f"message:1:{n}") for n in range(100)] == [False] * 100
    assert trio.current_time() - start == pytest.approx(2.0)
    owed.owe(1, ["message:1:0"])  # owed again (released from msg_held): a new grace
    await trio.sleep(1.0)
    owed.settle([{"ctx": 1, "key": "message:1:0"}], written=True)
    assert await owed.written(1, "message:1:0")
    assert await owed.written(1, "message:1:never-owed")
