"""Fair share between actors (issue 46, clause 5): an actor holding ``fair_share_jobs`` of its
jobs in a context's queues has the rest wait in its own list, so another actor's job waits
behind at most that many of a flooding actor's, not behind all of them. Through a real node,
its runner process and its Valkey; the order is read from the jobs' start stamps
(``stats_started_ms``, written by the script that starts each job), not from timing.

One slot runs cheap python jobs (``print``): 2,000 of the flooding actor's, then one of another
actor's, against a share of 50. With the share, all are judged before the node has a slot (it
starts anew with one): how fast a runner drains the queue against how fast the supervisor
judges the flood is the machine's, and decides nothing here. The control without a share has
its slot from the start (see _ahead_of_the_other)."""

from __future__ import annotations

import pytest
import trio

from bus.client.api import new_job
from bus.core import keys
from bus.core.models import JobStatus, Message
from bus.core.reasons import Reason
from bus.store import records
from bus.store.atomic import fair_share
from crypto import KeyPair, read_key_file
from node.config import NodeConfig

FLOOD, SHARE, SLOTS = 2000, 50, 1
BATCH = NodeConfig.batch_jobs  # what one take of a slot may hold (a batch of python jobs)
OTHER = 2  # the actor who submits one job after the flood


async def _other_actor(node) -> KeyPair:  # noqa: ANN001 - conftest.RunningNode
    other = KeyPair.generate()
    await node.client.register_actor(OTHER, other.public_hex)
    await node.client.register_context(1, admins=[1], executors=[OTHER])
    return other


async def _flood(node, n: int) -> list[Message]:  # noqa: ANN001
    signer = read_key_file(node.config.actor_key_path)
    jobs = [new_job(1, 1, "python", f"print({i})") for i in range(n)]
    return await node.client.submit_many(signer, 1, to=node.node_id, context_id=1, jobs=jobs)


async def _judged(node) -> None:  # noqa: ANN001
    """Returns once every message submitted before was judged: a message of a type no runner
    has is refused and answered at once, and msg_out is first in, first out."""
    signer = read_key_file(node.config.actor_key_path)
    [probe] = await node.client.submit_many(
        signer, 1, to=node.node_id, context_id=1, jobs=[new_job(1, 1, "nope", "x")]
    )
    with trio.fail_after(30):
        [result] = await node.client.wait_results(probe, timeout_s=30)
    assert result.status is JobStatus.ERROR


async def _started(node, message: Message) -> int:  # noqa: ANN001
    """When the message's job started (ms, Valkey's clock)."""
    job = await node.store.hgetall(1, message.job[0].key)
    return int(job["stats_started_ms"])


async def _ahead_of_the_other(fair_share_jobs: int, node_factory) -> int:  # noqa: ANN001
    """How many of the flooding actor's jobs started before the other actor's one job (or in the
    same ms), submitted after all of them; every job ran, once.

    With a share, every job is judged before the node has a slot. Without one, the slot is
    there from the start: the flood would otherwise wait in msg_out at the queue's mark
    (node/intake/supervisor.py's backpressure) for a runner to take some, and one first-in,
    first-out queue orders the jobs whatever the speeds."""
    slots = 0 if fair_share_jobs else SLOTS
    alice = await node_factory(
        "alice", runners={"python": slots, "sh": 0}, fair_share_jobs=fair_share_jobs
    )
    other = await _other_actor(alice)
    flood = await _flood(alice, FLOOD)
    [mine] = await alice.client.submit_many(
        other, OTHER, to=alice.node_id, context_id=1, jobs=[new_job(OTHER, 1, "python", "pass")]
    )
    if not slots:
        await _judged(alice)
        await alice.stopped()
        alice = await node_factory("alice", again=alice, runners={"python": SLOTS, "sh": 0})
    with trio.fail_after(50):
        [result] = await alice.client.wait_results(mine, timeout_s=50)
        done = [(await alice.client.wait_results(m, timeout_s=50))[0] for m in flood]
    assert result.ok
    assert [r.stdout for r in done] == [f"{i}\n" for i in range(FLOOD)]
    assert await records.quota_depths(alice.store, 1) == {"1": 0, "2": 0, keys.QUOTA_ALL: 0}
    started = await _started(alice, mine)
    return sum(t <= started for t in [await _started(alice, m) for m in flood])


