"""One hostile entry never costs anything else: focused cases, one per reproduced flaw
(tests/intake/test_hostile.py throws generated content at every queue)."""

from __future__ import annotations

import json

import pytest
import trio

from bus.core import keys
from bus.core.models import Message
from bus.errors import ModelError
from crypto import read_key_file
from node.intake.messages import Rejected
from tests.intake.test_rejections import job_message


async def _push_all(node, queue: str, entries: list[str], ctx: int = 1) -> None:
    """One LPUSH: the node pops them oldest first (the order given)."""
    await node.store.lpush(ctx, queue, *entries)


def _restarts(node) -> dict[str, int]:
    return dict(node.info.state.counters.restarts)


async def _results(node, messages: list[Message]) -> list[str]:
    out = []
    with trio.fail_after(20):
        for m in messages:
            [result] = await node.client.wait_results(m, timeout_s=20)
            out.append(result.stdout)
    return out


def _surrogate_job(message: Message) -> dict[str, str]:
    """``message``'s hash with a lone surrogate escape in its job's script (plain ASCII JSON)."""
    fields = message.to_hash()
    job = json.loads(fields["job"])
    job[0]["script"] = "PLACEHOLDER"
    fields["job"] = json.dumps(job).replace("PLACEHOLDER", "echo \\ud800")
    return fields


def test_models_refuse_a_lone_surrogate_escape_naming_the_field() -> None:
    fields = {
        "id": "1",
        "caller_id": "1",
        "context_id": "1",
        "message_type": "job",
        "created_at": "1",
        "origin": "a",
        "destination": "b",
        "job": '[{"id":1,"caller_id":1,"context_id":1,"script":"echo \\ud800","script_type":"sh"}]',
    }
    with pytest.raises(ModelError, match="field 'job' holds a lone surrogate"):
        Message.from_hash(fields)
    pair = fields | {"job": fields["job"].replace("\\ud800", "\\ud83d\\ude00")}
    assert Message.from_hash(pair).job[0].script == "echo \U0001f600"


def test_refusal_details_always_encode() -> None:
    from bus.core.text import printable

    refused = Rejected("malformed", "script 'echo \ud800'")
    assert refused.detail.encode("utf-8") == b"script 'echo \\ud800'"
    assert printable(b"bad\xffkey") == "bad\\xffkey"
    assert printable("x" * 500, 10) == "x" * 10 + "… (500 chars)"


async def test_lone_surrogate_on_msg_out_costs_nothing_else(node_factory) -> None:
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    hostile = job_message(actor, 1, alice.node_id, alice.node_id, "print('never')", "sh")
    good = [job_message(actor, 1, alice.node_id, alice.node_id, f"print({i})") for i in range(3)]
    async with alice.store.transaction(1) as tx:
        tx.hset(hostile.key, _surrogate_job(hostile))
        for m in good:
            tx.hset(m.key, m.to_hash())
        tx.lpush(keys.MSG_OUT, [good[0].key, hostile.key, good[1].key, good[2].key])
    assert await _results(alice, good) == ["0\n", "1\n", "2\n"]
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == (hostile.key, "malformed")
    assert "surrogate" in entry["detail"]
    assert _restarts(alice) == {}


async def _wrong_type_batch(node, queue: str) -> None:
    actor = read_key_file(node.config.actor_key_path)
    good = [job_message(actor, 1, node.node_id, node.node_id, f"print({i})") for i in range(4)]
    for m in good:
        await node.store.hset(1, m.key, m.to_hash())
    await node.store.call(1, lambda r: r.set("message:1:77", "a string"))
    await node.store.call(1, lambda r: r.rpush("message:1:78", ["a", "list"]))
    entries = [good[0].key, "message:1:77", good[1].key, "message:1:78", good[2].key, good[3].key]
    await _push_all(node, queue, entries)
    assert await _results(node, good) == ["0\n", "1\n", "2\n", "3\n"]
    for m in good:
        assert (await node.store.hgetall(1, m.key))["status"] != "dispatched"
    letters = {e["key"]: (e["reason"], e["detail"]) for e in await node.store.dead_letters(1)}
    assert letters == {
        "message:1:77": ("wrong_type", "message:1:77 holds a string, not a hash"),
        "message:1:78": ("wrong_type", "message:1:78 holds a list, not a hash"),
    }
    assert _restarts(node) == {}


async def test_wrong_type_key_on_msg_out_costs_nothing_else(node_factory) -> None:
    await _wrong_type_batch(await node_factory("alice"), keys.MSG_OUT)


async def test_wrong_type_key_on_msg_in_costs_nothing_else(node_factory) -> None:
    await _wrong_type_batch(await node_factory("alice"), keys.MSG_IN)


