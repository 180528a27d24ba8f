"""The transactions of bus/store/atomic/flows.py on their own, against a real Valkey: what each
writes (the flow engine's scripts are tested in test_atomic_routing.py)."""

from __future__ import annotations

from bus.core import keys
from bus.core.models import Message, MessageType
from bus.store.atomic import flows
from bus.store.connection import Store

CTX = 1


async def _ttl(store: Store, key: str) -> int:
    return int(await store.call(CTX, lambda r: r.ttl(key)))


async def test_set_jobs_sets_the_fields_on_each_job(store: Store) -> None:
    await store.hset(CTX, "job:7:1", {"status": "waiting_for_prerequisites", "x": "1"})
    failed = {"status": "error", "reason": "prerequisite_failed"}
    await flows.set_jobs(store, CTX, ["job:7:1", "job:7:2"], failed)
    assert await store.hgetall(CTX, "job:7:1") == failed | {"x": "1"}
    assert await store.hgetall(CTX, "job:7:2") == failed
    await flows.set_jobs(store, CTX, [], failed)  # nothing to write is no error


async def test_release_writes_the_copy_and_queues_its_message(store: Store) -> None:
    message = Message(
        id=5, caller_id=7, context_id=CTX, message="m", message_type=MessageType.FLOW_JOB
    )
    copy = {"status": "dispatched", "message_key": message.key}
    await flows.release(store, CTX, "job:7:1", copy, message)
    assert await store.hgetall(CTX, "job:7:1") == copy
    assert await store.hgetall(CTX, message.key) == message.to_hash()
    assert await store.lrange(CTX, keys.MSG_OUT) == [message.key]


async def test_write_flow_rearms_an_open_flow_and_retires_a_final_one(store: Store) -> None:
    await store.call(CTX, lambda r: r.sadd(keys.FLOWS_ACTIVE, ["4"]))
    running = {"status": "running", "result": "{}"}
    await flows.write_flow(store, CTX, flows.FlowWrite(4, running, False, 90, 30))
    assert await store.hgetall(CTX, keys.flow(4)) == running
    assert await store.smembers(CTX, keys.FLOWS_ACTIVE) == {"4"}
    deadlines = await store.call(CTX, lambda r: r.zscore(keys.FLOW_DEADLINES, "4"))
    assert deadlines == 90
    assert await store.lrange(CTX, keys.flow_progress(4)) == ["running"]
    assert 0 < await _ttl(store, keys.flow_progress(4)) <= 30

    await flows.write_flow(store, CTX, flows.FlowWrite(4, {"status": "running"}, False, None, 30))
    assert await store.call(CTX, lambda r: r.zscore(keys.FLOW_DEADLINES, "4")) == 90

    await flows.write_flow(store, CTX, flows.FlowWrite(4, {"status": "finished"}, True, 99, 60))
    assert (await store.hgetall(CTX, keys.flow(4)))["status"] == "finished"
    assert await store.smembers(CTX, keys.FLOWS_ACTIVE) == set()
    assert await store.call(CTX, lambda r: r.zscore(keys.FLOW_DEADLINES, "4")) is None
    progress = ["finished", "running", "running"]
    assert await store.lrange(CTX, keys.flow_progress(4)) == progress
    assert 30 < await _ttl(store, keys.flow_progress(4)) <= 60
