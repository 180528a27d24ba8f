"""Result messages popped together are accepted together, and each bad one is refused alone."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import trio

from bus.core import keys
from bus.core.envelope import ResultBody, sign_message
from bus.core.ids import new_id
from bus.core.models import JobStatus, Message
from crypto import KeyPair, read_key_file
from node.host.signer import SIGNED_MEMORY, SignedResults
from node.intake.messages import result_message, signed_here
from tests.intake.test_rejections import job_message, push_in, run_and_wait
from tests.nodes import add_known_peers

P, Q = KeyPair.generate(), KeyPair.generate()  # two peers of alice's


# what result_message needs of those nodes (and what signed_here remembers for each)
def stand_in(k: KeyPair) -> SimpleNamespace:
    """The parts of a NodeState that result_message and signed_here use."""
    return SimpleNamespace(
        identity=SimpleNamespace(node_id=k.public_hex, key=k, signer=None),
        recent=SimpleNamespace(signed_results=SignedResults()),
    )


NODES = {k.public_hex: stand_in(k) for k in (P, Q)}


def answer(signer: KeyPair, request: Message, stdout: str) -> Message:
    """A result for ``request``'s job, signed by ``signer`` as that node would sign it."""
    body = ResultBody(request.key, request.job[0].key, JobStatus.FINISHED, {"stdout": stdout})
    node = NODES.setdefault(signer.public_hex, stand_in(signer))
    return result_message(node, request, body)  # type: ignore[arg-type]


async def test_a_batch_of_results_with_bad_ones_among_them(node_factory):
    alice = await node_factory("alice")
    await add_known_peers(alice, P, Q)
    actor = read_key_file(alice.config.actor_key_path)
    # three requests alice sent to P: the third already failed with a timeout
    requests = [job_message(actor, 1, alice.node_id, P.public_hex, f"print({n})") for n in range(3)]
    async with alice.store.transaction(1) as tx:
        for request in requests:
            tx.hset(request.key, request.to_hash() | {"status": "dispatched"})
            # as route_many writes the origin's copy: linked to its request
            tx.hset(request.job[0].key, request.job[0].to_hash() | {"message_key": request.key})
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
    probe = job_message(actor, 1, alice.node_id, alice.node_id, "print('probe')")
    await push_in(alice, probe)  # msg_in is worked off in order: its result comes after
    with trio.fail_after(20):
        [one] = await alice.client.wait_results(requests[0], timeout_s=20)
        [two] = await alice.client.wait_results(requests[1], timeout_s=20)
        [after] = await alice.client.wait_results(probe, timeout_s=20)
    assert after.stdout == "probe\n"
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


def test_signed_here_knows_only_what_result_message_signed():
    request = job_message(Q, 1, Q.public_hex, P.public_hex, "print(1)")
    mine, twin, copy = (answer(P, request, "x") for _ in range(3))
    other = sign_message(replace(mine, id=new_id(), signatures=[]), P)  # P's key, signed elsewhere
    p, q = NODES[P.public_hex], NODES[Q.public_hex]
    assert not signed_here(p, other)  # type: ignore[arg-type]
    assert not signed_here(q, mine)  # type: ignore[arg-type]  # signed as P, not as Q
    assert not signed_here(p, replace(twin, signatures=other.signatures))  # type: ignore[arg-type]
    assert signed_here(p, copy)  # type: ignore[arg-type]
    assert not signed_here(p, copy)  # type: ignore[arg-type]  # once: a re-route verifies in full


def test_the_memory_of_results_signed_here_forgets_the_oldest_first():
    """One bound for both writers of the memory: what result_message kept falls out once
    SIGNED_MEMORY newer signatures (here the signer's notices' kind) came after it, and
    signed_here then knows it no more (the result is verified in full)."""
    request = job_message(Q, 1, Q.public_hex, P.public_hex, "print(1)")
    node = stand_in(P)
    kept = result_message(node, request, ResultBody(request.key, "j", JobStatus.FINISHED, {}))
    memory: SignedResults = node.recent.signed_results
    for i in range(SIGNED_MEMORY - 1):
        memory.keep(f"k{i}", {"n": str(i)})
    assert len(memory) == SIGNED_MEMORY
    assert kept.key in memory
    memory.keep("one more", {})
    assert len(memory) == SIGNED_MEMORY
    assert kept.key not in memory
    assert "k0" in memory
    assert not signed_here(node, kept)  # type: ignore[arg-type]


async def test_results_in_msg_out_that_this_node_did_not_just_sign_are_verified(node_factory):
    """The supervisor's shortcut (check_outgoing) covers only results this process signed; a
    result signed elsewhere is verified in full and a forgery is refused at the origin. (One
    altered after signing is routed: the receiver verifies it, see the batch test above.)"""
    alice = await node_factory("alice")
    await alice.client.add_peer(P.public_hex, "", name="p")
    actor = read_key_file(alice.config.actor_key_path)
    me = read_key_file(alice.config.node_key_path)
    request = job_message(actor, 1, P.public_hex, alice.node_id, "print(1)")
    # alice's key, but not signed by alice's node process: verified in full, and routed
    fresh = answer(me, request, "signed with alice's key")
    forged = replace(answer(Q, request, "forged"), origin=alice.node_id)
    forged = sign_message(replace(forged, signatures=[]), Q)  # names alice, signed by Q
    async with alice.store.transaction(1) as tx:
        for msg in (fresh, forged):
            tx.hset(msg.key, msg.to_hash())
        tx.lpush(keys.MSG_OUT, [fresh.key, forged.key])
    assert (await run_and_wait(alice, actor, 1)).stdout == "still alive\n"
    [dead] = await alice.store.dead_letters(1)
    assert (dead["key"], dead["reason"]) == (forged.key, "wrong_signer")
    queued = await alice.store.lrange(0, keys.outbox(P.public_hex))
    assert queued == [keys.outbox_entry(1, fresh.key)]
