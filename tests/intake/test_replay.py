"""Replay and freshness: a captured valid message is refused, so are stale and future ones."""

from __future__ import annotations

from dataclasses import replace

import trio

from bus.core import keys
from bus.core.envelope import sign_message
from bus.core.ids import new_id, now
from bus.core.models import JobStatus, Message
from bus.core.verify import Freshness, freshness_problem
from bus.store.atomic import routing
from crypto import read_key_file
from tests.intake.test_rejections import job_message, push_in, run_and_wait
from tests.nodes import link_to, until_read
from tests.scripts import work_file


def test_freshness_window_is_pure_arithmetic():
    msg = Message(1, 1, 1, created_at=1000, origin="a", destination="b")
    f = Freshness(max_age_s=300, max_skew_s=60)
    assert freshness_problem(msg, 1300, f) is None
    assert freshness_problem(msg, 1301, f).reason == "expired"
    assert freshness_problem(msg, 940, f) is None
    assert freshness_problem(msg, 939, f).reason == "from_future"
    assert f.window_s > f.max_age_s + f.max_skew_s


async def test_captured_message_replayed_is_refused(node_factory, tmp_path):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    runs = work_file(bob, "runs")  # a sandboxed job writes its work dir only
    script = f"open({runs.name!r}, 'a').write('run\\n')"
    msg = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script=script
    )
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.ok
    captured = await bob.store.hgetall(1, msg.key)  # what an eavesdropper on bob's Redis saw
    # 1. pushed again onto bob's msg_in
    await bob.store.lpush(1, keys.MSG_IN, msg.key)
    await sync(alice, bob, actor)
    # 2. delivered again over the authenticated link, after the hash was cleaned up at bob
    await bob.store.call(1, lambda r: r.delete([msg.key]))
    await routing.push_outboxes(alice.store, {bob.node_id: [keys.outbox_entry(1, msg.key)]})
    # 3. the same content under a fresh key (new id) is a new message: signature breaks
    await push_in(bob, replace(Message.from_hash(captured), id=new_id()))
    await sync(alice, bob, actor)
    entries = await dead_letters(bob, 3)
    assert [e["reason"] for e in entries if e["key"] == msg.key] == ["replay", "replay"]
    assert [e["reason"] for e in entries if e["key"] != msg.key] == ["bad_signature"]
    assert runs.read_text() == "run\n"  # executed exactly once
    assert (await alice.store.hgetall(1, msg.job[0].key))["status"] == "finished"
    assert await alice.store.dead_letters(1) == []
    assert (await bob.store.hgetall(1, msg.key))["status"] != "error"


async def dead_letters(node, n: int) -> list[dict[str, str]]:
    """Context 1's dead letters once there are ``n``. A replay is found by the batch's
    materialise script and dead-lettered after it returns, while the batch's good jobs may
    already run and answer: a result behind the replay does not prove its entry is written."""
    await until_read(lambda: _at_least(node, n), 10)
    return await node.store.dead_letters(1)


async def _at_least(node, n: int) -> bool:
    return len(await node.store.dead_letters(1)) >= n


async def sync(alice, bob, actor) -> None:
    """A fresh job from alice to bob comes back only after bob handled everything before it."""
    follow = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print('after')"
    )
    with trio.fail_after(20):
        [after] = await alice.client.wait_results(follow, timeout_s=20)
    assert after.stdout == "after\n"


async def test_nonce_reuse_is_a_replay(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    first = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    second = sign_message(replace(first, id=new_id(), signatures=[]), actor)  # same nonce
    await push_in(alice, first)
    await push_in(alice, second)
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    [entry] = await dead_letters(alice, 1)
    assert entry["key"] == second.key
    assert entry["reason"] == "replay"
    assert "nonce" in entry["detail"]


async def test_stale_and_future_messages_are_refused(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    base = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    old = sign_message(replace(base, created_at=now() - 301 - 5, signatures=[]), actor)
    ahead = sign_message(
        replace(base, id=new_id(), nonce="ab" * 16, created_at=now() + 600, signatures=[]), actor
    )
    await push_in(alice, old, queue=keys.MSG_OUT)  # the supervisor refuses it at the origin
    await push_in(alice, ahead)  # the consumer refuses it at the destination
    with trio.fail_after(20):
        [stale] = await alice.client.wait_results(old, timeout_s=20)
        [future] = await alice.client.wait_results(ahead, timeout_s=20)
    assert stale.status is JobStatus.ERROR
    assert stale.reason.startswith("expired")
    assert future.reason.startswith("from_future")
    reasons = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert reasons == {old.key: "expired", ahead.key: "from_future"}


async def test_the_same_message_twice_in_one_pop_runs_once(node_factory, tmp_path):
    """Both copies are popped together (msg_out and msg_in): the replay check and the writes
    are one atomic step per batch, so the second copy is refused, not materialised again."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    runs = work_file(alice, "runs")  # a sandboxed job writes its work dir only
    script = f"open({runs.name!r}, 'a').write('run\\n')"
    for queue in (keys.MSG_OUT, keys.MSG_IN):
        msg = job_message(actor, 1, alice.node_id, alice.node_id, script)
        async with alice.store.transaction(1) as tx:
            tx.hset(msg.key, msg.to_hash())
            tx.lpush(queue, [msg.key, msg.key])
        assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
        with trio.fail_after(20):
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        assert result.ok
        entries = [e for e in await alice.store.dead_letters(1) if e["key"] == msg.key]
        assert [e["reason"] for e in entries] == ["replay"]
    assert runs.read_text() == "run\nrun\n"  # each message ran exactly once
