"""Flows end to end: DAGs of jobs across real nodes, failure policy, refusals, restarts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from bus.client.api import Client
from bus.core import keys
from bus.core.dag import FlowError
from bus.core.envelope import sign_message
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import FlowStatus, JobStatus, Message
from bus.store.connection import open_store
from crypto import KeyPair, read_key_file
from node.daemon import run_node
from node.flows import engine
from node.flows.engine import evaluate
from node.host.home import init_home
from node.intake.messages import Rejected
from node.state import NodeState

B_SCRIPT = "import os\nprint(int(os.environ['HERO_DEP_A_STDOUT']) * 7)"
C_SCRIPT = "echo $((HERO_DEP_A_STDOUT + 1))"
D_SCRIPT = (
    "import json, os\n"
    "b, c = int(os.environ['HERO_DEP_B_STDOUT']), int(os.environ['HERO_DEP_C_STDOUT'])\n"
    "deps = json.loads(os.environ['HERO_DEPS_JSON'])\n"
    "print(f\"{b}+{c}={b + c} ({','.join(sorted(deps))}) {os.environ['GREETING']}\")"
)


async def mesh(origin, *others) -> KeyPair:
    """Every node knows every other; origin's actor 1 may execute in context 1 everywhere."""
    nodes = [origin, *others]
    for a in nodes:
        for b in nodes:
            if a is not b:
                await a.client.add_peer(b.node_id, b.info.ws_url, name=b.config.name)
    actor = read_key_file(origin.config.actor_key_path)
    for other in others:
        await other.client.register_actor(1, actor.public_hex)
        await other.client.register_context(1, admins=[1])
    return actor


def job(jid: str, node: str, script: str, kind: str = "python", depends=(), **extra) -> dict:
    return {
        "id": jid,
        "node": node,
        "context": 1,
        "type": kind,
        "script": script,
        "depends": list(depends),
        **extra,
    }


def diamond(a: str, b: str, c: str, d: str) -> dict:
    return {
        "name": "diamond",
        "env_vars": {"GREETING": "from the flow"},
        "jobs": [
            job("A", a, "print(6)"),
            job("B", b, B_SCRIPT, depends=["A"]),
            job("C", c, C_SCRIPT, kind="sh", depends=["A"]),
            job("D", d, D_SCRIPT, depends=["B", "C"], env={"GREETING": "hi"}),
        ],
    }


async def test_diamond_across_three_nodes(node_factory):
    alice, bob, carol = [await node_factory(n) for n in ("alice", "bob", "carol")]
    actor = await mesh(alice, bob, carol)
    seen: list[tuple[FlowStatus, dict[str, JobStatus]]] = []
    with trio.fail_after(60):
        flow_id = await alice.client.submit_flow(
            actor, 1, diamond("self", "bob", "carol", "alice"), context_id=1
        )
        state = await alice.client.wait_flow(
            flow_id,
            1,
            timeout_s=55,
            on_change=lambda s: seen.append((s.status, {j.id: j.status for j in s.jobs})),
        )
    assert state.status is FlowStatus.FINISHED, state
    assert state.job("B").stdout == "42\n"
    assert state.job("C").stdout == "7\n"
    assert state.job("D").stdout == "42+7=49 (B,C) hi\n"  # job env overrides flow env
    assert state.job("B").node == bob.node_id
    assert state.job("C").node == carol.node_id
    # B and C ran where they were sent; the flow hash aggregates every job's result
    assert (await bob.store.hgetall(1, state.job("B").job_key))["status"] == "finished"
    assert (await carol.store.hgetall(1, state.job("C").job_key))["status"] == "finished"
    flow = await alice.store.hgetall(1, keys.flow(flow_id))
    result = json.loads(flow["result"])
    assert json.loads(result["D"]) == {"status": "finished", "result": state.job("D").result}
    assert await alice.store.exists(1, keys.flow(flow_id))
    assert not await alice.store.call(1, lambda r: r.sismember(keys.FLOWS_ACTIVE, str(flow_id)))
    # progress went dispatched/started -> finished, and D waited for its prerequisites
    assert seen[0][1]["D"] is JobStatus.WAITING_FOR_PREREQUISITES
    assert seen[-1][0] is FlowStatus.FINISHED


async def test_failed_job_dooms_its_dependents_only(node_factory):
    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await mesh(alice, bob)
    spec = diamond("alice", "bob", "alice", "bob")
    spec["jobs"][2] = job("C", "alice", "echo broken >&2; exit 3", kind="sh", depends=["A"])
    spec["jobs"].append(job("E", "bob", "print('independent')"))
    with trio.fail_after(60):
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=55)
    assert state.status is FlowStatus.ERROR
    statuses = {j.id: j.status for j in state.jobs}
    assert statuses == {
        "A": JobStatus.FINISHED,
        "B": JobStatus.FINISHED,
        "C": JobStatus.ERROR,
        "D": JobStatus.ERROR,
        "E": JobStatus.FINISHED,
    }
    assert state.job("D").reason == "prerequisite_failed"
    assert state.job("C").result["exit_code"] == "3"
    assert "C" in state.reason
    # D was never dispatched: no message carried it, bob never saw it
    assert "message_key" not in await alice.store.hgetall(1, state.job("D").job_key)
    assert not await bob.store.hgetall(1, state.job("D").job_key)


