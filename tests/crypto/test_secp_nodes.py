"""secp256k1 and Ed25519 actors on real nodes: both run jobs, locally and across a link; each
bad key or signature is dead-lettered with its own reason and the supervisor goes on."""

from __future__ import annotations

from dataclasses import replace

import trio

from bus.core import keys
from bus.core.envelope import sign_message
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import FlowStatus, Message, MessageType, RunnerJob
from bus.store.connection import open_store
from crypto import KeyPair, Secp256k1KeyPair, read_key_file, write_key_file
from crypto.secp256k1 import CURVE_ORDER
from node.daemon import run_node
from node.host.acl import role_url
from node.host.home import init_home
from tests.intake.test_rejections import Ran
from tests.nodes import link_to

SECP_ACTOR = 7
FIELD_P = 2**256 - 2**32 - 977
G_UNCOMPRESSED = (
    "0479be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
    "483ada7726a3c4655da4fbfc0e1108a8fd17b448a68554199c47d08ffb10d4b8"
)


def off_curve_key() -> str:
    """A compressed key whose x has no point: x^3 + 7 is not a square mod p."""
    x = 1
    while pow((x**3 + 7) % FIELD_P, (FIELD_P - 1) // 2, FIELD_P) != FIELD_P - 1:
        x += 1
    return "02" + x.to_bytes(32, "big").hex()


def job_message(signer: KeyPair | Secp256k1KeyPair, caller: int, node_id: str, script: str):
    job = RunnerJob(
        id=new_id(),
        caller_id=caller,
        context_id=1,
        script=script,
        script_type="python",
        created_at=now(),
    )
    message = Message(
        id=new_id(),
        caller_id=caller,
        context_id=1,
        message_type=MessageType.JOB,
        job=[job],
        created_at=now(),
        origin=node_id,
        destination=node_id,
        nonce=new_nonce(),
    )
    return sign_message(message, signer)


def with_entry(message: Message, **changes: str) -> Message:
    [entry] = message.signatures
    return replace(message, signatures=[{**entry, **changes}])


def high_s(message: Message) -> Message:
    signature = message.signatures[0]["signature"]
    s = CURVE_ORDER - int(signature[64:], 16)
    return with_entry(message, signature=signature[:64] + s.to_bytes(32, "big").hex())


async def push_out(node, message: Message) -> None:
    async with node.store.transaction(1) as tx:
        tx.hset(message.key, message.to_hash())
        tx.lpush(keys.MSG_OUT, [message.key])


async def run_job(node, signer, caller: int, to: str, script: str):
    message = await node.client.submit_job(
        signer, caller, to=to, context_id=1, script_type="python", script=script
    )
    with trio.fail_after(25):
        [result] = await node.client.wait_results(message, timeout_s=20)
    return result


async def add_secp_actor(node, key: Secp256k1KeyPair, executors: list[int]) -> None:
    await node.client.register_actor(SECP_ACTOR, key.public_hex, algorithm="secp256k1")
    await node.client.register_context(1, admins=[1, 2], executors=executors)


async def test_secp256k1_and_ed25519_actors_both_run_jobs_across_a_link(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    ed = await link_to(alice, bob)
    secp = Secp256k1KeyPair.generate()
    # the origin too must know the actor and let it execute (it admits the message first)
    await add_secp_actor(alice, secp, [SECP_ACTOR])
    await add_secp_actor(bob, secp, [alice.config.actor_id, SECP_ACTOR])
    stored = await bob.store.hgetall(0, keys.actor(SECP_ACTOR))
    assert stored["algorithm"] == "secp256k1"
    assert stored["pubkey"] == secp.public_hex
    for node in (alice, bob):
        result = await run_job(alice, secp, SECP_ACTOR, node.node_id, "print('k1')")
        assert result.ok, result
        assert result.stdout == "k1\n"
        ran_there = await node.store.hgetall(1, result.job_key)
        assert ran_there["status"] == "finished"
    result = await run_job(alice, ed, 1, bob.node_id, "print('ed')")
    assert result.stdout == "ed\n"
    assert await bob.store.dead_letters(1) == []
    assert await alice.store.dead_letters(1) == []


async def test_bad_keys_and_signatures_are_refused_each_with_its_reason(node_factory, tmp_path):
    alice = await node_factory("alice")
    secp = Secp256k1KeyPair.generate()
    await add_secp_actor(alice, secp, [SECP_ACTOR])
    ed = read_key_file(alice.config.actor_key_path)
    marker = Ran(tmp_path)
    script = f"open({marker.name!r}, 'a').write('x')"

    def bad(change) -> Message:  # noqa: ANN001 - a function of a message
        return change(job_message(secp, SECP_ACTOR, alice.node_id, script))

    cases = {
        "malformed_key": bad(lambda m: with_entry(m, public_key="05" + secp.public_hex[2:])),
        "uncompressed_key": bad(lambda m: with_entry(m, public_key=G_UNCOMPRESSED)),
        "invalid_point": bad(lambda m: with_entry(m, public_key=off_curve_key())),
        "high_s": bad(high_s),
        # an Ed25519 signature on the message of a secp256k1 actor
        "wrong_algorithm": job_message(ed, SECP_ACTOR, alice.node_id, script),
    }
    for message in cases.values():
        await push_out(alice, message)
    # the supervisor handles msg_out in order: once this one is back, the bad ones were judged
    result = await run_job(alice, secp, SECP_ACTOR, alice.node_id, "print('still alive')")
    assert result.stdout == "still alive\n"
    assert (await run_job(alice, ed, 1, alice.node_id, "print(2)")).stdout == "2\n"
    letters = {entry["key"]: entry for entry in await alice.store.dead_letters(1)}
    for reason, message in cases.items():
        assert letters[message.key]["reason"] == reason, letters[message.key]
    assert len(letters) == len(cases)
    assert not marker.exists()


async def test_a_context_that_accepts_only_ed25519_refuses_a_secp256k1_actor(node_factory):
    alice = await node_factory("alice", algorithms={"1": ["ed25519"]})
    secp = Secp256k1KeyPair.generate()
    await add_secp_actor(alice, secp, [SECP_ACTOR])
    refused = job_message(secp, SECP_ACTOR, alice.node_id, "print('no')")
    await push_out(alice, refused)
    ed = read_key_file(alice.config.actor_key_path)
    assert (await run_job(alice, ed, 1, alice.node_id, "print('yes')")).stdout == "yes\n"
    [entry] = await alice.store.dead_letters(1)
    assert entry["key"] == refused.key
    assert entry["reason"] == "wrong_algorithm"
    assert "secp256k1 keys are not accepted" in entry["detail"]


FLOW = {
    "name": "k1",
    "jobs": [{"id": "A", "node": "self", "context": 1, "type": "sh", "script": "echo flow by k1"}],
}


async def test_a_secp256k1_actor_runs_a_flow(node_factory):
    alice = await node_factory("alice")
    secp = Secp256k1KeyPair.generate()
    await add_secp_actor(alice, secp, [SECP_ACTOR])
    with trio.fail_after(30):
        flow_id = await alice.client.submit_flow(secp, SECP_ACTOR, FLOW, context_id=1)
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=25)
    assert state.status is FlowStatus.FINISHED, state
    assert state.job("A").stdout == "flow by k1\n"


async def test_a_flow_of_an_algorithm_the_context_refuses_ends_in_error(node_factory):
    alice = await node_factory("alice", algorithms={"1": ["ed25519"]})
    secp = Secp256k1KeyPair.generate()
    await add_secp_actor(alice, secp, [SECP_ACTOR])
    with trio.fail_after(30):
        flow_id = await alice.client.submit_flow(secp, SECP_ACTOR, FLOW, context_id=1)
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=25)
    assert state.status is FlowStatus.ERROR, state
    assert state.reason.startswith("wrong_algorithm"), state.reason
    assert state.job("A").stdout == ""


async def test_a_home_whose_actor_key_is_secp256k1_registers_its_actor_so(
    tmp_path, valkey_factory, nursery
):
    """The node registers its home's default actor from actor.key at start, with the key's own
    algorithm: a secp256k1 actor.key must not be registered as an Ed25519 key."""
    config = init_home(
        tmp_path / "h", name="h", listen_port=0, redis_url=valkey_factory().url, console_listen=""
    )
    key = Secp256k1KeyPair.generate()
    write_key_file(config.actor_key_path, key, overwrite=True)
    with trio.CancelScope() as scope:
        info = await nursery.start(run_node, config)
        async with open_store(role_url(config, info.redis_url)) as store:
            actor = await store.get_actor(config.actor_id)
        scope.cancel()
    assert actor is not None
    assert (actor.pubkey, actor.algorithm) == (key.public_hex, "secp256k1")