async def test_non_utf8_entry_is_dead_lettered(node_factory) -> None:
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    good = job_message(actor, 1, alice.node_id, alice.node_id, "print('ok')")
    await alice.store.hset(1, good.key, good.to_hash())
    await alice.store.call(1, lambda r: r.lpush(keys.MSG_IN, [b"message:1:\xff", good.key]))
    assert await _results(alice, [good]) == ["ok\n"]
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == ("message:1:\\xff", "not_utf8")
    assert await alice.store.llen(1, keys.inflight("consumer")) == 0
    assert _restarts(alice) == {}


async def _hostile_keys(node, ctx: int = 1) -> dict[str, str]:
    """Keys a queue entry may name that no service can use, and the reason each earns."""
    await node.store.call(ctx, lambda r: r.set("job:1:901", "a string"))
    await node.store.call(ctx, lambda r: r.rpush("job:1:902", ["a", "list"]))
    await node.store.hset(ctx, "job:1:903", {"script": "print('no status')"})
    await node.store.hset(ctx, "job:1:904", {"status": "dispatched", "attempt": "lots"})
    return {
        "job:1:901": "wrong_type",
        "job:1:902": "wrong_type",
        "job:1:903": "malformed_job",
        "job:1:904": "malformed_job",
        "job:1:905": "missing_hash",
    }


async def _submit(node, actor, scripts: list[str]) -> list[Message]:
    return [
        await node.client.submit_job(
            actor, 1, to=node.node_id, context_id=1, script_type="python", script=s
        )
        for s in scripts
    ]


async def test_hostile_entries_on_a_runner_queue_cost_nothing_else(node_factory) -> None:
    # one slot: it takes entries oldest first, so the hostile ones are judged before the
    # jobs queued after them can answer
    alice = await node_factory("alice", runners={"python": 1, "sh": 1})
    actor = read_key_file(alice.config.actor_key_path)
    expected = await _hostile_keys(alice)
    before = await _submit(alice, actor, ["import time; time.sleep(0.3); print(0)", "print(1)"])
    await alice.store.call(1, lambda r: r.lpush(keys.queue("python"), [*expected, b"job:1:\xfe"]))
    after = await _submit(alice, actor, ["print(2)", "print(3)"])
    assert await _results(alice, before + after) == ["0\n", "1\n", "2\n", "3\n"]
    letters = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert letters == expected | {"job:1:\\xfe": "not_utf8"}
    assert await alice.store.llen(1, keys.inflight("runner:python:0")) == 0
    assert _restarts(alice) == {}


async def test_hostile_entries_on_results_cost_nothing_else(node_factory) -> None:
    from tests.runners.test_runners import External, submit

    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    expected = await _hostile_keys(alice)
    await alice.store.hset(
        1, "job:1:906", {"status": "finished", "started_at": "soon", "message_key": "message:1:1"}
    )
    expected = {k: "wrong_type" for k in ("job:1:901", "job:1:902")} | {
        "job:1:905": "missing_hash",
        "job:1:906": "malformed_job",
    }
    ext = External(alice.store, "ext-1", "ext")
    await ext.register()
    with trio.fail_after(20):
        msg = await submit(alice, "ext", "say 42")
        job, token = await ext.take()
        await alice.store.call(1, lambda r: r.lpush(keys.RESULTS, [*expected, b"job:1:\xfe"]))
        assert await ext.finish(job, token, "finished", {"stdout": "42"}) == 1
        [res] = await alice.client.wait_results(msg, 15)
    assert res.result == {"stdout": "42", "attempts": "1"}
    letters = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert letters == expected | {"job:1:\\xfe": "not_utf8"}
    assert await alice.store.llen(1, keys.inflight("results")) == 0
    assert _restarts(alice) == {}


async def test_hostile_flow_events_cost_nothing_else(node_factory) -> None:
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    await alice.store.call(1, lambda r: r.set(keys.flow(77), "a string"))
    hostile = ["abc", "-1", "9" * 40, "77", "123456"]
    await alice.store.call(1, lambda r: r.lpush(keys.FLOW_EVENTS, [*hostile, b"\xff"]))
    job = {"id": "a", "node": alice.node_id, "context": 1, "type": "python", "script": "print(5)"}
    spec = {"jobs": [job]}
    with trio.fail_after(20):  # one engine pops flow_events in order: the flow's come after
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=15)
    assert state.status.value == "finished"
    letters = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert letters == {
        "abc": "malformed_entry",
        "-1": "malformed_entry",
        "9" * 40: "malformed_entry",
        "77": "wrong_type",
        "123456": "unknown_flow",
        "\\xff": "not_utf8",
    }
    assert _restarts(alice) == {}


