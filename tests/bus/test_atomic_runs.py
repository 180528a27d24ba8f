"""Each script of bus/store/atomic/lua/runs_*.lua against a real Valkey: what it writes and returns,
and what it refuses (the attempt fence, the answer fence) without writing anything. A job's
start, requeue, pop and malformed end are run through the blocking client of the runner
processes (``sync_runs``), the only code that runs them."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from bus.core import keys
from bus.core.attempts import attempt_entry
from bus.core.ids import now_ms
from bus.core.models import Message, Runner
from bus.store.atomic import runs, runs_trio, slots, source
from bus.store.atomic.runs_sync import SyncRuns
from tests.leases import lapse, lease_left_ms

JOB = "job:1:1"
INFLIGHT = "inflight:runner:python:0"
QUEUE = "queue:python"


async def _started(
    store, sync_runs: SyncRuns, job: str = JOB, attempt: str = "0", **fields: str
) -> None:
    await store.hset(1, job, {"status": "dispatched", "attempt": attempt, **fields})
    await store.lpush(1, INFLIGHT, job)
    assert isinstance(sync_runs.start(job, f"tok:{job}", 10_000, "python:0"), dict)


async def _ttl_ms(store, key: str) -> int:
    return int(await store.call(1, lambda r: r.pttl(key)))


async def _lease_left_ms(store, job: str = JOB) -> int | None:
    return await lease_left_ms(store, job)


async def _lapse(store, job: str = JOB, in_ms: int = -1) -> None:
    await lapse(store, job, in_ms)


def _ending(attempt: int, job: str = JOB) -> runs.Ending:
    return runs.Ending(job, attempt, INFLIGHT, "finished", {"stdout": "x"}, "", '{"attempt": 1}')


async def _finish_local(store, attempt: int) -> bool:
    ending = _ending(attempt)
    return await runs_trio.finish_local(store, 1, ending, request_key="message:1:1", reply_ttl_s=60)


def _finish_local_then(sync_runs: SyncRuns, take: runs.NextJob, job: str = JOB):
    """A local finish then runs_take_next, in one round trip: only runner processes do that."""
    return sync_runs.finish_local(_ending(1, job), f"message:{job[4:]}", 60, take)


def test_every_script_states_its_keys_argv_and_effect() -> None:
    folder = resources.files("bus.store.atomic").joinpath("lua")
    names = [p.name[:-4] for p in folder.iterdir() if p.name.startswith("runs_")]
    assert len(names) >= 18
    for name in names:
        head = folder.joinpath(f"{name}.lua").read_text("utf-8").split("\n\n")[0]
        if head.startswith("-- Fragment:"):
            continue
        for word in ("KEYS:", "ARGV:", "Returns", "Atomic effect:"):
            assert word in head, (name, word)
    assert "local function unrunnable" in source("runs_start")
    assert not re.search(r"^-- include:", source("runs_finish_local"), re.MULTILINE)


async def test_start_marks_started_leases_and_counts_the_attempt(store, sync_runs) -> None:
    await store.hset(1, JOB, {"status": "dispatched", "attempt": "2"})
    fields = sync_runs.start(JOB, "tok", 10_000, "python:0")
    assert isinstance(fields, dict)
    assert (fields["status"], fields["attempt"], fields["runner"]) == ("started", "3", "tok")
    assert fields["runner_id"] == "python:0"
    assert 0 < (await _lease_left_ms(store) or 0) <= 10_000
    assert await runs_trio.running_jobs(store, 1) == [JOB]
    assert await store.scan_keys(1, "lease:*") == []  # the lease is the job's score, no key


@pytest.mark.parametrize(
    ("setup", "key", "reason"),
    [
        ({}, JOB, "missing_hash"),
        ({"list": True}, JOB, "wrong_type"),
        ({"status": "dispatched", "attempt": "x1"}, JOB, "malformed_job"),
        ({"attempt": "1"}, JOB, "malformed_job"),
        ({"status": "dispatched"}, "job:1:\u00e9", "malformed_job"),
    ],
)
async def test_start_refuses_what_no_runner_can_start(store, sync_runs, setup, key, reason) -> None:
    if setup.pop("list", False):
        await store.lpush(1, key, "x")
    elif setup:
        await store.hset(1, key, setup)
    assert sync_runs.start(key, "tok", 10_000, "") == reason
    assert await runs_trio.running_jobs(store, 1) == []


async def test_start_leaves_a_final_job_alone(store, sync_runs) -> None:
    await store.hset(1, JOB, {"status": "finished", "attempt": "1"})
    assert sync_runs.start(JOB, "tok", 10_000, "") == {}
    assert await runs_trio.attempt_state(store, 1, JOB) == ("finished", "1")
    assert await _lease_left_ms(store) is None


async def test_renew_keeps_retakes_or_refuses_a_superseded_attempt(store, sync_runs) -> None:
    await _started(store, sync_runs)
    await _lapse(store, JOB, 500)
    assert await runs_trio.renew(store, 1, JOB, f"tok:{JOB}", 10_000, 1)
    assert (await _lease_left_ms(store) or 0) > 500
    await _lapse(store, JOB)  # lapsed during a stall: taken again
    assert sync_runs.renew(JOB, f"tok:{JOB}", 10_000, 1)
    assert (await _lease_left_ms(store) or 0) > 500
    await store.call(1, lambda r: r.zrem(keys.RUNNING, [JOB]))  # reaped meanwhile: re-taken
    assert await runs_trio.renew(store, 1, JOB, f"tok:{JOB}", 10_000, 1)
    await _lapse(store, JOB)
    assert not await runs_trio.renew(store, 1, JOB, "old", 10_000, 2)  # not the current attempt
    assert (await _lease_left_ms(store) or 0) < 0  # untouched


async def test_only_a_job_with_a_history_to_tell_records_its_attempts(store, sync_runs) -> None:
    """A first attempt that finished writes no attempt entry (its job hash says it all); a
    failed one, or any later attempt, is recorded."""
    assert attempt_entry(1, "tok", "finished", "", 5) == ""
    assert json.loads(attempt_entry(2, "tok", "finished", "", 5))["attempt"] == 2
    assert json.loads(attempt_entry(1, "tok", "error", "exit_1", 5))["status"] == "error"
    await _started(store, sync_runs)
    first = runs.Ending(
        JOB, 1, INFLIGHT, "finished", {}, "", attempt_entry(1, "t", "finished", "", 5)
    )
    assert await runs_trio.finish_local(store, 1, first, request_key="message:1:1", reply_ttl_s=60)
    assert not await store.exists(1, keys.attempts(JOB))
    job = await store.hgetall(1, JOB)
    assert (job["attempt"], job["status"], job["runner"]) == ("1", "finished", f"tok:{JOB}")


async def test_finish_records_the_end_and_queues_the_answer(store, sync_runs) -> None:
    await _started(store, sync_runs)
    answer = Message(7, 9, 1, origin="elsewhere")
    ending = runs.Ending(JOB, 1, INFLIGHT, "error", {"stderr": "e"}, "exit_1", '{"attempt": 1}')
    assert await runs_trio.finish(store, 1, ending, answer=answer)
    job = await store.hgetall(1, JOB)
    assert (job["status"], job["reason"], json.loads(job["result"])) == (
        "error",
        "exit_1",
        {"stderr": "e"},
    )
    assert await store.lrange(1, keys.attempts(JOB)) == ['{"attempt": 1}']
    assert (await store.hgetall(1, answer.key))["origin"] == "elsewhere"
    assert await store.lrange(1, keys.MSG_OUT) == [answer.key]
    assert await runs_trio.running_jobs(store, 1) == []  # its lease with it
    assert await store.lrange(1, INFLIGHT) == []


async def test_the_fence_refuses_another_attempt_and_writes_nothing(store, sync_runs) -> None:
    await _started(store, sync_runs, attempt="1")  # the current attempt is 2
    before = await store.hgetall(1, JOB)
    assert not await _finish_local(store, 1)
    assert not await runs_trio.retry_later(
        store, 1, JOB, 3, INFLIGHT, queue=QUEUE, cause="r", entry="{}", due_ms=1
    )
    assert not sync_runs.finish_malformed(JOB, 1, INFLIGHT, "bad")
    assert not sync_runs.requeue(JOB, 1, INFLIGHT, QUEUE)
    assert await store.hgetall(1, JOB) == before
    assert await _lease_left_ms(store) is not None
    assert await store.lrange(1, INFLIGHT) == [JOB]
    assert await store.lrange(1, "reply:message:1:1") == []
    assert await store.lrange(1, keys.attempts(JOB)) == []


async def test_the_fence_refuses_a_job_that_is_not_started(store) -> None:
    await store.hset(1, JOB, {"status": "finished", "attempt": "1"})
    assert not await _finish_local(store, 1)
    assert await store.hgetall(1, "message:1:1") == {}


async def test_finish_local_answers_the_request_here(store, sync_runs) -> None:
    await _started(store, sync_runs, flow_id="flow:1")
    assert await _finish_local(store, 1)
    assert (await store.hgetall(1, JOB))["status"] == "finished"
    request = await store.hgetall(1, "message:1:1")
    assert request["status"] == "processed"
    assert request["processed_at"] == request["updated_at"]
    (reply,) = await store.lrange(1, keys.reply("message:1:1"))
    assert json.loads(reply)["result"] == {"stdout": "x"}
    assert 0 < await _ttl_ms(store, keys.reply("message:1:1")) <= 60_000
    assert await store.lrange(1, keys.FLOW_EVENTS) == ["flow:1"]
    assert await store.lrange(1, INFLIGHT) == []


async def test_finish_then_take_next_starts_the_next_job_in_one_step(store, sync_runs) -> None:
    await _started(store, sync_runs)
    await store.hset(1, "job:1:2", {"status": "dispatched", "attempt": "0"})
    await store.lpush(1, QUEUE, "job:1:2")
    take = runs.NextJob(("queue:python:prio:high", QUEUE), "base", 10_000, "python:0")
    done, taken = _finish_local_then(sync_runs, take)
    assert done
    [nxt] = taken
    assert (nxt[0], nxt[1]["status"], nxt[1]["attempt"]) == ("job:1:2", "started", "1")
    assert nxt[1]["runner"] == "base:job:1:2"
    assert 0 < (await _lease_left_ms(store, "job:1:2") or 0) <= 10_000
    assert await store.lrange(1, INFLIGHT) == ["job:1:2"]
    assert await runs_trio.running_jobs(store, 1) == ["job:1:2"]
    assert not take.found_empty


async def test_take_next_reports_empty_and_refuses_an_unrunnable_entry(store, sync_runs) -> None:
    await _started(store, sync_runs)
    await store.lpush(1, QUEUE, "job:1:404")  # names no hash
    take = runs.NextJob((QUEUE,), "base", 10_000, "python:0")
    done, nxt = _finish_local_then(sync_runs, take)
    assert (done, nxt, take.found_empty) == (True, [], False)
    assert await store.lrange(1, INFLIGHT) == []
    (dead,) = await store.dead_letters(1)
    assert (dead["key"], dead["reason"]) == ("job:1:404", "missing_hash")
    await _started(store, sync_runs, "job:1:2")
    await store.lpush(1, INFLIGHT, "job:1:9")  # a stale entry the end does not take off
    take = runs.NextJob((QUEUE,), "base", 10_000, "python:0")
    done, nxt = _finish_local_then(sync_runs, take, "job:1:2")
    # nothing queued: the in-flight list's length, which the blocking pop that follows needs
    assert (done, nxt, take.found_empty, take.held) == (True, [], True, 1)


async def test_retry_later_schedules_the_next_attempt(store, sync_runs) -> None:
    await _started(store, sync_runs)
    args = {"queue": QUEUE, "cause": "exit_1", "entry": "{}", "due_ms": 1234}
    assert await runs_trio.retry_later(store, 1, JOB, 1, INFLIGHT, **args)
    assert await runs_trio.attempt_state(store, 1, JOB) == ("dispatched", "1")
    assert (await store.hgetall(1, JOB))["reason"] == "exit_1"
    delayed = await store.call(1, lambda r: r.zrange(keys.DELAYED, 0, -1, withscores=True))
    assert [(str(m), int(s)) for m, s in delayed] == [(f"{QUEUE}|{JOB}", 1234)]
    assert await store.lrange(1, keys.attempts(JOB)) == ["{}"]


async def test_finish_malformed_ends_the_job_in_error(store, sync_runs) -> None:
    await _started(store, sync_runs)
    assert sync_runs.finish_malformed(JOB, 1, INFLIGHT, "no script")
    job = await store.hgetall(1, JOB)
    assert (job["status"], job["reason"]) == ("error", "malformed_job: no script")
    assert await _lease_left_ms(store) is None


async def test_requeue_gives_the_attempt_back(store, sync_runs) -> None:
    await _started(store, sync_runs, attempt="4")
    assert sync_runs.requeue(JOB, 5, INFLIGHT, QUEUE)
    assert await runs_trio.attempt_state(store, 1, JOB) == ("dispatched", "4")
    assert await store.lrange(1, QUEUE) == [JOB]
    assert await store.lrange(1, INFLIGHT) == []
    assert await runs_trio.running_jobs(store, 1) == []


async def test_move_due_queues_what_is_due_and_dead_letters_bad_members(store) -> None:
    members = {f"{QUEUE}|job:1:1": 100, "no-separator": 100, f"{JOB}|job:1:3": 100}
    members[f"{QUEUE}|job:1:2"] = 5000
    await store.hset(1, JOB, {"status": "dispatched"})  # a hash: LPUSH on it fails
    await store.call(1, lambda r: r.zadd(keys.DELAYED, members))
    assert await runs_trio.move_due(store, 1, 1000) == 5000
    assert await store.lrange(1, QUEUE) == ["job:1:1"]
    dead = sorted(d["key"] for d in await store.dead_letters(1))
    assert dead == [f"{JOB}|job:1:3", "no-separator"]
    assert await runs_trio.move_due(store, 1, 6000) == -1
    assert await store.lrange(1, QUEUE) == ["job:1:2", "job:1:1"]


async def test_move_due_takes_what_is_due_off_the_zset_in_one_zrem(store) -> None:  # noqa: ANN001
    """The due retries leave the delayed zset in one ZREM, not one per member, bad members
    included (dead-lettered); what is not due stays."""
    members = {f"{QUEUE}|job:1:{i}": 100 for i in range(1, 5)} | {"no-separator": 100}
    members[f"{QUEUE}|job:1:9"] = 5000
    await store.call(1, lambda r: r.zadd(keys.DELAYED, members))

    async def zrems() -> int:
        stats = await store.call(1, lambda r: r.info("commandstats"))
        return int(dict(stats).get("cmdstat_zrem", {}).get("calls", 0))

    before = await zrems()
    assert await runs_trio.move_due(store, 1, 1000) == 5000
    assert await zrems() - before == 1
    assert sorted(await store.lrange(1, QUEUE)) == [f"job:1:{i}" for i in range(1, 5)]
    assert [d["key"] for d in await store.dead_letters(1)] == ["no-separator"]
    left = await store.call(1, lambda r: r.zrange(keys.DELAYED, 0, -1))
    assert list(left) == [f"{QUEUE}|job:1:9"]


async def test_pop_first_moves_the_first_entry_of_the_first_list(store, sync_runs) -> None:
    await store.lpush(1, "queue:b", "job:1:2")
    await store.lpush(1, "queue:c", "job:1:3")
    assert sync_runs.pop_first(["queue:a", "queue:b", "queue:c"], INFLIGHT) == ("job:1:2", 0)
    assert await store.lrange(1, INFLIGHT) == ["job:1:2"]
    assert sync_runs.pop_first(["queue:a", "queue:b"], INFLIGHT) == (None, 1)


def test_a_popped_entry_that_is_not_utf8_comes_back_as_its_bytes(sync_runs) -> None:
    """Both pops hand an entry that is no UTF-8 text over as its bytes, as the node's store
    hands such a value over (bus/store/lane.py): no job key, and refused by its exact value."""
    first, second = b"job:1:\xff", b"job:1:\xfe"
    sync_runs.client.lpush("queue:b", first, second)
    assert sync_runs.pop_first(["queue:b"], INFLIGHT) == (first, 0)
    assert sync_runs.pop_started("queue:b", INFLIGHT, 1.0, 1, _take())[0] == second
    sync_runs.refuse(INFLIGHT, first, "not_utf8", "queue:b")
    assert sync_runs.client.lrange(INFLIGHT, 0, -1) == [second.decode("utf-8", "surrogateescape")]
    sync_runs.refuse(INFLIGHT, second, "not_utf8", "queue:b")
    assert sync_runs.held(INFLIGHT) == 0


async def test_a_runner_s_dead_letter_quotes_its_entry_as_the_store_s_does(
    store, sync_runs
) -> None:
    """A runner process and the node's store write one dead letter the same way: an entry too
    long to quote whole is cut once, with its own length (a runner's was cut twice, and its
    note then counted the cut text)."""
    entry = "job:1:" + "x" * 3000
    sync_runs.dead_letter(entry, "malformed", "a runner's refusal", QUEUE)
    await store.dead_letter(1, entry, "malformed", "the store's refusal", queue=QUEUE)
    quoted = {d["key"] for d in await store.dead_letters(1)}
    assert len(quoted) == 1
    assert quoted.pop().endswith(f"… ({len(entry)} chars)")


def _take() -> runs.NextJob:
    return runs.NextJob((QUEUE,), "base", 10_000, "python:0", script_type="python")


async def test_pop_started_after_a_lost_script_leaves_the_start_to_the_caller(
    store, sync_runs
) -> None:
    """The start pipelined behind the blocking pop finds no script on a restarted (or newly
    promoted) server: the entry comes back not started, for the runner to start, and the
    script is loaded again for the next pop."""
    assert sync_runs.pop_started(QUEUE, INFLIGHT, 0.05, 0, _take()) == (None, None)  # loads it
    await store.call(1, lambda r: r.script_flush())
    await store.hset(1, JOB, {"status": "dispatched", "attempt": "0", "script_type": "python"})
    await store.lpush(1, QUEUE, JOB)
    assert sync_runs.pop_started(QUEUE, INFLIGHT, 1.0, 0, _take()) == (JOB, None)
    assert await runs_trio.attempt_state(store, 1, JOB) == ("dispatched", "0")
    await store.hset(1, "job:1:2", {"status": "dispatched", "attempt": "0"})
    await store.lpush(1, QUEUE, "job:1:2")
    entry, begun = sync_runs.pop_started(QUEUE, INFLIGHT, 1.0, 1, _take())
    assert entry == "job:1:2"
    assert isinstance(begun, dict)
    assert begun["attempt"] == "1"


async def test_pop_started_gives_back_an_entry_it_did_not_move(store, sync_runs) -> None:
    """Only the pop writes the slot's in-flight list while it waits. Were another writer to
    push there (here: a length that leaves one entry out) while the pop times out, the
    script would start that entry, which nobody then runs, its lease renewed for ever by
    the slot's live process: it is given back to its queue instead."""
    await store.hset(1, JOB, {"status": "dispatched", "attempt": "0", "script_type": "python"})
    await store.lpush(1, INFLIGHT, JOB)
    assert sync_runs.pop_started(QUEUE, INFLIGHT, 0.05, 0, _take()) == (None, None)
    assert await runs_trio.attempt_state(store, 1, JOB) == ("dispatched", "0")
    assert await store.lrange(1, QUEUE) == [JOB]
    assert await store.lrange(1, INFLIGHT) == []
    assert await runs_trio.running_jobs(store, 1) == []


