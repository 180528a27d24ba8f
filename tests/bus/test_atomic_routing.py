"""Each script of bus/store/atomic/queues.py, routing.py and flows.py on its own, against a real
Valkey:
what it writes and what it returns, refusals included."""

from __future__ import annotations

import pytest
import redis

from bus.core import keys
from bus.core.models import Message, MessageType
from bus.store.atomic import flows, queues, routing
from bus.store.connection import Store

CTX = 1
REQUEST = "message:7:1"
JOB = "job:7:1"


async def _zset(store: Store, key: str) -> list[tuple[str, float]]:
    return [
        (str(m), float(s))
        for m, s in await store.call(CTX, lambda r: r.zrange(key, 0, -1, withscores=True))
    ]


async def queued_job(store: Store, job_key: str) -> dict[str, str]:
    """The job hash without the stamp the job statistics add when it is first queued (checked
    to be there: Valkey's clock in ms)."""
    job = await store.hgetall(CTX, job_key)
    assert job.pop("stats_queued_ms").isdigit()
    return job


async def marker(store: Store, field: str) -> str | None:
    """A replay marker (data model v3: a field of the replay hash)."""
    value = await store.call(CTX, lambda r: r.hget(keys.REPLAY, field))
    return None if value is None else str(value)


async def marker_ttl_s(store: Store, field: str) -> int:
    """What is left of a replay marker's TTL (s; -2: no such marker)."""
    [ttl] = await store.call(CTX, lambda r: r.httl(keys.REPLAY, [field]))
    return int(ttl)


async def test_pop_batch_moves_oldest_first_and_reads_each_hash(store: Store) -> None:
    await store.hset(CTX, "job:1:1", {"a": "1"})
    await store.call(CTX, lambda r: r.set("job:1:2", "a string"))
    await store.lpush(CTX, "src", "job:1:1", "job:1:2", "job:1:3", "job:1:4")
    raw, version = await queues.pop_batch(store, CTX, "src", "fly", 3, read=True)
    assert version is None  # not asked for (registry=False)
    assert raw[0::2] == ["job:1:1", "job:1:2", "job:1:3"]
    assert raw[1] in (["a", "1"], {"a": "1"})
    assert raw[3] == "string"
    assert not raw[5]
    assert await store.lrange(CTX, "src") == ["job:1:4"]
    assert await store.lrange(CTX, "fly") == ["job:1:3", "job:1:2", "job:1:1"]
    assert await queues.pop_batch(store, CTX, "src", "fly", 5, read=False) == (["job:1:4"], None)
    assert await queues.pop_batch(store, CTX, "src", "fly", 5, read=False) == ([], None)


async def test_read_hash_and_read_hashes_name_the_wrong_type(store: Store) -> None:
    await store.hset(CTX, "h", {"f": "v"})
    await store.lpush(CTX, "l", "x")
    assert await queues.read_hash(store, CTX, "l") == "list"
    assert not await queues.read_hash(store, CTX, "absent")
    hashes = await queues.read_hashes(store, CTX, ["h", "l", "absent"])
    assert hashes[0] in (["f", "v"], {"f": "v"})
    assert hashes[1] == "list"
    assert not hashes[2]


async def test_recover_requeues_then_dead_letters_a_poison_entry(store: Store) -> None:
    await store.lpush(CTX, "fly", "a", "b")  # fly: b a (a popped first)
    assert await queues.recover(store, CTX, "fly", "src", max_deliveries=1, now=5) == 2
    assert await store.lrange(CTX, "src") == ["b", "a"]  # a is consumed first again
    assert not await store.lrange(CTX, "fly")
    await store.call(CTX, lambda r: r.lmove("src", "fly", "RIGHT", "LEFT"))  # "a" again
    assert await queues.recover(store, CTX, "fly", "src", max_deliveries=1, now=6) == 0
    assert await store.lrange(CTX, "src") == ["b"]
    (letter,) = await store.dead_letters(CTX)
    assert letter == {
        "key": "a",
        "reason": "too_many_deliveries",
        "detail": "delivered 2 times without being processed",
        "at": 6,
        "queue": "src",
        "count": 2,
    }
    assert await store.hgetall(CTX, keys.REDELIVERIES) == {"b": "1"}
    assert await store.call(CTX, lambda r: r.ttl(keys.REDELIVERIES)) > 0


async def test_retry_dead_redrives_once_and_leaves_what_names_no_queue(store: Store) -> None:
    await store.dead_letter(CTX, "k", "r1", queue="q")
    await store.dead_letter(CTX, "k", "r2", queue="q")
    await store.dead_letter(CTX, "k", "r3")  # refused where no retry can send it
    await store.lpush(CTX, keys.DLQ, "not json")
    await store.hset(CTX, keys.REDELIVERIES, {"k": "3"})
    assert await queues.retry_dead(store, CTX, "k") == 2
    assert await store.lrange(CTX, "q") == ["k"]
    assert [e for e in await store.lrange(CTX, keys.DLQ) if "r3" in e or e == "not json"]
    assert await store.llen(CTX, keys.DLQ) == 2
    assert await store.hgetall(CTX, keys.REDELIVERIES) == {}
    assert await queues.retry_dead(store, CTX, "other") == 0