async def test_hostile_outbox_entries_cost_nothing_else(node_factory) -> None:
    from tests.nodes import link_to

    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await link_to(alice, bob)
    await alice.store.call(1, lambda r: r.set("message:1:77", "a string"))
    hostile = ["nonsense", "0|message:1:1", "-3|message:1:1", "999|message:1:1", "1|"]
    hostile += ["1|message:1:77", "1|message:1:78", "99999999999|message:1:1", "5|message:1:1"]
    await alice.store.call(0, lambda r: r.lpush(keys.outbox(bob.node_id), [*hostile, b"1|\xff"]))
    with trio.fail_after(20):
        msg = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print('hi')"
        )
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.stdout == "hi\n"
    letters = {e["key"]: e["reason"] for e in await alice.store.dead_letters(0)}
    assert letters == {
        "nonsense": "malformed_entry",
        "0|message:1:1": "malformed_entry",
        "-3|message:1:1": "malformed_entry",
        "999|message:1:1": "unknown_context",
        "1|": "malformed_entry",
        "1|message:1:77": "wrong_type",
        "1|message:1:78": "missing_hash",
        "99999999999|message:1:1": "malformed_entry",
        "5|message:1:1": "unknown_context",  # a database, but no context this node serves
        "1|\\xff": "not_utf8",
    }
    assert await alice.store.llen(0, keys.outbox_inflight(bob.node_id)) == 0
    assert _restarts(alice) == {}


async def test_stop_naming_a_key_of_another_type_costs_nothing_else(node_factory) -> None:
    from bus.core.envelope import sign_message
    from bus.core.ids import new_id, new_nonce, now
    from bus.core.models import MessageType

    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    await alice.store.call(1, lambda r: r.set("job:1:901", "a string"))
    stop = sign_message(
        Message(
            id=new_id(),
            caller_id=1,
            context_id=1,
            message=json.dumps({"job_key": "job:1:901"}),
            message_type=MessageType.STOP,
            created_at=now(),
            origin=alice.node_id,
            destination=alice.node_id,
            nonce=new_nonce(),
        ),
        actor,
    )
    good = job_message(actor, 1, alice.node_id, alice.node_id, "print('after')")
    async with alice.store.transaction(1) as tx:
        tx.hset(stop.key, stop.to_hash())
        tx.hset(good.key, good.to_hash())
        tx.lpush(keys.MSG_IN, [stop.key, good.key])  # one consumer: judged in this order
    assert await _results(alice, [good]) == ["after\n"]
    [entry] = await alice.store.dead_letters(1)
    assert (entry["key"], entry["reason"]) == (stop.key, "wrong_type")
    assert _restarts(alice) == {}


async def test_hostile_delayed_retries_cost_nothing_else(node_factory) -> None:
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    await alice.store.call(1, lambda r: r.set("job:1:901", "a string"))
    hostile = {"no separator": 0.0, "job:1:901|job:1:5": 0.0, b"\xff\xfe": 0.0}
    await alice.store.call(1, lambda r: r.zadd(keys.DELAYED, hostile))
    # a sandboxed job writes only its context's work dir, which its retry sees again
    script = (
        "import pathlib, sys\np = pathlib.Path('failed-once')\n"
        "if not p.exists():\n    p.touch()\n    sys.exit(1)\nprint('second')"
    )
    msg = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script=script, retries=1
    )
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert (result.stdout, result.result["attempts"]) == ("second\n", "2")
    letters = {e["key"]: e["reason"] for e in await alice.store.dead_letters(1)}
    assert letters == {
        "no separator": "malformed_entry",
        "job:1:901|job:1:5": "malformed_entry",
        "\\xff\\xfe": "malformed_entry",
    }
    assert _restarts(alice) == {}


async def test_signed_result_naming_a_key_of_another_type_costs_nothing_else(node_factory):
    from bus.core.envelope import ResultBody
    from bus.core.models import JobStatus
    from node.intake.messages import result_message
    from tests.nodes import link_to

    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await link_to(alice, bob)
    sent = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print('there')"
    )
    assert await _results(alice, [sent]) == ["there\n"]
    await alice.store.call(1, lambda r: r.set("job:1:901", "a string"))
    body = ResultBody(sent.key, "job:1:901", JobStatus.FINISHED, {"stdout": "forged"}, "")
    forged = result_message(bob.info.state, sent, body)  # signed by bob, a known peer
    good = job_message(actor, 1, alice.node_id, alice.node_id, "print('after')")
    async with alice.store.transaction(1) as tx:
        tx.hset(forged.key, forged.to_hash())
        tx.hset(good.key, good.to_hash())
        tx.lpush(keys.MSG_IN, [forged.key, good.key])
    assert await _results(alice, [good]) == ["after\n"]
    letters = {e["key"]: (e["reason"], e["detail"]) for e in await alice.store.dead_letters(1)}
    assert letters == {
        forged.key: ("wrong_type", "job:1:901 holds a string, not what a result updates")
    }
    assert _restarts(alice) == {}


async def test_the_reaper_passes_over_a_running_member_of_another_type(node_factory) -> None:
    from node.runners.external import reap, sweep

    alice = await node_factory("alice")
    await alice.store.call(1, lambda r: r.set("job:1:901", "a string"))
    await alice.store.call(1, lambda r: r.zadd(keys.RUNNING, {"job:1:901": 0}))  # lapsed
    assert await reap(alice.info.state, 1, "job:1:901") is False
    assert await sweep(alice.info.state, 1) == 0
