"""Dead letters: recorded with reason and count, inspected and re-driven by an operator."""

from __future__ import annotations

import sys

import trio

from bus.core import keys
from bus.core.models import JobStatus
from crypto import KeyPair, read_key_file


async def hero_node(node, *args: str) -> tuple[int, str, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "node.cli", "--home", str(node.config.home), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_operator_fixes_permissions_and_redrives(node_factory):
    alice = await node_factory("alice")
    newcomer = KeyPair.generate()
    await alice.client.register_actor(9, newcomer.public_hex)
    msg = await alice.client.submit_job(
        newcomer, 9, to=alice.node_id, context_id=1, script_type="python", script="print('finally')"
    )
    with trio.fail_after(20):
        [refused] = await alice.client.wait_results(msg, timeout_s=20)
    assert refused.reason.startswith("permission_denied")
    code, out, _ = await hero_node(alice, "dlq", "list")
    assert code == 0
    assert "permission_denied" in out
    assert msg.key in out
    code, out, _ = await hero_node(alice, "dlq", "show", msg.key)
    assert code == 0
    assert '"queue": "msg_out"' in out
    await alice.client.register_context(1, admins=[1], executors=[9])
    code, out, _ = await hero_node(alice, "dlq", "retry", msg.key)
    assert (code, out.strip()) == (0, "re-drove 1 of 1 message(s)")
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.stdout == "finally\n"
    assert await alice.store.dead_letters(1) == []
    code, out, _ = await hero_node(alice, "msg", "status", msg.key)
    assert code == 0
    assert out.startswith(f"{msg.key}: processed")
    assert "processed_at" in out


async def test_purge(node_factory):
    alice = await node_factory("alice")
    for i in range(3):
        await alice.store.dead_letter(1, f"message:1:{i}", "malformed", "test")
    code, out, _ = await hero_node(alice, "dlq", "purge", "message:1:1")
    assert out.strip() == "purged 1 dead letter(s)"
    code, out, _ = await hero_node(alice, "dlq", "purge", "--all")
    assert out.strip() == "purged 2 dead letter(s)"
    assert await alice.store.dead_letters(1) == []
    code, _, err = await hero_node(alice, "dlq", "purge")
    assert code == 1
    assert "give a key or --all" in err


async def test_poison_message_goes_to_the_dlq_after_repeated_redelivery(store):
    await store.lpush(1, "inflight:consumer", "message:1:7")
    for _ in range(3):  # three crashed runs left it in flight
        assert await store.recover(1, "inflight:consumer", "msg_in", max_redeliveries=3) == 1
        await store.call(1, lambda r: r.lmove("msg_in", "inflight:consumer", "RIGHT", "LEFT"))
    assert await store.recover(1, "inflight:consumer", "msg_in", max_redeliveries=3) == 0
    [entry] = await store.dead_letters(1)
    assert entry["reason"] == "too_many_deliveries"
    assert entry["count"] == 4
    assert await store.llen(1, "msg_in") == 0
    assert await store.retry_dead_letter(1, "message:1:7") == 1
    assert await store.lrange(1, "msg_in") == ["message:1:7"]


async def test_oversize_message_is_refused_before_sending(node_factory):
    alice = await node_factory("alice", max_frame_bytes=20_000)
    bob = await node_factory("bob")
    actor = read_key_file(alice.config.actor_key_path)
    await alice.client.add_peer(bob.node_id, bob.info.ws_url, name="bob")
    await bob.client.add_peer(alice.node_id, "", name="alice")
    big = "x = '" + "a" * 30_000 + "'\nprint(len(x))"
    msg = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script=big
    )
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("oversize")
    [entry] = await alice.store.dead_letters(1)
    assert (entry["reason"], entry["queue"]) == ("oversize", keys.MSG_OUT)
