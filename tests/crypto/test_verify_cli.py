"""hero-verify on messages written by real nodes gives the verdict the node gave."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import trio

from bus.core import keys
from crypto import KeyPair, read_key_file
from tests.intake.test_rejections import job_message, push_in
from tests.intake.test_replay import sync
from tests.nodes import link_to


async def hero_verify(*args: str) -> tuple[int, dict]:
    done = await trio.run_process(
        [sys.executable, "-m", "bus.client.verify_cli", "verify", *args, "--json"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    out = done.stdout.decode()
    return done.returncode, (json.loads(out) if out.strip() else {"stderr": done.stderr.decode()})


async def test_verdicts_match_the_nodes(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    msg = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
    )
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.ok
    # bob accepted and ran the job message: hero-verify on bob's copy says valid
    code, verdict = await hero_verify(msg.key, "--redis", bob.info.redis_url, "--db", "1")
    assert (code, verdict["valid"], verdict["signer"]) == (0, True, actor.public_hex)
    # alice accepted bob's signed result: hero-verify on alice's copy says valid, by bob
    stored = await alice.store.call(1, lambda r: r.keys("message:*"))
    results = [
        k for k in stored if (await alice.store.hgetall(1, k)).get("message_type") == "result"
    ]
    code, verdict = await hero_verify(results[0], "--redis", alice.info.redis_url)
    assert (code, verdict["signer"]) == (0, bob.node_id)

    # what bob refused, hero-verify refuses for the same reason
    tampered = job_message(actor, 1, alice.node_id, bob.node_id, "print(1)")
    tampered = replace(tampered, job=[replace(tampered.job[0], script="print(2)")])
    ghost = job_message(KeyPair.generate(), 55, alice.node_id, bob.node_id, "print(1)")
    await push_in(bob, tampered)
    await push_in(bob, ghost)
    await sync(alice, bob, actor)
    node_reasons = {e["key"]: e["reason"] for e in await bob.store.dead_letters(1)}
    assert node_reasons == {tampered.key: "bad_signature", ghost.key: "unknown_signer"}
    for key, reason in node_reasons.items():
        code, verdict = await hero_verify(key, "--redis", bob.info.redis_url, "--db", "1")
        assert (code, verdict["valid"], verdict["reason"]) == (1, False, reason)


async def test_missing_message_and_max_age(node_factory):
    alice = await node_factory("alice")
    code, out = await hero_verify("message:1:404", "--redis", alice.info.redis_url)
    assert code == 2
    assert "no message hash" in out["stderr"]
    actor = read_key_file(alice.config.actor_key_path)
    old = job_message(actor, 1, alice.node_id, alice.node_id, "print(1)")
    old = replace(old, created_at=old.created_at - 1000)
    from bus.core.envelope import sign_message

    old = sign_message(replace(old, signatures=[]), actor)
    await alice.store.hset(1, old.key, old.to_hash())
    code, verdict = await hero_verify(old.key, "--redis", alice.info.redis_url)
    assert code == 0
    code, verdict = await hero_verify(old.key, "--redis", alice.info.redis_url, "--max-age", "300")
    assert (code, verdict["reason"]) == (1, "expired")
    assert keys.MSG_IN  # the message was never queued: hero-verify only reads
    assert await alice.store.llen(1, keys.MSG_IN) == 0
