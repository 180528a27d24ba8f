"""End to end over real Valkey servers and a real websocket link between two nodes."""

from __future__ import annotations

import trio

from bus.core import keys
from bus.core.models import JobStatus
from crypto import read_key_file
from tests.nodes import link_to


async def test_local_job_round_trip(node_factory):
    alice = await node_factory("alice")
    key = read_key_file(alice.config.actor_key_path)
    with trio.fail_after(20):
        msg = await alice.client.submit_job(
            key, 1, to=alice.node_id, context_id=1, script_type="python", script="print(6*7)"
        )
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.FINISHED
    assert result.stdout == "42\n"
    job = await alice.store.hgetall(1, result.job_key)
    assert job["status"] == "finished"


async def test_cross_node_round_trip(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    # alice's actor is known to bob as actor 101
    actor = await link_to(alice, bob)
    with trio.fail_after(30):
        msg = await alice.client.submit_job(
            actor,
            1,
            to=bob.node_id,
            context_id=1,
            script_type="sh",
            script='echo "on $(hostname) $X"',
            env_vars={"X": "bob"},
        )
        [result] = await alice.client.wait_results(msg, timeout_s=25)
    assert result.ok, result
    assert result.stdout.strip().endswith("bob")
    # the job ran at bob, and alice's copy of the job and message are final
    assert (await bob.store.hgetall(1, result.job_key))["status"] == "finished"
    assert (await alice.store.hgetall(1, result.job_key))["status"] == "finished"
    assert (await alice.store.hgetall(1, msg.key))["status"] == "processed"
    assert await alice.store.llen(0, keys.outbox_inflight(bob.node_id)) == 0


async def test_cross_node_over_tls(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")  # TLS is the default
    assert bob.info.ws_url.startswith("wss://")
    actor = await link_to(alice, bob)
    with trio.fail_after(30):
        msg = await alice.client.submit_job(
            actor, 1, to="bob", context_id=1, script_type="python", script="print('sealed')"
        )
        [result] = await alice.client.wait_results(msg, timeout_s=25)
    assert result.stdout == "sealed\n"
    assert (bob.config.home / "tls.key").stat().st_mode & 0o077 == 0


async def test_a_busy_link_in_both_directions_does_not_deadlock(node_factory):
    """Jobs one way and results the other way on one link, hundreds in flight: each side's
    reader must keep reading while its acks wait to be written (regression: both readers once
    blocked sending acks to each other and the link stalled)."""
    alice = await node_factory("alice")
    bob = await node_factory("bob", runners={"python": 4})
    actor = await link_to(alice, bob)
    msgs = [
        await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
        )
        for _ in range(400)
    ]
    with trio.fail_after(120):
        for msg in msgs:
            [result] = await alice.client.wait_results(msg, timeout_s=120)
            assert result.ok
