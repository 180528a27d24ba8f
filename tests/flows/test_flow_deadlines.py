"""Nothing waits forever: every flow has a deadline; past it, its unfinished jobs and the flow
end in error (``flow_deadline``) and waiting clients are answered."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio

from bus.client.api import Client
from bus.core import keys
from bus.core.flows import FlowDoc
from bus.core.ids import now, set_clock
from bus.core.models import FlowStatus, JobStatus
from bus.errors import ModelError
from bus.store.connection import open_store
from crypto import KeyPair, read_key_file
from node.flows.engine import evaluate
from node.host.home import init_home
from node.state import NodeState
from tests.flows.test_flows import job, mesh


def chain(first_node: str, then_node: str) -> dict:
    """A on ``first_node``; B, waiting for A, on ``then_node``."""
    return {
        "jobs": [job("A", first_node, "print(1)"), job("B", then_node, "print(2)", "python", ["A"])]
    }


async def test_deadline_signed_or_from_config_ends_the_flow(tmp_path: Path, valkey_factory):
    """Evaluated past its deadline (injected wall clock), a flow ends in error with its
    unfinished jobs; the deadline lives in Valkey and the signed document, so any engine run
    (a fresh NodeState here, as after a restart) enforces it."""
    server = valkey_factory()
    config = init_home(tmp_path / "a", name="a", listen_port=0, redis_url=server.url)
    config = replace(config, flow_deadline_s=100)
    node_key = read_key_file(config.node_key_path)
    actor = read_key_file(config.actor_key_path)
    me = node_key.public_hex
    start = now()
    clock = [float(start)]
    previous = set_clock(lambda: clock[0])
    try:
        with trio.fail_after(30):
            async with open_store(server.url) as store:
                client = Client(store)
                await store.hset(keys.ACTORS_DB, keys.NODE_INFO, {"id": me})
                await client.register_actor(1, actor.public_hex)
                await client.register_context(1, admins=[1])
                default = await client.submit_flow(actor, 1, chain(me, me), context_id=1)
                signed = await client.submit_flow(
                    actor, 1, chain(me, me), context_id=1, deadline_s=5
                )
                for flow_id in (default, signed):
                    node = NodeState(config, node_key, store)
                    assert await evaluate(node, 1, flow_id) == FlowStatus.STARTED
                deadlines = dict(
                    await store.call(
                        1, lambda r: r.zrange(keys.FLOW_DEADLINES, 0, -1, withscores=True)
                    )
                )
                assert deadlines == {str(default): start + 100, str(signed): start + 5}
                clock[0] = start + 5  # the signed deadline passes, not the default one
                for flow_id in (default, signed):
                    await evaluate(NodeState(config, node_key, store), 1, flow_id)
                state = await client.flow_state(signed, 1)
                assert state.status is FlowStatus.ERROR
                assert state.reason.startswith("flow_deadline")
                assert [(j.status, j.reason) for j in state.jobs] == [
                    (JobStatus.ERROR, "flow_deadline")
                ] * 2
                assert (await client.flow_state(default, 1)).status is FlowStatus.STARTED
                clock[0] = start + 100
                await evaluate(NodeState(config, node_key, store), 1, default)
                assert (await client.flow_state(default, 1)).status is FlowStatus.ERROR
                # final flows leave the deadline set; their waiting clients were woken
                assert await store.call(1, lambda r: r.zcard(keys.FLOW_DEADLINES)) == 0
                assert await store.llen(1, keys.flow_progress(default)) >= 1
    finally:
        set_clock(previous)


async def test_flow_whose_job_never_comes_back_ends_at_its_deadline(
    node_factory, mock_clock, wall_clock_on_trio
):
    """A's peer never answers (it never connects): without a deadline the flow stays
    ``started`` forever; with one, the engine's timer ends it and the waiting client hears."""
    alice = await node_factory("alice")
    actor = await mesh(alice)
    silent = KeyPair.generate().public_hex
    await alice.client.add_peer(silent, name="silent")
    with trio.fail_after(30):
        flow_id = await alice.client.submit_flow(
            actor, 1, chain(silent, "self"), context_id=1, deadline_s=2
        )
        state = await alice.client.wait_flow(flow_id, 1, timeout_s=25)
    assert state.status is FlowStatus.ERROR, state
    assert state.reason.startswith("flow_deadline")
    assert {j.id: (j.status, j.reason) for j in state.jobs} == {
        "A": (JobStatus.ERROR, "flow_deadline"),
        "B": (JobStatus.ERROR, "flow_deadline"),
    }
    assert not await alice.store.call(1, lambda r: r.sismember(keys.FLOWS_ACTIVE, str(flow_id)))


def test_a_document_without_deadline_signs_as_before_and_bad_ones_are_refused():
    doc = {
        "id": 1,
        "caller_id": 1,
        "context_id": 1,
        "origin": "o",
        "created_at": 10,
        "expires_at": 1000,
        "nonce": "n",
        "jobs": [
            {"id": "A", "job_id": 7, "node": "x" * 64, "context": 1, "type": "sh", "script": "true"}
        ],
    }
    plain = FlowDoc.from_dict(doc)
    assert "deadline_s" not in plain.to_dict()
    assert plain.deadline(3600) == 1000  # never after the flow expires
    assert plain.deadline(60) == 70
    assert FlowDoc.from_dict(doc | {"deadline_s": 5}).deadline(60) == 15
    for bad in (0, -1, "5", True, 2**40):
        with pytest.raises(ModelError, match="deadline_s"):
            FlowDoc.from_dict(doc | {"deadline_s": bad})
