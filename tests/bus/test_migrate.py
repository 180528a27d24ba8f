"""Data model version 3 (issue 44): a store written by version 2 is migrated when a node starts
on it; what a v2 store recorded (replay markers, queue depths) still holds afterwards."""

from __future__ import annotations

import pytest
import trio

from bus.core import keys
from bus.core.ids import now
from bus.core.models import Message, MessageType
from bus.errors import StoreError
from bus.store import records
from bus.store.atomic import queues, routing, runs, runs_trio
from bus.store.connection import Store, open_store
from bus.store.migrate import Migrated, data_model_version, migrate
from crypto import read_key_file
from tests.intake.test_rejections import job_message, push_in, run_and_wait
from tests.leases import lease_left_ms

CTX = 1


async def _v2_state(store: Store, *, job: str) -> None:
    """What a version-2 node leaves: replay markers as strings with a TTL, a set of the actor's
    queued jobs and a context-wide count, no version marker."""
    async with store.transaction(CTX) as tx:
        tx.set("seen:message:1:5", "1", ex=400)
        tx.set("nonce:1:n5", "message:1:5", ex=400)
        tx.set("seen:message:1:6", "1")  # no TTL: kept without one
        tx.sadd("quota:jobs:1", [job, "job:1:404"])  # the second's hash is gone
        tx.hset(keys.QUOTA_DEPTH, {"1": "2", "all": "2"})
    await store.call(keys.ACTORS_DB, lambda r: r.delete([keys.DATA_MODEL]))


async def _ttl_ms(store: Store, field: str) -> int:
    [ttl] = await store.call(CTX, lambda r: r.hpttl(keys.REPLAY, [field]))
    return int(ttl)


async def test_v2_markers_and_depths_are_migrated_once(store: Store) -> None:
    job = "job:1:7"
    await store.hset(CTX, job, {"status": "dispatched", "message_key": "message:1:5"})
    await _v2_state(store, job=job)
    assert await data_model_version(store) == 2

    assert await migrate(store, [CTX]) == [Migrated(CTX, markers=3, counted=1)]
    assert await data_model_version(store) == 3
    replay = await store.call(CTX, lambda r: r.hgetall(keys.REPLAY))
    assert replay == {
        "seen:message:1:5": "1",
        "nonce:1:n5": "message:1:5",
        "seen:message:1:6": "1",
    }
    assert 0 < await _ttl_ms(store, "seen:message:1:5") <= 400_000  # what was left of it
    assert 0 < await _ttl_ms(store, "nonce:1:n5") <= 400_000
    assert await _ttl_ms(store, "seen:message:1:6") == -1
    assert await store.scan_keys(CTX, "seen:*") == []
    assert await store.scan_keys(CTX, "quota:jobs:*") == []
    assert (await store.hgetall(CTX, job))[keys.QUOTA_COUNTED] == "1"
    assert await store.hgetall(CTX, keys.QUOTA_DEPTH) == {"1": "1"}

    # the markers still refuse what they marked, now from the replay hash
    replay_key = queues.JobWrite("job:1:8", "", {"message_key": "message:1:5"})
    batch = [
        (job_message_keyed(5, "x"), [replay_key]),
        (job_message_keyed(9, "n5"), []),
    ]
    codes, _, _ = await queues.materialise_batch(
        store, CTX, "fly", batch, now=now(), window_s=60, depth_of=[]
    )
    assert codes == [1, 2]
    # the counted job leaves its actor's count once, however often it is stopped
    for _ in range(2):
        await routing.stop_job(store, CTX, job, "none", reason="stopped", now=now())
        assert await records.quota_depths(store, CTX) == {"1": 0, keys.QUOTA_ALL: 0}

    assert await migrate(store, [CTX]) == []  # at version 3: nothing to do


def job_message_keyed(ident: int, nonce: str) -> Message:
    return Message(
        id=ident, caller_id=1, context_id=CTX, message="", message_type=MessageType.JOB, nonce=nonce
    )


async def test_a_store_of_a_newer_data_model_is_refused(store: Store) -> None:
    await store.call(keys.ACTORS_DB, lambda r: r.set(keys.DATA_MODEL, "4"))
    with pytest.raises(StoreError, match="data model version 4"):
        await migrate(store, [CTX])


async def test_a_node_started_on_a_v2_store_migrates_it(node_factory) -> None:  # noqa: ANN001
    """A node of version 2 wrote the store (its markers and counts, made by hand here on a
    store a first boot set up); the next boot migrates it before it takes any message: the
    v2 marker still refuses its message, and the v2 count still leaves exactly once."""
    alice = await node_factory("alice", runners={"python": 1, "sh": 0})
    actor = read_key_file(alice.config.actor_key_path)
    queued = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="sh", script="true"
    )
    job = queued.job[0].key
    with trio.fail_after(30):
        while (await alice.store.hgetall(CTX, job)).get("status") != "dispatched":
            await alice.store.call(CTX, lambda r: r.blpop(["never"], timeout=0.1))
    replayed = job_message(actor, 1, alice.node_id, alice.node_id, "print('replayed')")
    await alice.stopped()
    async with open_store(alice.config.redis_url) as store:
        await store.call(CTX, lambda r: r.hdel(job, [keys.QUOTA_COUNTED]))
        await _v2_state(store, job=job)
        await store.call(CTX, lambda r: r.set(keys.seen(replayed.key), "1", ex=400))

    alice = await node_factory("alice", again=alice)
    assert await data_model_version(alice.store) == 3
    assert await records.quota_depths(alice.store, CTX) == {"1": 1, keys.QUOTA_ALL: 1}
    await push_in(alice, replayed)
    assert (await run_and_wait(alice, actor, 1)).ok  # every earlier msg_in entry was handled
    letters = await alice.store.call(CTX, lambda r: r.lrange(keys.DLQ, 0, -1))
    assert any(replayed.key in str(e) and "replay" in str(e) for e in letters)
    assert not await alice.store.exists(CTX, replayed.job[0].key)
    await routing.stop_job(alice.store, CTX, job, "sh", reason="stopped", now=now())
    await routing.stop_job(alice.store, CTX, job, "sh", reason="stopped", now=now())
    assert await records.quota_depths(alice.store, CTX) == {"1": 0, keys.QUOTA_ALL: 0}