async def test_purge_dead_deletes_only_the_key_s_letters(store: Store) -> None:
    for key in ("k", "other", "k"):
        await store.dead_letter(CTX, key, "r")
    await store.lpush(CTX, keys.DLQ, "not json")
    assert await queues.purge_dead(store, CTX, "k") == 2
    assert len(await store.lrange(CTX, keys.DLQ)) == 2


async def test_deliver_stores_and_queues_a_message_once(store: Store) -> None:
    await routing.deliver(store, CTX, [("message:1:0", {})])  # the script loaded
    await store.call(CTX, lambda r: r.delete([keys.MSG_IN]))
    batch = [("message:1:1", {"a": "1"}), ("message:1:2", {"b": "2"})]
    before = await _command_calls(store)
    assert await routing.deliver(store, CTX, batch) == [True, True]
    after = await _command_calls(store)
    # one script call and one LPUSH for the frame, not one of each per message
    assert after["evalsha"] - before.get("evalsha", 0) == 1
    assert after["lpush"] - before.get("lpush", 0) == 1
    again = [("message:1:1", {"a": "changed"})]
    assert await routing.deliver(store, CTX, again) == [False]
    assert await store.hgetall(CTX, "message:1:1") == {"a": "1"}
    assert await store.lrange(CTX, keys.MSG_IN) == ["message:1:2", "message:1:1"]


async def test_deliver_checks_a_frame_of_new_messages_in_one_exists(store: Store) -> None:
    """A frame whose messages are all new is checked by one EXISTS of every key, not one per
    message; a second copy in the same frame is still stored and queued once, and a frame that
    holds a message stored before still leaves that one as it was."""
    await routing.deliver(store, CTX, [("message:1:0", {})])  # the script loaded
    await store.call(CTX, lambda r: r.delete([keys.MSG_IN]))
    frame = [("message:2:1", {"a": "1"}), ("message:2:2", {"b": "2"})]
    frame += [("message:2:1", {"a": "again"}), ("message:2:3", {"c": "3"})]
    before = await _command_calls(store)
    assert await routing.deliver(store, CTX, frame) == [True, True, False, True]
    after = await _command_calls(store)
    assert after["exists"] - before.get("exists", 0) == 1
    assert await store.hgetall(CTX, "message:2:1") == {"a": "1"}
    queued = ["message:2:3", "message:2:2", "message:2:1"]
    assert await store.lrange(CTX, keys.MSG_IN) == queued
    frame = [("message:2:4", {"d": "4"}), ("message:2:2", {"b": "changed"})]
    assert await routing.deliver(store, CTX, frame) == [True, False]
    assert await store.hgetall(CTX, "message:2:2") == {"b": "2"}
    assert await store.lrange(CTX, keys.MSG_IN) == ["message:2:4", *queued]


async def test_mark_acked_only_by_the_destination(store: Store) -> None:
    await store.hset(CTX, "m1", {"destination": "peer", "status": "dispatched"})
    await store.hset(CTX, "m2", {"destination": "peer", "status": "processed"})
    await store.hset(CTX, "m3", {"destination": "someone else", "status": "dispatched"})
    assert await routing.mark_acked(store, CTX, ["m1", "m2", "m3"], now=9, peer="peer") == [
        True,
        True,
        False,
    ]
    m1 = await store.hgetall(CTX, "m1")
    assert m1 == {
        "destination": "peer",
        "status": "acknowledged",
        "acked_at": "9",
        "updated_at": "9",
    }
    assert (await store.hgetall(CTX, "m2"))["status"] == "processed"
    assert await store.hgetall(CTX, "m3") == {"destination": "someone else", "status": "dispatched"}


def _message(ident: int, nonce: str) -> Message:
    return Message(
        id=ident, caller_id=7, context_id=CTX, message="", message_type=MessageType.JOB, nonce=nonce
    )


async def test_materialise_writes_or_refuses_each_message_whole(store: Store) -> None:
    first, replay, reused_nonce, squatter = (
        _message(1, "n1"),
        _message(1, "n9"),
        _message(2, "n1"),
        _message(3, ""),
    )
    await store.lpush(CTX, "fly", first.key, squatter.key)
    write = queues.JobWrite(JOB, "queue:py", {"message_key": first.key, "x": "1"})
    stolen = queues.JobWrite(JOB, "queue:py", {"message_key": squatter.key})
    batch = [(first, [write]), (replay, [write]), (reused_nonce, []), (squatter, [stolen])]
    codes, depth, owners = await queues.materialise_batch(
        store, CTX, "fly", batch, now=50, window_s=60, depth_of=["queue:py", "queue:none"]
    )
    assert codes == [0, 1, 2, 3]
    assert depth == 1
    assert owners == ["", "", "", f"{JOB} {first.key}"]
    # counted for its actor's queue bound: the mark rides in the job's own write
    assert await queued_job(store, JOB) == {
        "message_key": first.key,
        "x": "1",
        "quota_counted": "1",
    }
    assert await store.hgetall(CTX, keys.QUOTA_DEPTH) == {"7": "1"}
    assert await store.lrange(CTX, "queue:py") == [JOB]
    assert await store.hgetall(CTX, first.key) == {"status": "acknowledged", "updated_at": "50"}
    assert await marker(store, keys.nonce(7, "n1")) == first.key
    assert 0 < await marker_ttl_s(store, keys.seen(first.key)) <= 60
    assert await store.lrange(CTX, "fly") == [squatter.key]  # refused: left for its refusal


