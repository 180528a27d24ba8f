"""Targeted queues and priorities: naming, consume order with aging, signing compatibility,
and the reliable multi-list pop."""

from __future__ import annotations

import trio

from bus.core.envelope import sign_message, verify_message
from bus.core.models import Message, RunnerJob
from bus.core.queues import (
    AGING_EVERY,
    consume_order,
    slot_bases,
    target_queue,
)
from crypto import KeyPair


def job(**kw) -> RunnerJob:
    return RunnerJob(id=7, caller_id=1, context_id=1, script="x", script_type="v", **kw)


def test_target_queue_most_specific_with_priority():
    assert target_queue(job()) == "queue:v"
    assert target_queue(job(group="gpu")) == "queue:v:group:gpu"
    assert target_queue(job(group="gpu", instance="2")) == "queue:v:group:gpu:inst:2"
    assert target_queue(job(instance="2")) == "queue:v"  # an instance needs its group
    assert target_queue(job(priority="high")) == "queue:v:prio:high"
    assert target_queue(job(group="g", priority="low")) == "queue:v:group:g:prio:low"
    assert target_queue(job(priority="urgent")) == "queue:v"  # unknown: normal


def test_consume_order_instance_group_type_and_aging():
    bases = slot_bases("v", "gpu", "1")
    assert bases == ["queue:v:group:gpu:inst:1", "queue:v:group:gpu", "queue:v"]
    order = consume_order(bases, 1)
    assert order[:3] == [f"{b}:prio:high" for b in bases]
    assert order[3:6] == bases
    assert order[6:] == [f"{b}:prio:low" for b in bases]
    aged = consume_order(bases, AGING_EVERY)
    assert aged[:3] == [f"{b}:prio:low" for b in bases]
    assert consume_order(slot_bases("sh"), 1) == [
        "queue:sh:prio:high",
        "queue:sh",
        "queue:sh:prio:low",
    ]


def test_targeting_is_signed_only_when_set():
    plain = job()
    assert "group" not in plain.signed_dict()
    assert "group" not in plain.to_hash()
    targeted = job(group="gpu", priority="high")
    assert targeted.signed_dict()["group"] == "gpu"
    assert RunnerJob.from_hash(targeted.to_hash()) == targeted
    key = KeyPair.generate()
    msg = sign_message(
        Message(1, 1, 1, job=[targeted], created_at=1, origin="a", destination="b"), key
    )
    back = Message.from_hash(msg.to_hash())
    assert back.job[0].group == "gpu"
    assert verify_message(back, key.public_hex).ok
    tampered = Message.from_hash(
        msg.to_hash() | {"job": msg.to_hash()["job"].replace("gpu", "cpu")}
    )
    assert not verify_message(tampered, key.public_hex).ok


async def test_pop_first_takes_in_order_reliably(store, sync_runs):
    await store.lpush(1, "queue:v", "job:1:1")
    await store.lpush(1, "queue:v:prio:high", "job:1:2")
    lists = consume_order(slot_bases("v"), 1)
    assert sync_runs.pop_first(lists, "inflight:runner:v:0") == ("job:1:2", 0)
    assert sync_runs.pop_first(lists, "inflight:runner:v:0") == ("job:1:1", 0)
    # nothing queued: what the in-flight list holds, for the blocking pop that follows
    assert sync_runs.pop_first(lists, "inflight:runner:v:0") == (None, 2)
    assert await store.lrange(1, "inflight:runner:v:0") == ["job:1:1", "job:1:2"]


async def _submit(node, actor, script: str, **targeting: str):
    from bus.core.ids import new_id, now
    from bus.core.models import RunnerJob

    job = RunnerJob(new_id(), 1, 1, script, "python", created_at=now(), **targeting)
    return await node.client.submit(actor, 1, to=node.node_id, context_id=1, jobs=[job])


async def test_local_slots_take_high_priority_first_and_serve_their_group(node_factory, tmp_path):
    import trio

    from crypto import read_key_file
    from tests.scripts import announcing, wait_announced

    alice = await node_factory("alice", runners={"python": 1}, runner_groups={"python": "gpu"})
    actor = read_key_file(alice.config.actor_key_path)
    order = alice.config.home / "work" / "1" / "order"  # the jobs' work dir (their cwd)
    blocker = await _submit(
        alice, actor, announcing(alice.info.redis_url, "block", "import time\ntime.sleep(1)\n")
    )
    await wait_announced(alice.store, "block")  # the only slot is busy: the rest queue up
    record = f"open({order.name!r}, 'a').write('{{}}\\n')"
    low = await _submit(alice, actor, record.format("low"), priority="low")
    normal = await _submit(alice, actor, record.format("normal"))
    grouped = await _submit(alice, actor, record.format("gpu"), group="gpu")
    high = await _submit(alice, actor, record.format("high"), priority="high")
    with trio.fail_after(30):
        for msg in (blocker, low, normal, grouped, high):
            [result] = await alice.client.wait_results(msg, timeout_s=30)
            assert result.ok, result
    assert order.read_text().split() == ["high", "gpu", "normal", "low"]


async def test_idle_slots_take_a_priority_or_targeted_job_at_once(node_factory, monkeypatch):
    """Idle slots block on their type queue only; a job queued on a priority or group list
    interrupts them, so it starts now, not at their pop timeout (made 60 s here)."""
    from crypto import read_key_file
    from node.runners import processes as procs

    monkeypatch.setattr(procs, "POP_TIMEOUT_S", 60.0)
    alice = await node_factory("alice", runners={"python": 2}, runner_groups={"python": "gpu"})
    actor = read_key_file(alice.config.actor_key_path)
    warm = await _submit(alice, actor, "print('warm')")  # then every slot idles, blocked
    with trio.fail_after(20):
        await alice.client.wait_results(warm, timeout_s=20)
    for targeting in ({"priority": "high"}, {"group": "gpu"}, {"priority": "low"}):
        await trio.sleep(0.3)  # the slots are back in their blocking pop
        msg = await _submit(alice, actor, "print('now')", **targeting)
        with trio.fail_after(20):  # far below the 60 s pop timeout
            [result] = await alice.client.wait_results(msg, timeout_s=20)
        assert result.stdout == "now\n", targeting
