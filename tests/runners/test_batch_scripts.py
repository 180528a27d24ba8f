"""The script calls of a batch (bus/store/atomic/runs.py ``ends_then_source``, runs_take_next's
count), on a real Valkey through a runner process's connection: a take takes only what is
queued, up to its count; the ends of one call are each fenced alone, and what is given back is
not counted."""

from __future__ import annotations

import json

from bus.core import keys
from bus.store.atomic.runs import Ending, NextJob, finish_call, finish_local_call, requeue_call
from bus.store.atomic.runs_sync import SyncRuns, connect

INFLIGHT = keys.runner_inflight("v:0")


def _queued(client, n: int) -> list[str]:  # noqa: ANN001 - a redis-py client
    jobs = [f"job:1:{i}" for i in range(1, n + 1)]
    for job in jobs:
        client.hset(job, mapping={"status": "dispatched", "attempt": "0", "script_type": "v"})
        client.lpush("queue:v", job)  # LPUSH, consumed from the right: FIFO
    return jobs


def _take(count: int) -> NextJob:
    return NextJob(("queue:v",), "n:b:1:v:0", 15_000, "v:0", count=count)


def test_a_take_takes_up_to_its_count_of_what_is_queued_and_starts_each(redis_url) -> None:  # noqa: ANN001
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 5)
    nxt = _take(3)
    _, taken = runs.end_all([], INFLIGHT, nxt)
    assert [key for key, _ in taken] == jobs[:3]  # in queue order
    for key, fields in taken:
        assert (fields["status"], fields["attempt"]) == ("started", "1")
        assert fields["runner"] == f"n:b:1:v:0:{key}"
    assert client.lrange("queue:v", 0, -1) == [jobs[4], jobs[3]]
    _, taken = runs.end_all([], INFLIGHT, nxt)  # only what is queued: two, nothing waited for
    assert [key for key, _ in taken] == jobs[3:]
    assert not nxt.found_empty
    _, taken = runs.end_all([], INFLIGHT, nxt)
    assert taken == []
    assert nxt.found_empty  # the blocking pop follows
    assert nxt.held == 5
    assert sorted(client.zrange(keys.RUNNING, 0, -1)) == sorted(jobs)  # each with its lease


def test_a_batchs_ends_are_fenced_each_alone_and_a_given_back_one_is_not_counted(
    redis_url,  # noqa: ANN001
) -> None:
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 4)
    _, taken = runs.end_all([], INFLIGHT, _take(4))
    assert len(taken) == 4
    client.hset(jobs[1], "attempt", "2")  # superseded: another attempt took it meanwhile

    def finished(job: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {"stdout": job}, "", "")
        return finish_local_call(ending, request_key=f"message:{job}", reply_ttl_s=60, stats="[]")

    calls = [finished(j) for j in jobs[:3]] + [requeue_call(jobs[3], 1, INFLIGHT, "queue:v")]
    oks, again = runs.end_all(calls, INFLIGHT, _take(4))
    assert oks == [True, False, True, True]
    for job in (jobs[0], jobs[2]):
        assert client.hget(job, "status") == "finished"
        assert client.llen(keys.reply_list(f"message:{job}", "")) == 1
    assert client.hmget(jobs[1], "status", "attempt") == ["started", "2"]  # untouched
    assert client.llen(keys.reply_list(f"message:{jobs[1]}", "")) == 0
    # given back, uncounted, at the consuming end: the take in the same call ran it again
    assert [key for key, _ in again] == [jobs[3]]
    assert again[0][1]["attempt"] == "1"
    assert client.lrange(INFLIGHT, 0, -1) == [jobs[3], jobs[1]]