async def _ended(store, status: str = "error", attempt: str = "1") -> runs_trio.Answered:
    await store.hset(1, JOB, {"status": status, "attempt": attempt, "flow_id": ""})
    await store.lpush(1, keys.RESULTS_INFLIGHT, JOB)
    return runs_trio.Answered(JOB, status, attempt, '{"attempt": 1}')


async def test_answered_retry_sends_the_attempt_back_once(store) -> None:
    read = await _ended(store)
    args = {"cause": "exit_1", "due_ms": 99, "queue": QUEUE}
    assert await runs_trio.answered_retry(store, 1, read, **args)
    job = await store.hgetall(1, JOB)
    assert (job["status"], job["reason"], job["retry_of"]) == ("dispatched", "exit_1", "1")
    assert await store.call(1, lambda r: r.zscore(keys.DELAYED, f"{QUEUE}|{JOB}")) == 99
    assert await store.lrange(1, keys.RESULTS_INFLIGHT) == []
    assert await store.lrange(1, keys.attempts(JOB)) == ['{"attempt": 1}']
    assert not await runs_trio.answered_retry(store, 1, read, **args)  # its status changed


async def test_answer_local_answers_once_and_refuses_another_attempt(store) -> None:
    read = await _ended(store, "finished")
    args = {"result": {"a": "1"}, "request_key": "message:1:1", "reply": "{}", "reply_ttl_s": 60}
    stale = runs_trio.Answered(JOB, "finished", "2", "{}")
    assert not await runs_trio.answer_local(store, 1, stale, **args)  # not the attempt read
    assert "answered" not in await store.hgetall(1, JOB)
    assert await store.lrange(1, keys.RESULTS_INFLIGHT) == []  # taken off either way
    assert await runs_trio.answer_local(store, 1, read, **args)
    job = await store.hgetall(1, JOB)
    assert "answered" in job
    assert json.loads(job["result"]) == {"a": "1"}
    assert (await store.hgetall(1, "message:1:1"))["status"] == "processed"
    assert await store.lrange(1, keys.reply("message:1:1")) == ["{}"]
    assert not await runs_trio.answer_local(store, 1, read, **args)  # answered already
    assert await store.lrange(1, keys.reply("message:1:1")) == ["{}"]