async def test_another_actors_job_waits_behind_at_most_the_flooders_share(node_factory):
    # the share queued before it, and the slot's take that holds it: never the flood
    assert await _ahead_of_the_other(SHARE, node_factory) <= SHARE + BATCH * SLOTS


async def test_without_a_share_the_other_actor_waits_behind_the_whole_flood(node_factory):
    """The negative control: fair_share_jobs = 0 is one first-in-first-out queue."""
    assert await _ahead_of_the_other(0, node_factory) == FLOOD


async def test_waiting_jobs_survive_restarts_run_once_and_can_be_stopped(node_factory):
    """No runner at first: the jobs stay where the materialise script put them. A stop takes a
    waiting one out of its list; a restart with a larger share moves the waiting jobs at once
    (the refill at the service's start, no job having left to wake it); the last boot runs
    every job left, each once."""
    n, share, stop = 60, 5, 30
    alice = await node_factory("alice", runners={"python": 0, "sh": 0}, fair_share_jobs=share)
    flood = await _flood(alice, n)
    queue = keys.queue("python")
    await _judged(alice)
    assert await alice.store.llen(1, queue) == share
    keys_in_order = [m.job[0].key for m in flood]
    assert await fair_share.waiting(alice.store, 1, 1) == [
        f"{queue} {k}" for k in keys_in_order[share:]
    ]

    stopped = flood[stop]
    signer = read_key_file(alice.config.actor_key_path)
    await alice.client.stop_job(signer, 1, stopped.job[0].key, 1)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(stopped, timeout_s=30)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith(Reason.STOPPED)
    left = [k for k in keys_in_order if k != stopped.job[0].key]
    assert await fair_share.waiting(alice.store, 1, 1) == [f"{queue} {k}" for k in left[share:]]
    assert (await records.quota_depths(alice.store, 1))["1"] == n - 1

    await alice.stopped()
    alice = await node_factory("alice", again=alice, fair_share_jobs=20)
    assert await alice.store.llen(1, queue) == 20
    assert len(await fair_share.waiting(alice.store, 1, 1)) == n - 1 - 20

    await alice.stopped()
    alice = await node_factory("alice", again=alice, runners={"python": 1, "sh": 0})
    rest = [m for m in flood if m is not stopped]
    with trio.fail_after(50):
        done = [(await alice.client.wait_results(m, timeout_s=50))[0] for m in rest]
    assert [r.stdout for r in done] == [f"{i}\n" for i in range(n) if i != stop]
    for m in flood:
        job = await alice.store.hgetall(1, m.job[0].key)
        assert job.get("attempt", "0") == ("0" if m is stopped else "1"), m.key
    assert await fair_share.waiting(alice.store, 1, 1) == []
    assert await records.quota_depths(alice.store, 1) == {"1": 0, keys.QUOTA_ALL: 0}


@pytest.mark.parametrize("share", [0, 3])
async def test_a_share_keeps_the_queue_bounds_exact(node_factory, share: int):
    """A waiting job counts against its actor's queue bound like a queued one: with or without
    a share, the same jobs are refused."""
    alice = await node_factory(
        "alice", runners={"python": 0, "sh": 0}, fair_share_jobs=share, max_queued_per_actor=10
    )
    flood = await _flood(alice, 14)
    await _judged(alice)
    with trio.fail_after(30):
        refused = [(await alice.client.wait_results(m, timeout_s=30))[0] for m in flood[10:]]
    assert all(r.reason.startswith(f"{Reason.QUOTA_EXCEEDED}: ") for r in refused)
    assert (await records.quota_depths(alice.store, 1))["1"] == 10
    assert await alice.store.llen(1, keys.queue("python")) == (share or 10)


async def test_a_runner_under_its_acl_user_wakes_the_refill(node_factory):
    """On the embedded Valkey the runner process starts jobs as the ``runner`` ACL user: its
    start script pushes the wake-up while jobs wait (node/host/acl.py)."""
    alice = await node_factory(
        "alice", embedded=True, runners={"python": 1, "sh": 0}, fair_share_jobs=2
    )
    flood = await _flood(alice, 8)
    with trio.fail_after(30):
        done = [(await alice.client.wait_results(m, timeout_s=30))[0] for m in flood]
    assert [r.stdout for r in done] == [f"{i}\n" for i in range(8)]
    assert await fair_share.waiting(alice.store, 1, 1) == []


