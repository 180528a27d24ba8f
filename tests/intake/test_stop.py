"""Stopping jobs with a signed request: running, queued, across nodes, and by whom."""

from __future__ import annotations

import trio

from bus.core.models import JobStatus
from crypto import KeyPair, read_key_file
from tests.nodes import link_to
from tests.scripts import announcing, wait_announced

LONG = "import time\ntime.sleep(60)\nprint('not stopped')\n"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_stop_a_running_job(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit_job(
        actor,
        1,
        to=alice.node_id,
        context_id=1,
        script_type="python",
        script=announcing(alice.info.redis_url, "run:a", LONG),
    )
    pid = await wait_announced(alice.store, "run:a")
    await alice.client.stop_job(actor, 1, msg.job[0].key, 1)
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.status is JobStatus.ERROR
    assert result.reason == "stopped: by actor 1"
    assert not alive(pid)


async def test_stop_a_queued_job_and_only_by_caller_or_admin(node_factory):
    alice = await node_factory("alice", runners={"python": 1})
    actor = read_key_file(alice.config.actor_key_path)
    busy = await alice.client.submit_job(
        actor,
        1,
        to=alice.node_id,
        context_id=1,
        script_type="python",
        script=announcing(alice.info.redis_url, "run:b", LONG),
    )
    await wait_announced(alice.store, "run:b")
    queued = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script="print('never')"
    )
    other = KeyPair.generate()  # an executor of the context, but not the caller nor an admin
    await alice.client.register_actor(9, other.public_hex)
    await alice.client.register_context(1, admins=[1], executors=[9])
    await alice.client.stop_job(other, 9, queued.job[0].key, 1)
    await alice.client.stop_job(actor, 1, queued.job[0].key, 1)
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(queued, timeout_s=20)
    assert result.reason == "stopped: by actor 1"
    reasons = [e["reason"] for e in await alice.store.dead_letters(1)]
    assert reasons == ["permission_denied"]
    assert (await alice.store.hgetall(1, busy.job[0].key))["status"] == "started"
    await alice.client.stop_job(actor, 1, busy.job[0].key, 1)
    with trio.fail_after(20):
        [first] = await alice.client.wait_results(busy, timeout_s=20)
    assert first.reason.startswith("stopped")


async def test_stop_reaches_the_node_that_runs_the_job(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    msg = await alice.client.submit_job(
        actor,
        1,
        to=bob.node_id,
        context_id=1,
        script_type="python",
        script=announcing(bob.info.redis_url, "run:c", LONG),
    )
    pid = await wait_announced(bob.store, "run:c")
    await alice.client.stop_job(actor, 1, msg.job[0].key, 1)
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.reason == "stopped: by actor 1"
    assert (await bob.store.hgetall(1, msg.job[0].key))["status"] == "error"
    assert not alive(pid)