async def test_answer_remote_queues_the_signed_result_once(store) -> None:
    read = await _ended(store)
    answer = Message(7, 9, 1, destination="origin")
    assert await runs_trio.answer_remote(store, 1, read, result={}, answer=answer)
    assert (await store.hgetall(1, answer.key))["destination"] == "origin"
    assert await store.lrange(1, keys.MSG_OUT) == [answer.key]
    assert not await runs_trio.answer_remote(store, 1, read, result={}, answer=answer)
    assert await store.lrange(1, keys.MSG_OUT) == [answer.key]


async def test_reap_ends_an_attempt_whose_lease_is_gone(store, sync_runs) -> None:
    await _started(store, sync_runs)
    assert not await runs_trio.reap(store, 1, JOB, "1", "runner_lost: x")  # the lease is live
    assert await runs_trio.lapsed(store, 1) == ([], pytest.approx(10, abs=1))  # seconds to go
    await _lapse(store)
    assert await runs_trio.lapsed(store, 1) == ([JOB], -1.0)
    assert not await runs_trio.reap(store, 1, JOB, "2", "runner_lost: x")  # not its attempt
    assert await store.lrange(1, keys.RESULTS) == []
    assert await runs_trio.reap(store, 1, JOB, "1", "runner_lost: x")
    job = await store.hgetall(1, JOB)
    assert (job["status"], job["reason"], job["result"]) == ("error", "runner_lost: x", "{}")
    assert await store.lrange(1, keys.RESULTS) == [JOB]
    assert await store.lrange(1, INFLIGHT) == []
    assert await runs_trio.running_jobs(store, 1) == []