async def _command_calls(store: Store) -> dict[str, int]:
    stats = await store.call(CTX, lambda r: r.info("commandstats"))
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def test_deliver_checks_a_frame_of_1000_new_messages_in_one_exists(store: Store) -> None:
    """A frame's keys are checked 1,000 an EXISTS (chunked.lua): a frame of 1,000 new
    messages, in one (it took two when this loop was written 500 a call), all stored."""
    await routing.deliver(store, CTX, [("message:1:0", {})])  # the script loaded
    frame = [(f"message:3:{i}", {"n": str(i)}) for i in range(1_000)]
    before = await _command_calls(store)
    assert await routing.deliver(store, CTX, frame) == [True] * 1_000
    after = await _command_calls(store)
    assert after["exists"] - before.get("exists", 0) == 1
    assert await store.llen(CTX, keys.MSG_IN) == 1_000


async def test_materialise_checks_a_new_message_in_one_exists(store: Store) -> None:
    """The common case, a new message naming new jobs, is checked by one EXISTS of its
    replay markers and job keys: no TYPE per job (each command inside a script is one of
    the node's per-job costs, bench case 5)."""
    message = _message(4, "n4")
    jobs = [queues.JobWrite(f"job:7:{i}", "queue:py", {"message_key": message.key}) for i in (4, 5)]
    before = await _command_calls(store)
    codes, _, _ = await queues.materialise_batch(
        store, CTX, "fly", [(message, jobs)], now=50, window_s=60, depth_of=[]
    )
    after = await _command_calls(store)
    assert codes == [0]
    assert after.get("type", 0) == before.get("type", 0)
    assert after["exists"] - before.get("exists", 0) == 1
    assert await store.lrange(CTX, "queue:py") == ["job:7:5", "job:7:4"]


async def test_write_own_job_never_overwrites_another_message_s_job(store: Store) -> None:
    await store.call(CTX, lambda r: r.set("job:7:9", "a string"))
    async with store.transaction(CTX) as tx:
        routing.write_own_job(tx, JOB, "m1", {"message_key": "m1", "v": "1"})
        routing.write_own_job(tx, JOB, "m2", {"message_key": "m2", "v": "2"})
        routing.write_own_job(tx, JOB, "m1", {"message_key": "m1", "v": "3"})
        routing.write_own_job(tx, "job:7:9", "m1", {"message_key": "m1"})
    assert await queued_job(store, JOB) == {"message_key": "m1", "v": "3"}
    assert await store.get(CTX, "job:7:9") == "a string"


def _write(job_key: str = JOB, status: str = "finished") -> routing.ResultWrite:
    return routing.ResultWrite(
        job_key=job_key,
        request=REQUEST,
        status=status,
        result='{"out": "1"}',
        reason="",
        stamp=70,
        request_status="processed",
        reply='{"done": true}',
        reply_ttl_s=30,
    )


async def test_apply_result_touches_only_the_request_s_own_job(store: Store) -> None:
    await store.hset(CTX, JOB, {"message_key": REQUEST, "flow_id": "4", "status": "started"})
    await store.hset(CTX, "job:7:2", {"message_key": "message:9:9", "status": "started"})
    async with store.transaction(CTX) as tx:
        routing.apply_result(tx, _write())
        routing.apply_result(tx, _write("job:7:2"))
    job = await store.hgetall(CTX, JOB)
    assert job["status"] == "finished"
    assert job["result"] == '{"out": "1"}'
    assert job["updated_at"] == "70"
    assert (await store.hgetall(CTX, "job:7:2"))["status"] == "started"
    request = await store.hgetall(CTX, REQUEST)
    assert request == {"status": "processed", "updated_at": "70", "processed_at": "70"}
    assert await store.lrange(CTX, keys.reply(REQUEST)) == ['{"done": true}'] * 2
    assert 0 < await store.call(CTX, lambda r: r.ttl(keys.reply(REQUEST))) <= 30
    assert await store.lrange(CTX, keys.FLOW_EVENTS) == ["4"]


def _accept(key: str, nonce: str = "", origin: str = "peer") -> routing.ResultAccept:
    return routing.ResultAccept(key, nonce, origin, _write())


async def _accept_all(store: Store, results: list[routing.ResultAccept]) -> list[tuple[str, str]]:
    return await routing.accept_results(store, CTX, "fly", results, window_s=60, node_id="me")


