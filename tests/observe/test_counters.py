"""The node's counters are read: published in DB 0 (node:info) and shown by ``hero-node status``."""

import argparse
import json
from collections.abc import Callable

import pytest
import trio
from trio_websocket import ConnectionClosed

from bus.client.api import new_job
from bus.core import keys
from bus.errors import HandshakeError
from bus.store.connection import Store
from bus.wire.transport import Transport
from crypto import KeyPair, read_key_file
from node.cli.status import status
from node.config import NodeConfig
from node.observe.tallies import PUBLISH_INTERVAL_S, read, run_counters
from node.state import NodeState


async def published(store: Store, want: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """The published counters, once they satisfy ``want``."""
    with trio.fail_after(10):
        while True:
            counters = read(await store.hgetall(keys.ACTORS_DB, keys.NODE_INFO))
            if want(counters):
                return counters
            await trio.sleep(0.05)  # written by another task within PUBLISH_INTERVAL_S


async def _ignore(*_: object) -> None:
    return None


async def test_counters_are_published_then_again_on_change(store, nursery, tmp_path):
    node = NodeState(NodeConfig(home=tmp_path), KeyPair.generate(), store)
    node.counters.count("routed", 2)
    server = Transport(
        node.identity.key,
        set,
        _ignore,
        _ignore,
        on_refused=lambda _reason: node.counters.counted.set(),
    )
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    await store.hset(keys.ACTORS_DB, keys.NODE_INFO, {"counters": '{"stale":9}'})
    with trio.fail_after(10):
        await nursery.start(run_counters, node.counters, node.store, server)
    first = trio.current_time()
    assert read(await store.hgetall(keys.ACTORS_DB, keys.NODE_INFO)) == {"routed": 2}
    stranger = Transport(KeyPair.generate(), lambda: {node.identity.node_id}, _ignore, _ignore)
    with trio.fail_after(10), pytest.raises((HandshakeError, ConnectionClosed)):
        await stranger._dial_once(node.identity.node_id, f"ws://127.0.0.1:{port}")
    node.counters.service_restarted("outbox x")
    counters = await published(store, lambda c: "restarts:outbox x" in c)
    assert counters == {
        "routed": 2,
        "service_restarts": 1,
        "refused:unknown_node": 1,
        "restarts:outbox x": 1,
    }
    assert trio.current_time() - first >= PUBLISH_INTERVAL_S * 0.99  # at most once a second


async def test_status_shows_the_counters_as_text_and_json(node_factory, capsys):
    """The counters, and how the context's attempts ended: from the job statistics, which the
    script that answers a job counts in, so status shows an end as soon as its answer is in
    (the runner tells its node nothing of a lone job's end)."""
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    with trio.fail_after(30):
        jobs = [new_job(1, 1, "python", "print(1)"), new_job(1, 1, "python", "raise SystemExit(3)")]
        for job in jobs:
            message = await alice.client.submit(actor, 1, to="self", context_id=1, jobs=[job])
            await alice.client.wait_results(message, 25)
        await published(alice.store, lambda c: c.get("routed") == 2)
        capsys.readouterr()
        as_cli = argparse.Namespace(home=alice.config.home, json=False)
        assert await status(alice.client, as_cli) == 0
        text = capsys.readouterr().out
        as_cli = argparse.Namespace(home=alice.config.home, json=True)
        assert await status(alice.client, as_cli) == 0
        facts = json.loads(capsys.readouterr().out)
    assert "context 1: msg_out=0" in text
    assert "routed=2" in text.splitlines()[-1]
    assert "attempts ended here: finished=1 error=1 retry=0" in text
    assert facts["counters"]["routed"] == 2
    assert facts["contexts"]["1"]["ended"] == {"finished": 1, "error": 1, "retry": 0}
    assert facts["node"]["id"] == alice.node_id
    assert "counters" not in facts["node"]
    assert facts["contexts"]["1"]["lists"]["msg_in"] == 0