def _calls(client) -> dict[str, int]:  # noqa: ANN001 - a redis-py client
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def test_a_takes_starts_free_their_queue_places_in_one_write_per_actor(redis_url) -> None:  # noqa: ANN001
    """A take of several counted jobs (runs_take_next) frees their places in the queue bounds
    once for the batch: one HINCRBY per actor and one SCARD, not one of each per job, and no
    command for the marks (each turns '0' in its job's start HSET); the depths are exact, a job
    without the mark moves none, and a waiting actor gets one wake-up."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = ["job:7:1", "job:7:2", "job:8:1", "job:7:3", "job:8:2"]
    for i, job in enumerate(jobs):
        fields = {"status": "dispatched", "attempt": "0", "script_type": "v"}
        if i != 4:  # the last one was never counted (no mark): its start moves nothing
            fields[keys.QUOTA_COUNTED] = "1"
        client.hset(job, mapping=fields)
        client.lpush("queue:v", job)
    client.hset(keys.QUOTA_DEPTH, mapping={"7": "3", "8": "1"})
    client.sadd(keys.QUOTA_WAITING, "9")  # an actor waits past its fair share
    before = _calls(client)
    nxt = NextJob(("queue:v",), "n:b:1:v:0", 15_000, "v:0", count=5, counts_starts=True)
    _, taken = runs.end_all([], INFLIGHT, nxt)
    calls = _calls(client)
    assert len(taken) == 5
    assert calls.get("hincrby", 0) - before.get("hincrby", 0) == 2  # actors 7 and 8, once each
    assert calls.get("scard", 0) - before.get("scard", 0) == 1
    assert calls.get("hdel", 0) - before.get("hdel", 0) == 0
    assert calls.get("hset", 0) - before.get("hset", 0) == 5  # one per start, the mark in it
    assert client.hgetall(keys.QUOTA_DEPTH) == {"7": "0", "8": "0"}
    assert [client.hget(job, keys.QUOTA_COUNTED) for job in jobs] == ["0"] * 4 + [None]
    assert client.llen(INFLIGHT) == 5  # in flight in one LPUSH
    # started again (a retry), a job moves no count: its mark says it left already
    client.hset(jobs[0], "status", "dispatched")
    client.lpush("queue:v", jobs[0])
    runs.end_all([], INFLIGHT, nxt)
    assert client.hgetall(keys.QUOTA_DEPTH) == {"7": "0", "8": "0"}
    assert client.lrange(keys.QUOTA_FAIR_WAKE, 0, -1) == ["1"]


def test_a_batchs_ends_take_their_entries_off_the_in_flight_list_at_once(redis_url) -> None:  # noqa: ANN001
    """The ends of one call take their entries off the slot's in-flight list together: the
    list read once and written once (LRANGE, DEL, RPUSH of what stays), not one LREM per end;
    what stays keeps its order, and a refused end (superseded) leaves its entry."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 6)
    _, taken = runs.end_all([], INFLIGHT, _take(6))
    assert len(taken) == 6
    client.hset(jobs[2], "attempt", "2")  # superseded: its end is refused

    def finished(job: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {}, "", "")
        return finish_local_call(ending, request_key=f"message:{job}", reply_ttl_s=60, stats="[]")

    before = _calls(client)
    oks, _ = runs.end_all([finished(j) for j in jobs[:5]], INFLIGHT, None)
    calls = _calls(client)
    assert oks == [True, True, False, True, True]
    assert {n: calls.get(n, 0) - before.get(n, 0) for n in ("lrem", "lrange", "del", "rpush")} == {
        "lrem": 0,
        "lrange": 1,
        "del": 1,
        "rpush": 1,
    }
    assert client.lrange(INFLIGHT, 0, -1) == [jobs[5], jobs[2]]  # in their order


def test_a_batchs_answers_are_pushed_once_per_reply_list(redis_url) -> None:  # noqa: ANN001
    """The answers of one call's ends go out per reply list: one LPUSH of all the replies an
    inbox gets and one EXPIRE, not one of each per job; the client pops them in the order the
    jobs ended, as one push each would have left them."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 4)
    _, taken = runs.end_all([], INFLIGHT, _take(4))
    assert len(taken) == 4

    def finished(job: str, reply_to: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {"stdout": job}, "", "")
        request = f"message:{job}"
        return finish_local_call(ending, request_key=request, reply_ttl_s=60, reply_to=reply_to)

    calls = [finished(j, "box") for j in jobs[:3]] + [finished(jobs[3], "")]
    before = _calls(client)
    oks, _ = runs.end_all(calls, INFLIGHT, None, ("[]", ""))
    after = _calls(client)
    assert oks == [True] * 4
    assert {n: after.get(n, 0) - before.get(n, 0) for n in ("lpush", "expire")} == {
        "lpush": 2,  # the inbox's three, the lone reply list's one
        "expire": 2,
    }
    inbox = keys.reply_list("message:x", "box")
    assert 0 < client.ttl(inbox) <= 60
    popped = [json.loads(client.rpop(inbox))["job_key"] for _ in range(3)]
    assert popped == jobs[:3]  # oldest first, as the client pops
    assert client.llen(keys.reply_list(f"message:{jobs[3]}", "")) == 1


def test_a_batchs_signed_answers_go_on_msg_out_in_one_push(redis_url) -> None:  # noqa: ANN001
    """A batch's answers for remote origins (runs_finish) put their result messages' keys on
    msg_out in one LPUSH, in the order the jobs ended: the node's supervisor pops them oldest
    first, as before."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 3)
    _, taken = runs.end_all([], INFLIGHT, _take(3))
    assert len(taken) == 3

    def answered(job: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {}, "", "")
        return finish_call(ending, f"message:9:{job[6:]}", {"id": job[6:]}, "[]")

    before = _calls(client)
    oks, _ = runs.end_all([answered(j) for j in jobs], INFLIGHT, None)
    after = _calls(client)
    assert oks == [True] * 3
    assert after.get("lpush", 0) - before.get("lpush", 0) == 1
    popped = [client.rpop(keys.MSG_OUT) for _ in jobs]
    assert popped == [f"message:9:{j[6:]}" for j in jobs]
    assert client.hget(popped[0], "id") == jobs[0][6:]


