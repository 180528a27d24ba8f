"""timeout_ack and timeout_result: the origin gives up on a silent peer and says why."""

from __future__ import annotations

import trio

from bus.core.models import JobStatus
from crypto import KeyPair, read_key_file
from tests.nodes import link_to
from tests.scripts import announcing, wait_announced


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