async def test_accept_results_checks_then_writes_atomically(store: Store) -> None:
    assert await _accept_all(store, [_accept("message:8:1")]) == [("unknown_request", "")]
    await store.hset(CTX, REQUEST, {"destination": "peer", "status": "acknowledged"})
    await store.hset(CTX, JOB, {"message_key": REQUEST})
    await store.lpush(CTX, "fly", "message:8:1", "message:8:2")
    verdicts = await _accept_all(
        store,
        [
            _accept("message:8:3", origin="stranger"),
            _accept("message:8:1", "nonce:8:x"),
            _accept("message:8:1"),
            _accept("message:8:2", "nonce:8:x"),
        ],
    )
    assert verdicts == [("wrong_signer", ""), ("ok", ""), ("replay", "message key")] + [
        ("replay", "nonce")
    ]
    assert (await store.hgetall(CTX, JOB))["status"] == "finished"
    assert await store.hgetall(CTX, "message:8:1") == {"status": "processed"}
    assert await marker(store, keys.seen("message:8:1")) == "1"
    assert await marker(store, "nonce:8:x") == "message:8:1"
    assert await store.lrange(CTX, "fly") == ["message:8:2"]
    assert await store.lrange(CTX, keys.reply(REQUEST)) == ['{"done": true}']


async def test_accepting_a_result_reads_no_type_of_its_reply_list(store: Store, redis_url) -> None:  # noqa: ANN001
    """The reply list's type is checked by its push, not by a TYPE read per result."""
    await store.hset(CTX, REQUEST, {"destination": "peer", "status": "acknowledged"})
    await store.hset(CTX, JOB, {"message_key": REQUEST})
    stats = redis.Redis.from_url(redis_url)
    before = int(stats.info("commandstats").get("cmdstat_type", {}).get("calls", 0))
    assert await _accept_all(store, [_accept("message:8:1")]) == [("ok", "")]
    assert int(stats.info("commandstats").get("cmdstat_type", {}).get("calls", 0)) == before
    assert await store.lrange(CTX, keys.reply(REQUEST)) == ['{"done": true}']
    stats.close()


async def test_accept_results_refuses_wrong_types_and_late_results(store: Store) -> None:
    """A reply list of another type is found by the result's push, its first write (no TYPE
    read per result): refused, nothing of it written."""
    await store.call(CTX, lambda r: r.set(keys.reply(REQUEST), "x"))
    await store.hset(CTX, REQUEST, {"destination": "peer", "status": "acknowledged"})
    await store.hset(CTX, JOB, {"message_key": REQUEST})
    ((reason, detail),) = await _accept_all(store, [_accept("message:8:1")])
    assert reason == "wrong_type"
    assert detail == f"{keys.reply(REQUEST)} holds a string"
    assert (await store.hgetall(CTX, JOB)).get("status") is None
    assert (await store.hgetall(CTX, REQUEST))["status"] == "acknowledged"
    assert await marker(store, keys.seen("message:8:1")) is None
    await store.call(CTX, lambda r: r.delete([keys.reply(REQUEST)]))
    await store.hset(
        CTX, REQUEST, {"destination": "peer", "status": "error", "reason": "timeout_ack: late"}
    )
    assert await _accept_all(store, [_accept("message:8:1")]) == [
        ("late_result", "timeout_ack: late")
    ]
    assert await marker(store, keys.seen("message:8:1")) is None
    assert not await store.exists(CTX, keys.reply(REQUEST))


async def test_flow_events_of_another_type_refuse_only_a_flow_s_result(store: Store) -> None:
    """flow_events is written only for a flow's job: a result of any other job is accepted
    whatever it holds; a flow's is refused (wrong_type), nothing of it written."""
    await store.call(CTX, lambda r: r.set(keys.FLOW_EVENTS, "x"))
    await store.hset(CTX, REQUEST, {"destination": "peer", "status": "acknowledged"})
    await store.hset(CTX, JOB, {"message_key": REQUEST, "flow_id": "4"})
    ((reason, detail),) = await _accept_all(store, [_accept("message:8:1")])
    assert (reason, detail) == ("wrong_type", f"{keys.FLOW_EVENTS} holds a string")
    assert await marker(store, keys.seen("message:8:1")) is None
    assert (await store.hgetall(CTX, JOB)).get("status") is None
    await store.call(CTX, lambda r: r.hdel(JOB, ["flow_id"]))
    assert await _accept_all(store, [_accept("message:8:1")]) == [("ok", "")]
    assert (await store.hgetall(CTX, JOB))["status"] == "finished"
    assert await store.get(CTX, keys.FLOW_EVENTS) == "x"


async def test_pop_due_takes_what_is_due_once(store: Store) -> None:
    members = {"ack|m1": 100, "result|m1": 200, "ack|m2": 300}
    await store.call(CTX, lambda r: r.zadd(keys.DEADLINES, members))
    assert await routing.pop_due(store, CTX, 200) == (300, ["ack|m1", "result|m1"])
    assert await routing.pop_due(store, CTX, 200) == (300, [])
    assert await routing.pop_due(store, CTX, 300) == (-1, ["ack|m2"])
    assert await _zset(store, keys.DEADLINES) == []