def test_a_batchs_leases_are_set_and_dropped_in_one_command_each(redis_url) -> None:  # noqa: ANN001
    """A take's starts set their leases in one ZADD, and a batch's ends drop theirs in one
    ZREM (runs_leases), not one per job: each started job is scored with its own lease, a
    refused end (superseded) keeps the lease of the attempt that holds the job, and a job given
    back and started again in the same call holds its new lease."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 5)
    before = _calls(client)
    _, taken = runs.end_all([], INFLIGHT, _take(5))
    calls = _calls(client)
    assert len(taken) == 5
    assert calls.get("zadd", 0) - before.get("zadd", 0) == 1
    leases = dict(client.zrange(keys.RUNNING, 0, -1, withscores=True))
    for key, fields in taken:  # each its start's stamp plus the lease's 15 s
        assert leases[key] == int(fields["stats_started_ms"]) + 15_000
    client.hset(jobs[1], "attempt", "2")  # superseded: another attempt holds the job
    client.zadd(keys.RUNNING, {jobs[1]: 7})

    def finished(job: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {}, "", "")
        return finish_local_call(ending, request_key=f"message:{job}", reply_ttl_s=60, stats="[]")

    calls_ = [finished(j) for j in jobs[:3]] + [requeue_call(jobs[3], 1, INFLIGHT, "queue:v")]
    before = _calls(client)
    oks, again = runs.end_all(calls_, INFLIGHT, _take(1))
    calls = _calls(client)
    assert oks == [True, False, True, True]
    assert calls.get("zrem", 0) - before.get("zrem", 0) == 1
    assert calls.get("zadd", 0) - before.get("zadd", 0) == 1  # the take's one start
    assert [key for key, _ in again] == [jobs[3]]
    leases = dict(client.zrange(keys.RUNNING, 0, -1, withscores=True))
    assert set(leases) == {jobs[1], jobs[3], jobs[4]}
    assert leases[jobs[1]] == 7  # the holder's lease, untouched
    assert leases[jobs[3]] == int(again[0][1]["stats_started_ms"]) + 15_000


def test_a_take_after_a_batchs_ends_knows_the_in_flight_length_without_llen(redis_url) -> None:  # noqa: ANN001
    """A take that finds nothing queued returns the in-flight list's length (what the blocking
    pop that follows compares with its own); after a batch's ends that just rewrote the list
    it is the length they left, with no LLEN: an entry whose end was refused still counts."""
    runs = SyncRuns.open(redis_url, 1)
    client = connect(redis_url, 1)
    jobs = _queued(client, 4)
    _, taken = runs.end_all([], INFLIGHT, _take(4))
    assert len(taken) == 4
    client.hset(jobs[0], "attempt", "2")  # superseded: its entry stays in flight

    def finished(job: str) -> tuple[str, list[str], list[str]]:
        ending = Ending(job, 1, INFLIGHT, "finished", {}, "", "")
        return finish_local_call(ending, request_key=f"message:{job}", reply_ttl_s=60, stats="[]")

    nxt = _take(4)
    before = _calls(client)
    oks, again = runs.end_all([finished(j) for j in jobs], INFLIGHT, nxt)
    calls = _calls(client)
    assert (oks, again) == ([False, True, True, True], [])
    assert nxt.found_empty
    assert nxt.held == 1 == client.llen(INFLIGHT)
    assert calls.get("llen", 0) - before.get("llen", 0) == 0
