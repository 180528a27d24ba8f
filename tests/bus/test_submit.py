"""Client submission: only the message is written (the node writes job hashes), concurrent
submissions are group-committed, and a job not routed yet is still found through its message."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import coredis
import pytest
import trio
import trio.testing
from coredis.tokens import PureToken

from bus.client.api import SUPERVISOR_INFLIGHT, Client, new_job
from bus.core import keys
from bus.core.envelope import sign_message, verify_message
from bus.core.models import JobStatus, Message, RunnerJob
from bus.errors import StoreError
from bus.store.connection import Store
from crypto import KeyPair, read_key_file
from tests.nodes import link_to

CTX = 1


async def _client(store: Store) -> tuple[Client, str]:
    """A client on a Redis that a node ran on (node:info), with no node running: nothing
    routes what is submitted."""
    node_id = KeyPair.generate().public_hex
    await store.hset(keys.ACTORS_DB, keys.NODE_INFO, {"id": node_id})
    return Client(store), node_id


async def _exec_calls(store: Store) -> int:
    stats = await store.call(CTX, lambda r: r.info("commandstats"))
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


async def test_submit_writes_only_the_message_and_the_job_is_found_through_it(store):
    client, node_id = await _client(store)
    actor = KeyPair.generate()
    msg = await client.submit_job(
        actor, 7, to="self", context_id=CTX, script_type="python", script="print(1)"
    )
    job_key = msg.job[0].key
    assert await store.lrange(CTX, keys.MSG_OUT) == [msg.key]
    assert not await store.exists(CTX, job_key)  # written by the node when it routes
    stored = await store.hgetall(CTX, msg.key)
    assert Message.from_hash(stored).signatures == msg.signatures
    assert "reason" not in stored  # unset extensions are not stored

    fields = await client.job_fields(CTX, job_key)
    assert fields["status"] == JobStatus.DISPATCHED.value
    assert fields["message_key"] == msg.key
    assert fields["script"] == "print(1)"
    assert fields["node"] == node_id
    assert fields["pending"].startswith("msg_out")
    report = await client.delivery_status(CTX, msg.key)
    assert report is not None
    assert report["state"] == "pending (msg_out)"
    assert report[job_key] == "dispatched (not routed yet)"

    # popped by the supervisor, not routed yet
    await store.pop_batch(CTX, keys.MSG_OUT, SUPERVISOR_INFLIGHT, 10)
    assert (await client.job_fields(CTX, job_key))["pending"].startswith("routing")
    assert await client.job_fields(CTX, keys.job(7, 12345)) == {}

    # a stop can be requested already: it names the job and follows its message
    stop = await client.stop_job(actor, 7, job_key, CTX)
    assert json.loads(stop.message) == {"job_key": job_key, "request": msg.key}
    assert stop.destination == node_id
    assert await store.lrange(CTX, keys.MSG_OUT) == [stop.key]


async def test_concurrent_submits_coalesce_and_all_land(store):
    client, _ = await _client(store)
    actor = KeyPair.generate()
    sent: list[Message] = []

    async def submit(i: int) -> None:
        sent.append(
            await client.submit_job(
                actor, 7, to="self", context_id=CTX, script_type="sh", script=f"echo {i}"
            )
        )

    before = await _exec_calls(store)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(submit, i)
    # the first caller writes alone; everyone who arrived meanwhile goes in the next write
    assert await _exec_calls(store) - before <= 2
    queued = await store.lrange(CTX, keys.MSG_OUT)
    assert sorted(queued) == sorted(m.key for m in sent)
    for message in sent:
        stored = Message.from_hash(await store.hgetall(CTX, message.key))
        assert stored.signed_content() == message.signed_content()
        assert stored.signatures == message.signatures


async def test_a_failing_write_raises_in_every_caller_it_carried(store):
    client, _ = await _client(store)
    actor = KeyPair.generate()
    await store.call(CTX, lambda r: r.set(keys.MSG_OUT, "not a list"))  # LPUSH fails: WRONGTYPE
    errors: list[BaseException] = []

    async def submit() -> None:
        try:
            await client.submit_job(
                actor, 7, to="self", context_id=CTX, script_type="sh", script="true"
            )
        except StoreError as exc:
            errors.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(submit)
    assert len(errors) == 6
    # the next write, on a usable msg_out, succeeds
    await store.call(CTX, lambda r: r.delete([keys.MSG_OUT]))
    msg = await client.submit_job(actor, 7, to="self", context_id=CTX, script_type="sh", script="")
    assert await store.lrange(CTX, keys.MSG_OUT) == [msg.key]


async def test_a_cancelled_waiter_withdraws_its_message(store, redis_url):
    client, _ = await _client(store)
    actor = KeyPair.generate()
    admin = coredis.Redis.from_url(redis_url, decode_responses=True)
    async with admin:
        await admin.client_pause(10_000, PureToken.WRITE)  # the first write blocks until unpaused
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.submit_job, actor, 7, **_JOB, script="first"))
                await trio.testing.wait_all_tasks_blocked()
                with trio.CancelScope() as scope:
                    nursery.start_soon(_cancel_when_blocked, scope)
                    await client.submit_job(actor, 7, **_JOB, script="withdrawn")
                assert scope.cancelled_caught
                await admin.client_unpause()
        await client.submit_job(actor, 7, **_JOB, script="next")  # joins the batch it left
    queued = await store.lrange(CTX, keys.MSG_OUT)
    scripts = [Message.from_hash(await store.hgetall(CTX, k)).job[0].script for k in queued]
    assert scripts == ["next", "first"]


_JOB: dict[str, Any] = {"to": "self", "context_id": CTX, "script_type": "sh"}


async def _cancel_when_blocked(scope: trio.CancelScope) -> None:
    await trio.testing.wait_all_tasks_blocked()
    scope.cancel()


async def test_submit_many_signs_each_message_and_writes_them_together(store):
    client, _ = await _client(store)
    actor = KeyPair.generate()
    jobs = [new_job(7, CTX, "sh", f"echo {i}") for i in range(600)]
    before = await _exec_calls(store)
    messages = await client.submit_many(actor, 7, to="self", context_id=CTX, jobs=jobs)
    assert await _exec_calls(store) - before == 2  # 512 messages per transaction
    assert [m.job for m in messages] == [[j] for j in jobs]
    assert len({m.signatures[0]["signature"] for m in messages}) == 600
    queued = await store.lrange(CTX, keys.MSG_OUT)
    assert queued[::-1] == [m.key for m in messages]  # popped from the right: in order
    with pytest.raises(Exception, match="at least one job"):
        await client.submit_many(actor, 7, to="self", context_id=CTX, jobs=[[]])
    assert await client.submit_many(actor, 7, to="self", context_id=CTX, jobs=[]) == []


async def test_the_origin_keeps_a_copy_of_a_job_sent_to_a_peer(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    with trio.fail_after(30):
        [msg, other] = await alice.client.submit_many(
            actor,
            1,
            to="bob",
            context_id=1,
            jobs=[new_job(1, 1, "sh", "echo one"), new_job(1, 1, "sh", "echo two")],
        )
        [result] = await alice.client.wait_results(msg, timeout_s=25)
        await alice.client.wait_results(other, timeout_s=25)
    assert result.stdout == "one\n"
    copy = await alice.store.hgetall(1, msg.job[0].key)
    assert copy["status"] == JobStatus.FINISHED.value
    assert copy["message_key"] == msg.key
    assert copy["script"] == "echo one"
    assert json.loads(copy["result"])["stdout"] == "one\n"


async def test_a_refused_job_has_a_failed_copy_at_its_origin(node_factory):
    alice = await node_factory("alice")
    stranger = KeyPair.generate()  # not a registered actor
    with trio.fail_after(20):
        msg = await alice.client.submit_job(
            stranger, 77, to="self", context_id=1, script_type="sh", script="true"
        )
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.ERROR
    copy = await alice.store.hgetall(1, msg.job[0].key)
    assert copy["status"] == JobStatus.ERROR.value
    assert copy["message_key"] == msg.key
    assert copy["script"] == "true"
    assert read_key_file(alice.config.actor_key_path).public_hex != stranger.public_hex


def test_the_stored_message_parses_back_to_the_signed_content():
    actor = KeyPair.generate()
    plain = new_job(7, CTX, "sh", "true")
    rich = RunnerJob(
        1, 7, CTX, "echo $A", "sh", timeout=5, retries=2, env_vars={"A": "é"}, depends=[3]
    )
    for jobs in ([plain], [plain, rich], [replace(rich, group="g", priority="high")]):
        message = sign_message(
            Message(1, 7, CTX, job=jobs, created_at=5, origin="a" * 64, destination="b" * 64),
            actor,
        )
        stored = message.to_hash()
        parsed = Message.from_hash(stored)
        assert parsed.signed_content() == message.signed_content()
        assert verify_message(parsed, actor.public_hex).ok
    assert json.loads(Message(1, 7, CTX, job=[plain]).to_hash()["job"]) == [
        {"id": plain.id, "caller_id": 7, "context_id": CTX, "script": "true", "script_type": "sh"}
    ]