async def test_stop_job_by_the_status_the_job_had(store: Store) -> None:
    queue, delayed = keys.queue("py"), f"{keys.queue('py')}|{JOB}"
    await store.hset(CTX, JOB, {"status": "dispatched"})
    await store.lpush(CTX, queue, JOB, "job:7:2")
    await store.call(CTX, lambda r: r.zadd(keys.DELAYED, {delayed: 1}))
    assert await routing.stop_job(store, CTX, JOB, "py", reason="stopped: x", now=3) == "dispatched"
    assert await store.hgetall(CTX, JOB) == {
        "status": "error",
        "reason": "stopped: x",
        "updated_at": "3",
    }
    assert await store.lrange(CTX, queue) == ["job:7:2"]
    assert not await _zset(store, keys.DELAYED)
    await store.hset(CTX, "job:7:2", {"status": "started"})
    assert await routing.stop_job(store, CTX, "job:7:2", "py", reason="r", now=4) == "started"
    assert await store.lrange(CTX, keys.stop_queue("py")) == ["job:7:2"]
    assert (await store.hgetall(CTX, "job:7:2"))["status"] == "started"
    assert await routing.stop_job(store, CTX, JOB, "py", reason="again", now=5) == "error"
    assert (await store.hgetall(CTX, JOB))["reason"] == "stopped: x"
    assert await routing.stop_job(store, CTX, "job:7:3", "py", reason="r", now=5) == ""


async def test_due_to_events_moves_due_flows_onto_flow_events(store: Store) -> None:
    await store.call(CTX, lambda r: r.zadd(keys.FLOW_DEADLINES, {"1": 10, "2": 20, "3": 30}))
    assert await flows.due_to_events(store, CTX, 20) == 30
    assert sorted(await store.lrange(CTX, keys.FLOW_EVENTS)) == ["1", "2"]
    assert await _zset(store, keys.FLOW_DEADLINES) == [("3", 30.0)]
    assert await flows.due_to_events(store, CTX, 40) == -1


async def test_end_unfinished_leaves_final_jobs_as_they_are(store: Store) -> None:
    await store.hset(CTX, "job:7:1", {"status": "finished"})
    await store.hset(CTX, "job:7:2", {"status": "error", "reason": "own"})
    await store.hset(CTX, "job:7:3", {"status": "dispatched"})
    names = ["job:7:1", "job:7:2", "job:7:3", "job:7:4"]
    assert await flows.end_unfinished(store, CTX, names, "flow_deadline", 8) == 2
    assert await store.hgetall(CTX, "job:7:1") == {"status": "finished"}
    assert (await store.hgetall(CTX, "job:7:2"))["reason"] == "own"
    ended = {"status": "error", "reason": "flow_deadline", "updated_at": "8"}
    assert await store.hgetall(CTX, "job:7:3") == ended
    assert await store.hgetall(CTX, "job:7:4") == ended


def test_every_script_states_its_contract() -> None:
    from importlib import resources

    lua = resources.files("bus.store.atomic").joinpath("lua")
    mine = [f for f in lua.iterdir() if f.name.split("_")[0] in ("queues", "routing", "flows")]
    assert len(mine) >= 18
    for f in mine:
        head = f.read_text("utf-8").split("\n")[:14]
        assert head[0].startswith("-- "), f.name
        if "Fragment" not in head[0]:
            text = "\n".join(head)
            missing = [w for w in ("KEYS", "ARGV", "Returns", "Atomic effect") if w not in text]
            assert not missing, f.name


async def test_queue_outgoing_stores_the_message_and_queues_it(store: Store) -> None:
    message = _message(4, "n4")
    await routing.queue_outgoing(store, CTX, message)
    assert await store.hgetall(CTX, message.key) == message.to_hash()
    assert await store.lrange(CTX, keys.MSG_OUT) == [message.key]


async def test_accept_stop_marks_processed_sets_markers_and_acks(store: Store) -> None:
    await store.lpush(CTX, "fly", "message:7:1", "message:7:2")
    await routing.accept_stop(store, CTX, "fly", routing.StopAccept("message:7:1", 60, "n:7"))
    await routing.accept_stop(store, CTX, "fly", routing.StopAccept("message:7:2", 60, ""))
    assert await store.hgetall(CTX, "message:7:1") == {"status": "processed"}
    assert await marker(store, keys.seen("message:7:1")) == "1"
    assert 0 < await marker_ttl_s(store, keys.seen("message:7:1")) <= 60
    assert await marker(store, "n:7") == "message:7:1"
    assert 0 < await marker_ttl_s(store, "n:7") <= 60
    assert await marker(store, keys.seen("message:7:2")) == "1"
    assert not await store.lrange(CTX, "fly")


