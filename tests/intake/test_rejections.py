"""Bad input never runs and never stops a service: each refusal lands in the dlq with a reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import trio

from bus.core import keys
from bus.core.envelope import sign_message
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import JobStatus, Message, MessageType, RunnerJob
from crypto import KeyPair, read_key_file


class Ran:
    """Whether a job that must never run did: a sandboxed job writes only its context's work
    dir (``<home>/work/<context>``), so the marker is looked for in every node's under
    ``root`` (the homes of node_factory)."""

    name = "ran"

    def __init__(self, root: Path) -> None:
        self.root = root

    def exists(self) -> bool:
        return any(self.root.glob(f"*/work/*/{self.name}"))


def job_message(
    signer: KeyPair,
    caller: int,
    origin: str,
    dest: str,
    script: str,
    script_type: str = "python",
    ctx: int = 1,
) -> Message:
    job = RunnerJob(
        id=new_id(),
        caller_id=caller,
        context_id=ctx,
        script=script,
        script_type=script_type,
        created_at=now(),
    )
    msg = Message(
        id=new_id(),
        caller_id=caller,
        context_id=ctx,
        message_type=MessageType.JOB,
        job=[job],
        created_at=now(),
        origin=origin,
        destination=dest,
        nonce=new_nonce(),
    )
    return sign_message(msg, signer)


async def push_in(node, msg: Message, queue: str = keys.MSG_IN) -> None:
    async with node.store.transaction(msg.context_id) as tx:
        tx.hset(msg.key, msg.to_hash())
        tx.lpush(queue, [msg.key])


async def run_and_wait(node, actor: KeyPair, caller: int, ctx: int = 1):
    """A good job after the bad ones: proof that the service went on. It is pushed on msg_in
    behind them, which one consumer takes in order, so once its result is back every earlier
    message there was handled (a job submitted through msg_out would not wait for them: the
    supervisor queues a local job itself and a runner process answers it)."""
    msg = job_message(actor, caller, node.node_id, node.node_id, "print('still alive')", ctx=ctx)
    await push_in(node, msg)
    with trio.fail_after(15):
        [result] = await node.client.wait_results(msg, timeout_s=15)
    return result


async def test_tampered_message_is_dead_lettered_and_not_run(node_factory, tmp_path):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    marker = Ran(tmp_path)
    msg = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    evil = replace(msg.job[0], script=f"open({marker.name!r}, 'w').write('x')")
    await push_in(alice, replace(msg, job=[evil]))
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    [entry] = await alice.store.dead_letters(1)
    assert entry["key"] == msg.key
    assert entry["reason"] == "bad_signature"
    assert not marker.exists()
    assert not await alice.store.exists(1, evil.key) or (
        (await alice.store.hgetall(1, evil.key)).get("status") != "finished"
    )


async def test_supervisor_refuses_tampered_outgoing_message(node_factory, tmp_path):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    msg = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    await push_in(alice, replace(msg, destination="00" * 32), queue=keys.MSG_OUT)
    # the waiting client is told, instead of waiting forever
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.ERROR
    assert "bad_signature" in result.reason
    [entry] = await alice.store.dead_letters(1)
    assert entry["reason"] == "bad_signature"
    assert entry["key"] == msg.key


async def test_non_executor_is_refused(node_factory):
    alice = await node_factory("alice")
    stranger = KeyPair.generate()
    await alice.client.register_actor(9, stranger.public_hex)  # known, but not in context 1
    msg = await alice.client.submit_job(
        stranger, 9, to=alice.node_id, context_id=1, script_type="python", script="print('no')"
    )
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("permission_denied")
    [entry] = await alice.store.dead_letters(1)
    assert entry["reason"] == "permission_denied"
    assert entry["key"] == msg.key
    assert (await alice.store.hgetall(1, msg.key))["status"] == "error"


async def test_unknown_actor_and_malformed_hashes_at_the_consumer(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    ghost = job_message(KeyPair.generate(), 77, alice.node_id, alice.node_id, "print(1)")
    await push_in(alice, ghost)
    await alice.store.hset(1, "message:1:5", {"id": "5", "caller_id": "1", "job": "not json"})
    await alice.store.lpush(1, keys.MSG_IN, "message:1:5")
    await alice.store.lpush(1, keys.MSG_IN, "message:1:6")  # no hash at all
    good = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    wrong = json.loads(good.to_hash()["job"])
    wrong[0]["timeout"] = "soon"
    await alice.store.hset(1, good.key, good.to_hash() | {"job": json.dumps(wrong)})
    await alice.store.lpush(1, keys.MSG_IN, good.key)
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    reasons = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert reasons == {
        ghost.key: "unknown_signer",
        "message:1:5": "malformed",
        "message:1:6": "missing_hash",
        good.key: "malformed",
    }


async def test_unknown_script_type_ends_in_error(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="cobol", script="DISPLAY 'HI'."
    )
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.status is JobStatus.ERROR
    assert "unknown_script_type" in result.reason
    assert "cobol" in result.reason
    job = await alice.store.hgetall(1, result.job_key)
    assert job["status"] == "error"
    assert job["reason"].startswith("unknown_script_type")


async def test_failing_and_timed_out_scripts(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    failing = await alice.client.submit_job(
        actor, 1, to="ff" * 32, context_id=1, script_type="sh", script="echo oops >&2; exit 3"
    )
    slow = await alice.client.submit_job(
        actor,
        1,
        to=alice.node_id,
        context_id=1,
        script_type="python",
        script="import time; time.sleep(30)",
        timeout_s=1,
    )
    with trio.fail_after(20):
        [bad_route] = await alice.client.wait_results(failing, timeout_s=15)
        [timed_out] = await alice.client.wait_results(slow, timeout_s=15)
    assert bad_route.reason.startswith("unknown_destination")
    assert timed_out.status is JobStatus.ERROR
    assert timed_out.reason.startswith("timeout")
    failing = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="sh", script="echo oops >&2; exit 3"
    )
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(failing, timeout_s=15)
    assert result.status is JobStatus.ERROR
    assert result.result["exit_code"] == "3"
    assert result.result["stderr"] == "oops\n"
