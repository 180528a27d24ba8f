"""Result messages popped together are accepted together, and each bad one is refused alone."""

from __future__ import annotations

import json
from types import SimpleNamespace

import trio

from bus import keys
from bus.envelope import ResultBody
from bus.models import JobStatus, Message
from crypto import KeyPair, read_key_file
from node.messages import result_message
from tests.test_rejections import job_message

P, Q = KeyPair.generate(), KeyPair.generate()  # two peers of alice's


def answer(signer: KeyPair, request: Message, stdout: str) -> Message:
    """A result for ``request``'s job, signed by ``signer`` as that node would sign it."""
    body = ResultBody(request.key, request.job[0].key, JobStatus.FINISHED, {"stdout": stdout})
    node = SimpleNamespace(node_id=signer.public_hex, key=signer)
    return result_message(node, request, body)  # type: ignore[arg-type]


async def test_a_batch_of_results_with_bad_ones_among_them(node_factory):
    alice = await node_factory("alice")
    for peer in (P, Q):
        await alice.client.add_peer(peer.public_hex, "", name=peer.public_hex[:6])
    actor = read_key_file(alice.config.actor_key_path)
    # three requests alice sent to P: the third already failed with a timeout
    requests = [job_message(actor, 1, alice.node_id, P.public_hex, f"print({n})") for n in range(3)]
    async with alice.store.transaction(1) as tx:
        for request in requests:
            tx.hset(request.key, request.to_hash() | {"status": "dispatched"})
            tx.hset(request.job[0].key, request.job[0].to_hash())
        tx.hset(requests[2].key, {"status": "error", "reason": "timeout_result"})
    good1, good2 = answer(P, requests[0], "one"), answer(P, requests[1], "two")
    unknown = answer(P, job_message(actor, 1, alice.node_id, P.public_hex, "print(9)"), "?")
    wrong = answer(Q, requests[0], "from Q, who was not asked")
    tampered = answer(P, requests[1], "real")
    tampered_hash = tampered.to_hash() | {"message": tampered.message.replace('"real"', '"forged"')}
    late = answer(P, requests[2], "too late")
    async with alice.store.transaction(1) as tx:  # one push: the consumer pops them together
        for msg in (good1, good2, unknown, wrong, late):
            tx.hset(msg.key, msg.to_hash())
        tx.hset(tampered.key, tampered_hash)
        order = [good1, good1, unknown, wrong, tampered, late, good2]  # good1 twice: a replay
        tx.lpush(keys.MSG_IN, [m.key for m in order])
    with trio.fail_after(20):
        [one] = await alice.client.wait_results(requests[0], timeout_s=20)
        [two] = await alice.client.wait_results(requests[1], timeout_s=20)
    assert (one.status, one.result, two.result) == (
        JobStatus.FINISHED,
        {"stdout": "one"},
        {"stdout": "two"},
    )
    reasons = [(e["key"], e["reason"]) for e in await alice.store.dead_letters(1)]
    assert sorted(reasons) == sorted(
        [
            (good1.key, "replay"),
            (unknown.key, "unknown_request"),
            (wrong.key, "wrong_signer"),
            (tampered.key, "bad_signature"),
            (late.key, "late_result"),
        ]
    )
    for request in requests[:2]:  # one reply each: the replay was not applied again
        assert await alice.store.llen(1, keys.reply(request.key)) == 0
        assert (await alice.store.hgetall(1, request.key))["status"] == "processed"
    assert (await alice.store.hgetall(1, requests[2].key))["reason"] == "timeout_result"
    job = await alice.store.hgetall(1, requests[0].job[0].key)
    assert json.loads(job["result"]) == {"stdout": "one"}
    for msg in (good1, good2):
        assert (await alice.store.hgetall(1, msg.key))["status"] == "processed"
    assert await alice.store.lrange(1, keys.inflight("consumer")) == []