async def test_runner_reads_and_plain_writes(store) -> None:
    assert await runs_trio.attempt_state(store, 1, JOB) == (None, None)
    await store.xadd_capped(1, keys.logs(JOB), {"stream": "stdout", "data": "hi"}, 10)
    await store.expire(1, keys.logs(JOB), 30)
    assert 0 < await _ttl_ms(store, keys.logs(JOB)) <= 30_000
    entries = await store.call(1, lambda r: r.xrange(keys.logs(JOB)))
    assert [dict(e[1]) for e in entries] == [{"stream": "stdout", "data": "hi"}]
    await store.call(1, lambda r: r.set("presence:runner:a", "{}"))
    assert await store.scan_keys(1, keys.PRESENCE_RUNNER_PATTERN) == ["presence:runner:a"]
    assert await store.get(1, "presence:runner:a") == "{}"
    await store.delete(1, ["presence:runner:a"])
    assert await store.get(1, "presence:runner:a") is None


async def test_register_runners_keeps_created_at(store) -> None:
    first = Runner(id="n:1:python:0", pubkey="ab", address="", topic=QUEUE, created_at=1)
    await slots.register_runners(store, 1, [first])
    again = Runner(id="n:1:python:0", pubkey="cd", address="", topic=QUEUE, created_at=2)
    await slots.register_runners(store, 1, [again])
    runner = await store.hgetall(1, keys.runner("n:1:python:0"))
    assert (runner["pubkey"], runner["created_at"]) == ("cd", "1")