async def test_write_copies_writes_only_its_own_jobs(store: Store) -> None:
    await store.hset(CTX, "job:7:2", {"message_key": "message:9:9"})
    copies = [
        queues.JobWrite(JOB, "", {"message_key": REQUEST, "status": "error"}),
        queues.JobWrite("job:7:2", "", {"message_key": REQUEST, "status": "error"}),
    ]
    await routing.write_copies(store, CTX, REQUEST, copies)
    assert await queued_job(store, JOB) == {"message_key": REQUEST, "status": "error"}
    assert await store.hgetall(CTX, "job:7:2") == {"message_key": "message:9:9"}


async def test_push_outboxes_pushes_each_peer_s_entries(store: Store) -> None:
    await routing.push_outboxes(store, {"p1": ["1|a", "1|b"], "p2": ["1|c"]})
    assert await store.lrange(keys.ACTORS_DB, keys.outbox("p1")) == ["1|b", "1|a"]
    assert await store.lrange(keys.ACTORS_DB, keys.outbox("p2")) == ["1|c"]
    await routing.push_outboxes(store, {"p2": ["1|d", "1|e"]})  # one peer
    assert await store.lrange(keys.ACTORS_DB, keys.outbox("p2")) == ["1|e", "1|d", "1|c"]


async def test_route_queues_local_copies_jobs_arms_deadlines_and_acks(store: Store) -> None:
    await store.lpush(CTX, "fly", "local", REQUEST, "chat", "other")
    copy = queues.JobWrite(JOB, "", {"message_key": REQUEST, "updated_at": "5"})
    routed = [
        routing.Routed("local", True, [], None),
        routing.Routed(REQUEST, False, [copy], (1000, 2000)),
        routing.Routed("chat", False, [], None),
    ]
    await routing.route(store, CTX, "fly", routed)
    assert await store.lrange(CTX, keys.MSG_IN) == ["local"]
    assert await queued_job(store, JOB) == {"message_key": REQUEST, "updated_at": "5"}
    armed = [(f"ack|{REQUEST}", 1000.0), (f"result|{REQUEST}", 2000.0)]
    assert await _zset(store, keys.DEADLINES) == armed
    assert await store.lrange(CTX, "fly") == ["other"]


async def test_route_writes_no_copy_over_another_message_s_job_and_counts(store: Store) -> None:
    """In the same script: a copy whose key holds another message's job (or another type)
    is left as it is, the message is still acked with its deadlines armed; the jobs written
    for the first time are counted for the node (returned, not written)."""
    await store.lpush(CTX, "fly", REQUEST)
    await store.hset(CTX, "job:7:2", {"message_key": "message:9:9"})
    await store.lpush(CTX, "job:7:3", "a list")
    fields = {"message_key": REQUEST, "script_type": "sh", "status": "dispatched"}
    copies = [queues.JobWrite(k, "", fields) for k in (JOB, "job:7:2", "job:7:3")]
    counted: list[str] = []
    await routing.route(
        store, CTX, "fly", [routing.Routed(REQUEST, False, copies, (7, 9))], counted
    )
    assert await queued_job(store, JOB) == fields
    assert await store.hgetall(CTX, "job:7:2") == {"message_key": "message:9:9"}
    assert await store.lrange(CTX, "job:7:3") == ["a list"]
    assert await _zset(store, keys.DEADLINES) == [
        (f"ack|{REQUEST}", 7.0),
        (f"result|{REQUEST}", 9.0),
    ]
    assert await store.lrange(CTX, "fly") == []
    assert counted == ["submitted|sh", "1"]  # the one copy written
    assert not await store.exists(CTX, keys.STATS_JOBS)


async def test_deadline_members_arm_both_deadlines(store: Store) -> None:
    async with store.transaction(CTX) as tx:
        tx.zadd(keys.DEADLINES, routing.deadline_members("m1", 300, 100))
    assert await _zset(store, keys.DEADLINES) == [("result|m1", 100.0), ("ack|m1", 300.0)]


async def test_fail_request_fails_its_jobs_and_the_request(store: Store) -> None:
    await store.hset(CTX, JOB, {"message_key": REQUEST, "status": "dispatched"})
    await store.hset(CTX, REQUEST, {"status": "dispatched"})
    failed = routing.ResultWrite(JOB, REQUEST, "error", "{}", "timeout_ack", 70, "error", "{}", 30)
    await routing.fail_request(store, CTX, REQUEST, [failed], "timeout_ack: late")
    job = await store.hgetall(CTX, JOB)
    assert (job["status"], job["reason"]) == ("error", "timeout_ack")
    request = await store.hgetall(CTX, REQUEST)
    assert (request["status"], request["reason"]) == ("error", "timeout_ack: late")
    assert await store.lrange(CTX, keys.reply(REQUEST)) == ["{}"]