@pytest.mark.parametrize(
    ("jobs", "named", "words"),
    [
        (
            [job("A", "self", "", depends=["B"]), job("B", "self", "", depends=["A"])],
            ["A", "B"],
            "cycle",
        ),
        ([job("A", "self", ""), job("B", "self", "", depends=["Z"])], ["B"], "unknown job 'Z'"),
        ([job("A", "self", ""), job("B", "nowhere", "")], ["B"], "unknown node"),
        ([job("A", "self", "", context=7)], ["A"], "context 1"),
    ],
)
async def test_bad_flows_are_refused_at_submission(node_factory, jobs, named, words):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    with trio.fail_after(10), pytest.raises(FlowError) as caught:
        await alice.client.submit_flow(actor, 1, {"jobs": jobs}, context_id=1)
    assert caught.value.jobs == named
    assert words in str(caught.value)
    assert not await alice.store.call(1, lambda r: r.keys("flow:*"))


async def test_engine_refuses_a_flow_signed_by_another_key(node_factory):
    alice = await node_factory("alice")
    with trio.fail_after(20):
        flow_id = await alice.client.submit_flow(
            KeyPair.generate(), 1, {"jobs": [job("A", "self", "print(1)")]}, context_id=1
        )
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=15)
    assert state.status is FlowStatus.ERROR
    assert state.reason.startswith("wrong_signer")
    assert state.job("A").status is JobStatus.ERROR
    assert await alice.store.llen(1, keys.MSG_OUT) == 0


@pytest.mark.parametrize(
    "flaw", [RuntimeError("a flaw"), Rejected("malformed", "met inside evaluate")]
)
async def test_a_flaw_evaluating_a_flow_is_logged_not_dead_lettered(
    node_factory, monkeypatch, flaw
):
    """What goes wrong while evaluating a flow (a bug, a refusal evaluate left unhandled)
    leaves the flow to its next event: the event is acknowledged, not dead-lettered. Only an
    event that names no flow is (the entry queued after it shows when both were handled)."""

    async def failing(node: NodeState, ctx: int, flow_id: int) -> FlowStatus | None:
        raise flaw

    alice = await node_factory("alice")
    monkeypatch.setattr(engine, "evaluate", failing)
    await alice.store.lpush(1, keys.FLOW_EVENTS, "42", "not-a-flow-id")  # popped in this order
    with trio.fail_after(20):
        popped = await alice.store.call(1, lambda r: r.blpop([keys.DLQ], timeout=15))
    assert popped is not None
    assert json.loads(popped[1])["key"] == "not-a-flow-id"
    assert await alice.store.llen(1, keys.DLQ) == 0
    assert await alice.store.llen(1, keys.inflight(engine.SERVICE)) == 0


@pytest.mark.parametrize(("script", "reason"), [("print('evil')", "malformed"), (None, "replay")])
async def test_destination_refuses_rereleased_or_altered_flow_jobs(node_factory, script, reason):
    """Even a message signed by the origin node is refused if its job is not exactly the job
    the actor signed, or if that flow job was already released once."""
    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await mesh(alice, bob)
    spec = {"jobs": [job("A", "bob", "print('signed')")]}
    with trio.fail_after(60):
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=55)
        assert state.ok
        forged = await _rerelease(alice, state.job("A").job_key, script)
        popped = await bob.store.call(1, lambda r: r.blpop([keys.DLQ], timeout=50))
    assert popped is not None
    letter = json.loads(popped[1])
    assert (letter["key"], letter["reason"]) == (forged, reason)
    job_hash = await bob.store.hgetall(1, state.job("A").job_key)
    assert json.loads(job_hash["result"])["stdout"] == "signed\n"
    assert job_hash["attempt"] == "1"


async def _rerelease(origin, job_key: str, script: str | None) -> str:
    """Sign (origin's node key) and send a fresh copy of a released flow job message."""
    copy = await origin.store.hgetall(1, job_key)
    original = Message.from_hash(await origin.store.hgetall(1, copy["message_key"]))
    job_ = original.job[0] if script is None else replace(original.job[0], script=script)
    fresh = replace(
        original, id=new_id(), nonce=new_nonce(), created_at=now(), job=[job_], signatures=[]
    )
    message = sign_message(fresh, read_key_file(origin.config.node_key_path))
    async with origin.store.transaction(1) as tx:
        tx.hset(message.key, message.to_hash())
        tx.lpush(keys.MSG_OUT, [message.key])
    return message.key


async def test_engine_restart_continues_a_flow(tmp_path: Path, nursery, valkey_factory):
    """A flow partly evaluated by one engine run (state only in Valkey) is finished by the
    engine of the node started later."""
    server = valkey_factory()
    config = init_home(
        tmp_path / "alice", name="alice", listen_port=0, redis_url=server.url, runners={"sh": 1}
    )
    node_key = read_key_file(config.node_key_path)
    actor = read_key_file(config.actor_key_path)
    spec = {
        "jobs": [
            job("A", node_key.public_hex, "echo 20", kind="sh"),
            job("B", node_key.public_hex, 'echo "$((HERO_DEP_A_STDOUT + 1))"', "sh", ["A"]),
        ]
    }
    with trio.fail_after(40):
        async with open_store(server.url) as store:
            client = Client(store)
            await store.hset(keys.ACTORS_DB, keys.NODE_INFO, {"id": node_key.public_hex})
            await client.register_actor(1, actor.public_hex)
            await client.register_context(1, admins=[1])
            flow_id = await client.submit_flow(actor, 1, spec, context_id=1)
            # a first engine run releases A, then "dies" (no node is running)
            assert await evaluate(NodeState(config, node_key, store), 1, flow_id) == "started"
            state = await client.flow_state(flow_id, 1)
            assert [j.status for j in state.jobs] == ["dispatched", "waiting_for_prerequisites"]
            await nursery.start(run_node, config)
            state = await client.wait_flow(flow_id, 1, timeout_s=30)
    assert state.ok, state
    assert state.job("B").stdout == "21\n"