async def test_write_presence_sets_each_heartbeat_with_its_ttl(store) -> None:
    await slots.write_presence(store, 1, {"a": '{"pid": 1}', "b": "{}"}, 15)
    assert await store.get(1, keys.presence_runner("a")) == '{"pid": 1}'
    assert 0 < await _ttl_ms(store, keys.presence_runner("b")) <= 15_000


async def test_hand_over_moves_one_job_between_lists(store) -> None:
    await store.lpush(1, INFLIGHT, "job:1:2", JOB)
    await slots.hand_over(store, 1, JOB, INFLIGHT, f"{INFLIGHT}:adopting")
    assert await store.lrange(1, INFLIGHT) == ["job:1:2"]
    assert await store.lrange(1, f"{INFLIGHT}:adopting") == [JOB]


async def test_a_take_that_finds_nothing_under_a_closed_breaker_reads_no_clock(
    store, sync_runs
) -> None:
    """A runner going idle (its end's take finds every list empty) spends no TIME on a
    breaker that is closed; an open one is still judged by Valkey's clock (no job taken)."""
    sync_runs.set_breaker("python", 1, 60_000, 1)

    async def times() -> int:
        stats = await store.call(0, lambda r: r.info("commandstats"))
        return int(dict(stats).get("cmdstat_time", {}).get("calls", 0))

    def end_then(take: runs.NextJob, job: str):  # noqa: ANN202
        # counted by the runner process (its sums), as runner processes end their attempts
        return sync_runs.finish_local(
            _ending(1, job), f"message:{job[4:]}", 60, take, stats=("{}", "")
        )

    await _started(store, sync_runs)
    before = await times()
    take = runs.NextJob((QUEUE,), "base", 10_000, "python:0", script_type="python")
    done, nxt = end_then(take, JOB)
    assert (done, nxt, take.found_empty) == (True, [], True)
    assert await times() == before
    await store.hset(1, keys.TYPE_BREAKERS, {"python|opened_ms": str(now_ms())})
    await _started(store, sync_runs, "job:1:2")
    await store.hset(1, "job:1:3", {"status": "dispatched", "attempt": "0"})
    await store.lpush(1, QUEUE, "job:1:3")
    take = runs.NextJob((QUEUE,), "base", 10_000, "python:0", script_type="python")
    done, nxt = end_then(take, "job:1:2")
    assert done
    assert nxt == []
    assert take.breaker_wait_ms > 0
    assert await times() > before
    assert await store.lrange(1, QUEUE) == ["job:1:3"]  # untouched