async def test_withdraw_empties_both_outbox_lists_of_the_entry(store: Store) -> None:
    await store.lpush(keys.ACTORS_DB, keys.outbox("p"), "1|a", "1|b", "1|a")
    await store.lpush(keys.ACTORS_DB, keys.outbox_inflight("p"), "1|a", "1|c")
    assert await routing.withdraw(store, "p", "1|a") == 1
    assert await store.lrange(keys.ACTORS_DB, keys.outbox("p")) == ["1|b"]
    assert await store.lrange(keys.ACTORS_DB, keys.outbox_inflight("p")) == ["1|c"]
    assert await routing.withdraw(store, "p", "1|a") == 0


async def test_a_batch_trims_its_in_flight_list_once_and_keeps_what_it_refused(
    store: Store,
) -> None:
    """More than two acks trim the in-flight list at once (LRANGE + DEL + RPUSH, no LREM per
    message): what the batch refused, and anything else there, stays, in its order."""
    ok = [_message(i, f"t{i}") for i in (20, 21, 22)]
    replay = _message(20, "t9")  # the same key as ok[0]: refused, waits for its dead letter
    entries = ["someone else's", ok[0].key, replay.key, ok[1].key, ok[2].key]
    await store.call(CTX, lambda r: r.rpush("fly", entries))
    batch = [
        (m, [queues.JobWrite(f"job:7:{m.id}", "queue:py", {"message_key": m.key})]) for m in ok
    ]
    batch.insert(1, (replay, []))
    before = await _command_calls(store)
    codes, _, _ = await queues.materialise_batch(
        store, CTX, "fly", batch, now=50, window_s=60, depth_of=[]
    )
    after = await _command_calls(store)
    assert codes == [0, 1, 0, 0]
    assert await store.call(CTX, lambda r: r.lrange("fly", 0, -1)) == ["someone else's", replay.key]
    assert after.get("lrem", 0) == before.get("lrem", 0)


async def test_a_job_queued_again_by_its_own_message_counts_once(store: Store) -> None:
    """The quota mark in the job's hash is the guard: a message materialised again (its markers
    gone) re-queues its job without counting it twice; its stop uncounts it once."""
    message = _message(30, "q30")
    job = queues.JobWrite(
        "job:7:30", "queue:py", {"message_key": message.key, "status": "dispatched"}
    )
    for _ in range(2):
        codes, _, _ = await queues.materialise_batch(
            store, CTX, "fly", [(message, [job])], now=50, window_s=60, depth_of=[]
        )
        assert codes == [0]
        await store.call(CTX, lambda r: r.delete([keys.REPLAY]))  # as if the window passed
        assert await store.hgetall(CTX, keys.QUOTA_DEPTH) == {"7": "1"}
    for _ in range(2):
        await routing.stop_job(store, CTX, job.key, "py", reason="stopped", now=51)
        assert await store.hgetall(CTX, keys.QUOTA_DEPTH) == {"7": "0"}


async def test_route_checks_new_copies_in_one_exists_and_guards_the_batch(store: Store) -> None:
    """New copies are checked by one EXISTS for the batch (no TYPE per copy); a second message
    of the same batch naming a copy the first just wrote is still refused that key."""
    first, second = "message:7:41", "message:7:42"
    await store.lpush(CTX, "fly", first, second)
    mine = queues.JobWrite("job:7:41", "", {"message_key": first})
    again = queues.JobWrite("job:7:41", "", {"message_key": second})
    own = queues.JobWrite("job:7:42", "", {"message_key": second})
    routed = [
        routing.Routed(first, False, [mine], None),
        routing.Routed(second, False, [again, own], None),
    ]
    before = await _command_calls(store)
    await routing.route(store, CTX, "fly", routed)
    after = await _command_calls(store)
    assert await queued_job(store, "job:7:41") == {"message_key": first}
    assert await queued_job(store, "job:7:42") == {"message_key": second}
    assert after["exists"] - before.get("exists", 0) == 1
    assert after.get("type", 0) - before.get("type", 0) == 1  # the one key written before


async def test_route_arms_a_batch_s_deadlines_in_one_zadd(store: Store) -> None:
    """The deadlines of a route batch's job messages go on the deadlines zset in one ZADD,
    not one per message: each message keeps its own two, and a message routed twice in the
    batch (a redelivery) keeps its last scores, as one ZADD each would leave them."""
    sent = ["message:7:51", "message:7:52", "message:7:53"]
    await store.lpush(CTX, "fly", *sent)
    routed = [routing.Routed(m, False, [], (10 + i, 20 + i)) for i, m in enumerate(sent)]
    routed.append(routing.Routed(sent[0], False, [], (30, 40)))
    before = await _command_calls(store)
    await routing.route(store, CTX, "fly", routed)
    after = await _command_calls(store)
    assert after["zadd"] - before.get("zadd", 0) == 1
    assert dict(await _zset(store, keys.DEADLINES)) == {
        f"ack|{sent[0]}": 30.0,
        f"result|{sent[0]}": 40.0,
        f"ack|{sent[1]}": 11.0,
        f"result|{sent[1]}": 21.0,
        f"ack|{sent[2]}": 12.0,
        f"result|{sent[2]}": 22.0,
    }
    assert await store.lrange(CTX, "fly") == []