async def _v2_leases(store: Store, ctx: int = CTX) -> None:
    """What a version-2 runner side leaves mid-run: the set ``running`` and a string lease per
    started job with what is left of its TTL. job:1:20 runs (5 s left), job:1:21's lease lapsed
    (its runner died), job:1:22 was started by a start cut between its two writes (a lease, not
    in the set), job:1:23 finished and kept a stray lease."""
    started = {"status": "started", "attempt": "1", "runner": "ext-9:t", "runner_id": "ext-9"}
    async with store.transaction(ctx) as tx:
        for n in (20, 21, 22):
            tx.hset(f"job:1:{n}", started)
        tx.hset("job:1:23", {"status": "finished", "attempt": "1"})
        tx.sadd(keys.RUNNING, ["job:1:20", "job:1:21"])
        tx.set("lease:job:1:20", "ext-9:t", px=5_000)
        tx.set("lease:job:1:22", "ext-9:t", px=5_000)
        tx.set("lease:job:1:23", "ext-9:t", px=5_000)


async def test_v2_leases_and_running_set_become_one_sorted_set(store: Store) -> None:
    """A store of version 2 holding started jobs: each keeps its lease as its score in the
    ``running`` zset (what was left of it, or lapsed), no lease string is left, and the
    runner-side transitions work on what was migrated: an end of the running attempt is
    accepted, the lapsed one is reaped, the live one is not."""
    await _v2_leases(store)
    await store.call(keys.ACTORS_DB, lambda r: r.delete([keys.DATA_MODEL]))
    assert await migrate(store, [CTX]) == [Migrated(CTX, markers=0, counted=0, leases=3)]
    assert await store.scan_keys(CTX, "lease:*") == []
    assert await runs_trio.running_jobs(store, CTX) == ["job:1:20", "job:1:21", "job:1:22"]
    assert 4_000 < (await lease_left_ms(store, "job:1:20") or 0) <= 5_000
    assert 4_000 < (await lease_left_ms(store, "job:1:22") or 0) <= 5_000
    assert (await lease_left_ms(store, "job:1:21") or 1) <= 0  # lapsed: the reaper judges it
    assert await runs_trio.lapsed(store, CTX) == (["job:1:21"], pytest.approx(5, abs=1))
    assert not await runs_trio.reap(store, CTX, "job:1:20", "1", "runner_lost: x")  # live
    assert await runs_trio.reap(store, CTX, "job:1:21", "1", "runner_lost: x")
    ending = runs.Ending("job:1:20", 1, "inflight:runner:ext-9", "finished", {}, "", "")
    assert await runs_trio.finish_local(
        store, CTX, ending, request_key="message:1:1", reply_ttl_s=60
    )
    assert await runs_trio.running_jobs(store, CTX) == ["job:1:22"]
    assert await migrate(store, [CTX]) == []  # at version 3, of this shape: nothing to do


async def test_a_v3_store_with_the_old_running_set_is_migrated_by_its_shape(store: Store) -> None:
    """A store an earlier build of version 3 wrote (its version says 3, its runner side has the
    set and the lease strings) is migrated too: by the shape of ``running``."""
    await _v2_leases(store)
    await store.call(keys.ACTORS_DB, lambda r: r.set(keys.DATA_MODEL, "3"))
    assert await migrate(store, [CTX]) == [Migrated(CTX, markers=0, counted=0, leases=3)]
    assert await store.call(CTX, lambda r: r.type(keys.RUNNING)) == "zset"
    assert await store.scan_keys(CTX, "lease:*") == []


async def test_a_node_started_on_v2_runner_state_reaps_the_job_whose_runner_died(
    node_factory,  # noqa: ANN001
) -> None:
    """A job mid-run on a version-2 store, its external runner dead (its lease about to lapse):
    the node migrates it at start, then its reaper ends that attempt (runner_lost) and the
    client gets the answer; no lease string is left behind."""
    alice = await node_factory("alice", runners={"python": 1, "sh": 0}, lease_ttl_ms=1_000)
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="sh", script="true"
    )
    job = msg.job[0].key
    with trio.fail_after(30):
        while not await alice.store.call(CTX, lambda r: r.lrem("queue:sh", 1, job)):  # noqa: ASYNC110
            await trio.sleep(0.05)  # intake materialises it in its own time: poll Valkey
    await alice.stopped()
    started = {"status": "started", "attempt": "1", "runner": "ext-9:t", "runner_id": "ext-9"}
    async with open_store(alice.config.redis_url) as store:
        async with store.transaction(CTX) as tx:  # as a v2 external runner took it
            tx.hset(job, started)
            tx.rpush("inflight:runner:ext-9", [job])
            tx.sadd(keys.RUNNING, [job])
            tx.set(f"lease:{job}", "ext-9:t", px=300)
        await store.call(keys.ACTORS_DB, lambda r: r.delete([keys.DATA_MODEL]))

    alice = await node_factory("alice", again=alice)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.reason == "runner_lost: the lease of runner ext-9 expired"
    assert await alice.store.scan_keys(CTX, "lease:*") == []
    assert await runs_trio.running_jobs(alice.store, CTX) == []
    assert await alice.store.lrange(CTX, "inflight:runner:ext-9") == []