async def test_a_refill_goes_round_robin_within_its_bound_and_drops_bad_entries(store):
    """The refill script alone, on a real Valkey: two actors over a share of 1, three jobs each
    waiting; at most 3 moved per call, the next call starting where the last stopped; an entry
    that names no queue is dropped and reported (node/intake/fair_share.py dead-letters it)."""
    q = keys.queue("python")

    async def wait(actor: int, jobs: list[str]) -> None:
        await store.call(1, lambda r: r.lpush(keys.quota_wait(actor), jobs))
        await store.call(1, lambda r: r.sadd(keys.QUOTA_WAITING, [str(actor)]))
        await store.call(1, lambda r: r.hincrby(keys.QUOTA_DEPTH, str(actor), len(jobs)))

    await wait(1, [f"{q} job:1:{i}" for i in range(3)] + ["no-queue"])
    await wait(2, [f"{q} job:2:{i}" for i in range(3)])
    first = await fair_share.refill(store, 1, 1, most=1)
    assert (first.moved, first.more, first.bad) == (1, True, [])
    assert await store.llen(1, keys.QUOTA_FAIR_WAKE) == 1  # it woke itself to go on
    second = await fair_share.refill(store, 1, 1, most=3)
    assert (second.moved, second.more) == (1, False)  # actor 2's one place; actor 1 is full
    assert await store.call(1, lambda r: r.lrange(q, 0, -1)) == ["job:2:0", "job:1:0"]
    # actor 1's first job started (quota_left's count), a place for its next
    await store.call(1, lambda r: r.hincrby(keys.QUOTA_DEPTH, "1", -1))
    await store.call(1, lambda r: r.rpop(q))
    third = await fair_share.refill(store, 1, 0)  # no share: everything moves
    assert (third.moved, third.bad, third.queues) == (4, ["no-queue"], [q])
    assert await store.smembers(1, keys.QUOTA_WAITING) == set()
    assert await store.call(1, lambda r: r.lrange(q, 0, -1)) == [
        "job:2:2",
        "job:2:1",
        "job:1:2",
        "job:1:1",
        "job:2:0",
    ]


async def test_a_refill_takes_an_actors_places_in_one_rpop(store):
    """The waiting entries an actor has places for leave its list in one RPOP, not one a job:
    300 waiting, a share of 250 with 40 held, 210 moved (the oldest, in order) by one RPOP."""
    q = keys.queue("python")
    jobs = [f"{q} job:1:{i}" for i in range(300)]
    await store.call(1, lambda r: r.lpush(keys.quota_wait(1), jobs))
    await store.call(1, lambda r: r.sadd(keys.QUOTA_WAITING, ["1"]))
    await store.call(1, lambda r: r.hincrby(keys.QUOTA_DEPTH, "1", 300 + 40))

    async def rpops() -> int:
        stats = await store.call(1, lambda r: r.info("commandstats"))
        return int(stats.get("cmdstat_rpop", {}).get("calls", 0))

    before = await rpops()
    done = await fair_share.refill(store, 1, 250)
    assert (done.moved, done.more, done.bad) == (210, False, [])
    assert await rpops() - before == 1
    moved = await store.call(1, lambda r: r.lrange(q, 0, -1))
    assert moved == [f"job:1:{i}" for i in reversed(range(210))]
    assert len(await fair_share.waiting(store, 1, 1)) == 90


async def test_a_wake_up_is_one_entry_and_one_command_when_none_waits(store):
    """A refill that stops at its bound wakes the next one: one entry on the wake list, pushed
    by one LPUSH when the list was empty (no LTRIM), trimmed back to one when it was not."""
    q = keys.queue("python")
    await store.call(1, lambda r: r.lpush(keys.quota_wait(1), [f"{q} job:1:{i}" for i in range(3)]))
    await store.call(1, lambda r: r.sadd(keys.QUOTA_WAITING, ["1"]))
    await store.call(1, lambda r: r.hincrby(keys.QUOTA_DEPTH, "1", 3))

    async def ltrims() -> int:
        stats = await store.call(1, lambda r: r.info("commandstats"))
        return int(stats.get("cmdstat_ltrim", {}).get("calls", 0))

    before = await ltrims()
    assert (await fair_share.refill(store, 1, 0, most=1)).more
    assert await store.llen(1, keys.QUOTA_FAIR_WAKE) == 1
    assert await ltrims() == before
    assert (await fair_share.refill(store, 1, 0, most=1)).more  # the first wake not taken
    assert await store.llen(1, keys.QUOTA_FAIR_WAKE) == 1
    assert await ltrims() == before + 1