async def test_a_batch_of_results_pushes_once_per_list_behind_each_lists_first(
    store: Store,
) -> None:
    """The results of one accept batch push their replies per list: a reply list's first push
    (its type check) at once, the list's later ones in one LPUSH, one EXPIRE per list, and the
    flows' events in one LPUSH; the client pops its replies in the order the results came, as
    one push each would leave them. A reply list of another type still refuses its result."""
    inbox, jobs, requests = "box", [f"job:7:{i}" for i in range(11, 15)], []
    for i, job in enumerate(jobs):
        request = f"message:7:{11 + i}"
        requests.append(request)
        await store.hset(CTX, request, {"destination": "peer", "status": "acknowledged"})
        await store.hset(CTX, job, {"message_key": request, "flow_id": str(i)})
    await store.call(CTX, lambda r: r.set(keys.reply_list(requests[3], ""), "x"))

    def result(i: int) -> routing.ResultAccept:
        reply_to = inbox if i < 3 else ""
        write = routing.ResultWrite(
            jobs[i], requests[i], "finished", "{}", "", 70, "processed", f'"r{i}"', 30, reply_to
        )
        return routing.ResultAccept(f"message:8:{11 + i}", "", "peer", write)

    before = await _command_calls(store)
    verdicts = await _accept_all(store, [result(i) for i in range(4)])
    after = await _command_calls(store)
    wrong = f"{keys.reply_list(requests[3], '')} holds a string"
    assert verdicts == [("ok", "")] * 3 + [("wrong_type", wrong)]
    got = {n: after.get(n, 0) - before.get(n, 0) for n in ("lpush", "expire")}
    # the inbox's first push, its two others, the flows' three events; the refused one's
    # failed push is counted too
    assert got == {"lpush": 4, "expire": 1}
    box = keys.reply_list(requests[0], inbox)
    assert await store.lrange(CTX, box) == ['"r2"', '"r1"', '"r0"']
    assert 0 < await store.call(CTX, lambda r: r.ttl(box)) <= 30
    assert await store.lrange(CTX, keys.FLOW_EVENTS) == ["2", "1", "0"]
    assert (await store.hgetall(CTX, jobs[3])).get("status") is None


async def test_materialise_reads_the_depths_once_when_the_context_is_bounded(
    store: Store,
) -> None:
    """With a bound on the context's depth, a batch reads the depths hash once (HGETALL): it
    gives the context's sum and every actor's count, so no HGET per actor and no HVALS; an
    actor the hash does not name holds none. The bounds hold as they did, message by message,
    counting what the batch queued before."""
    await store.hset(CTX, keys.QUOTA_DEPTH, {"7": "2", "8": "1", "9": "3"})

    def message(actor: int, ident: int, jobs: int) -> tuple[Message, list[queues.JobWrite]]:
        m = Message(
            id=ident, caller_id=actor, context_id=CTX, message="", message_type=MessageType.JOB
        )
        writes = [
            queues.JobWrite(
                f"job:{actor}:{ident}{i}", "queue:py", {"message_key": m.key, "script_type": "py"}
            )
            for i in range(jobs)
        ]
        return m, writes

    batch = [message(7, 41, 1), message(7, 42, 1), message(8, 43, 2), message(10, 44, 1)]
    before = await _command_calls(store)
    codes, _, owners = await queues.materialise_batch(
        store, CTX, "fly", batch, now=50, window_s=60, depth_of=[], bounds=(3, 9)
    )
    after = await _command_calls(store)
    assert codes == [0, 4, 0, 5]
    assert owners == ["", "3 3", "", "9 9"]
    reads = {n: after.get(n, 0) - before.get(n, 0) for n in ("hgetall", "hget", "hvals")}
    assert reads == {"hgetall": 1, "hget": 0, "hvals": 0}
    assert await store.hgetall(CTX, keys.QUOTA_DEPTH) == {"7": "3", "8": "3", "9": "3"}


@pytest.mark.parametrize(("count", "zrems"), [(5, 1), (8_500, 9)])
async def test_pop_due_takes_what_is_due_in_one_zrem_per_1000(
    store: Store, count: int, zrems: int
) -> None:
    """What is due leaves the deadlines zset in one ZREM per 1,000 members, not one per
    member (chunked.lua, through which every batched write of the scripts goes: Lua's
    unpack returns at most 8,000 values at once); what is not due stays."""
    members = {f"ack|m{i}": 100 + i % 100 for i in range(count)} | {"result|m9": 900}
    await store.call(CTX, lambda r: r.zadd(keys.DEADLINES, members))
    before = await _command_calls(store)
    after_s, due = await routing.pop_due(store, CTX, 200)
    after = await _command_calls(store)
    assert (after_s, sorted(due)) == (900, sorted(m for m in members if m != "result|m9"))
    assert after["zrem"] - before.get("zrem", 0) == zrems
    assert await _zset(store, keys.DEADLINES) == [("result|m9", 900.0)]
