"""The console's read side against a real Valkey: finding the newest keys without an index
(node/web/recent.py), and snapshots that survive whatever the hashes hold (node/web/feed.py)."""

from __future__ import annotations

import json

import trio

from bus.core import keys
from node.config.console import ConsoleConfig
from node.web import recent, views
from node.web.recent import Recent
from node.web.views import job_view, message_view
from tests.console_http import get, next_event, next_state
from tests.faults_proxy import TcpProxy
from tests.nodes import link_to

CTX = 1


async def test_recent_keeps_the_newest_by_created_at(store):
    for i in range(1, 41):
        await store.hset(CTX, keys.job(1, i), {"created_at": str(1000 + i), "status": "x"})
    await store.hset(CTX, "flow:9", {"created_at": "5000"})  # another pattern: not a job
    jobs = Recent(CTX, "job:*", keep=5)
    await jobs.refresh(store)
    assert jobs.newest == [keys.job(1, i) for i in (40, 39, 38, 37, 36)]
    await store.hset(CTX, keys.job(1, 99), {"created_at": "999999"})
    await store.hset(CTX, keys.job(1, 98), {"created_at": "1"})  # older than all kept
    await jobs.refresh(store)
    assert jobs.newest[:2] == [keys.job(1, 99), keys.job(1, 40)]
    assert keys.job(1, 98) not in jobs.newest
    jobs.forget(keys.job(1, 99))
    assert jobs.newest[0] == keys.job(1, 40)


async def test_recent_walks_a_large_db_in_bounded_steps(store, monkeypatch):
    monkeypatch.setattr(recent, "SCAN_COUNT", 10)
    monkeypatch.setattr(recent, "SCAN_STEPS", 2)
    for i in range(1, 201):
        await store.hset(CTX, keys.job(1, i), {"created_at": str(i)})
    jobs = Recent(CTX, "job:*", keep=3)
    await jobs.refresh(store)
    assert 0 < len(jobs._seen) < 200  # one refresh looked at part of the DB only
    refreshes = 1
    while len(jobs._seen) < 200:
        await jobs.refresh(store)
        refreshes += 1
        assert refreshes < 100
    assert jobs.newest == [keys.job(1, 200), keys.job(1, 199), keys.job(1, 198)]


async def test_a_snapshot_survives_hostile_hashes(node_factory):
    node = await node_factory("a", console=ConsoleConfig("127.0.0.1:0"))
    store = node.store
    await store.hset(CTX, keys.job(1, 5), {"created_at": "soon", "result": "[not json"})
    await store.hset(CTX, keys.job(1, 6), {"created_at": "7", "result": '["a list"]'})
    await store.hset(CTX, keys.flow(8), {"created_at": "7", "doc": "{broken"})
    await store.hset(CTX, "flow:x", {"created_at": "7"})
    not_utf8 = {"created_at": "7", "status": b"\xff\xfe"}
    await store.call(CTX, lambda r: r.hset(keys.message(1, 9), not_utf8))
    await store.lpush(CTX, keys.DLQ, "not json", json.dumps(["a", "list"]))
    status, _, body = await get(node.info.console_url + "/api/state")
    assert status == 200
    state = json.loads(body)
    shown = {j["key"]: j for j in state["jobs"]}
    assert shown[keys.job(1, 5)]["stdout"] == ""
    assert shown[keys.job(1, 6)]["created_at"] == 7
    assert state["flows"] == []  # unreadable flows are left out
    [ctx] = state["contexts"]
    assert ctx["dlq"]["length"] == 2
    unreadable = {"reason": "unreadable", "detail": "", "at": "", "queue": ""}
    assert ctx["dlq"]["entries"] == [
        {"key": '["a", "list"]'} | unreadable,
        {"key": "not json"} | unreadable,
    ]
    [message] = state["messages"]
    assert message["key"] == keys.message(1, 9)


async def test_the_console_says_when_valkey_is_unreachable_and_recovers(
    node_factory, valkey_factory, nursery
):
    server = valkey_factory()
    proxy = TcpProxy(int(server.url.rsplit(":", 1)[1]))
    await nursery.start(proxy.run)
    node = await node_factory(
        "a", redis_url=f"redis://127.0.0.1:{proxy.port}", console=ConsoleConfig("127.0.0.1:0")
    )
    base = node.info.console_url
    status, _, _ = await get(base + "/api/state")
    assert status == 200
    await proxy.cut()
    raw: list[str] = []
    with trio.fail_after(60):
        trouble = await next_event(base + "/api/events", "trouble", lambda e: True)
        assert trouble.startswith("redis ")  # the StoreError, as the node logs it
        status, _, body = await get(base + "/api/state")
        assert status == 503
        assert "cannot read the node's Valkey" in json.loads(body)["error"]
        await proxy.restore()
        state = await next_state(base + "/api/events", lambda s: True, raw)
    assert state["node"]["name"] == "a"
    assert "event: state" in raw


async def test_a_message_for_a_peer_that_is_down_shows_in_its_outbox(node_factory):
    alice = await node_factory("alice", console=ConsoleConfig("127.0.0.1:0"))
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    bob.stop()
    message = await alice.client.submit_job(
        actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
    )

    def queued(state: dict) -> bool:
        # (the outbox's texts are the only ones that name the peer)
        return any(m["key"] == message.key and "bob" in m["delivery"] for m in state["messages"])

    with trio.fail_after(30):
        state = await next_state(alice.info.console_url + "/api/events", queued)
    [shown] = [m for m in state["messages"] if m["key"] == message.key]
    assert shown["delivery"] in ("in the outbox for bob", "sent to bob, not acknowledged yet")
    assert shown["to"] == "bob"
    [peer] = state["peers"]
    assert peer["outbox"] + peer["in_flight"] == 1


def test_views_of_hostile_or_partial_rows():
    names = {"n1": "alice", "n2": "bob"}.get
    assert job_view(1, "job:1:2", {})["duration_s"] is None
    done = {"status": "finished", "created_at": "10", "updated_at": "13", "result": "{}"}
    assert job_view(1, "job:1:2", done)["duration_s"] == 3
    backwards = done | {"updated_at": "9"}
    assert job_view(1, "job:1:2", backwards)["duration_s"] == 0
    long = json.dumps({"stdout": "x" * 10_000})
    assert len(job_view(1, "job:1:2", {"result": long})["stdout"]) == views.OUTPUT_CHARS
    row = {"status": "acknowledged", "destination": "n2"}
    assert message_view(1, "m", row, "", "n1", names)["delivery"] == (
        "stored and queued by the destination"
    )
    assert message_view(1, "m", row, "queued", "n1", names)["delivery"] == "in the outbox for bob"
    local = message_view(1, "m", {"status": "processed"}, "", "n1", names)
    assert (local["to"], local["delivery"]) == ("alice", "processed here")
