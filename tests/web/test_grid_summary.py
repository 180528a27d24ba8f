"""The grid's peer summaries (bus/core/summaries.py, node/links/summary.py, node/web/grid.py):
their checks and bounds, a node answering and refusing summary asks over a real link, and two
real nodes whose consoles show each other's figures, charts and a cross-node job's timeline."""

from __future__ import annotations

import json

import pytest
import trio

from bus.core.ids import new_nonce, now
from bus.core.summaries import (
    MAX_POINTS,
    SummaryAsk,
    grid_charts,
    summarise,
    summary_problem,
)
from crypto import KeyPair, read_key_file
from node.config.console import ConsoleConfig
from node.links.asks import Asker
from node.web.timeline import Tracer
from tests.console_http import get, next_state
from tests.fake_peer import link_fake_peer
from tests.nodes import link_to


def charts(finished: list[float], p99: list[float | None], depth: list[int]) -> dict:
    n = len(finished)
    return {
        "every_s": 5.0,
        "at": [1000.0 + 5 * i for i in range(n)],
        "rates": {"finished": finished},
        "latency_ms": {"roundtrip_p99": p99},
        "depths": {"msg_in": depth},
    }


def test_a_summary_holds_totals_bounded_and_the_grid_sums_them():
    long = charts([1.0] * 300, [5.0] * 300, [2] * 300)
    counters = {"x": 1, "a name a peer would refuse": 2}  # left out, not the summary refused
    summary = summarise({"msg_in": 3, "dlq": 2}, {"python": (2, 1)}, counters, {"up": 1}, long)
    assert summary["counters"] == {"x": 1}
    assert (summary["queued"], summary["dead_letters"], summary["busy"]) == (3, 2, 1)
    assert len(summary["charts"]["at"]) == len(summary["charts"]["rates"]["finished"]) == MAX_POINTS
    assert summary_problem(json.loads(json.dumps(summary))) == ""

    # rates and depths add up, aligned at the newest point; latency is the worst node's
    a = charts([1.0, 2.0, 3.0], [10.0, None, 30.0], [1, 1, 1])
    b = charts([5.0, 5.0], [None, 50.0], [4, 4])
    grid = grid_charts([a, b, {}])
    assert grid["rates"]["finished"] == [1.0, 7.0, 8.0]
    assert grid["latency_ms"]["roundtrip_p99"] == [10.0, None, 50.0]  # no job ended: a gap
    assert grid["depths"]["msg_in"] == [1, 5, 5]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"queued": -1}, "'queued'"),
        ({"busy": True}, "'busy'"),
        ({"finished_per_s": float("inf")}, "finished_per_s"),
        ({"counters": {f"c{i}": 1 for i in range(65)}}, "'counters'"),
        ({"depths": {"<script>": 1}}, "'depths'"),
        ({"runner_types": {"python": [1]}}, "'runner_types'"),
        ({"charts": {"at": [1.0] * (MAX_POINTS + 1), "every_s": 5}}, "'charts.at'"),
        ({"charts": {"every_s": 5, "at": [], "rates": {"x": ["1"]}}}, "'charts.rates'"),
        ({"charts": {"every_s": 5, "at": [], "script": "x"}}, "'charts'"),
    ],
)
def test_a_peer_summary_out_of_shape_is_refused_with_what_is_wrong(change, why):
    good = summarise({}, {}, {}, {}, {})
    assert summary_problem(good) == ""
    assert why in summary_problem(good | change)


async def test_a_node_tells_its_summary_to_a_peer_and_refuses_bad_asks(node_factory, nursery):
    alice = await node_factory("alice", console=ConsoleConfig("127.0.0.1:0", chart_every_s=0.5))
    await alice.store.dead_letter(1, "message:1:77", "malformed", "secret detail", queue="msg_in")
    peer, link = await link_fake_peer(nursery, alice, name="peer", of="summary")
    me, other = peer.key.public_hex, KeyPair.generate()

    def ask(ask_id: int, signer: KeyPair = peer.key, **changes: object) -> dict:
        fields: dict = dict(id=ask_id, node=me, target=alice.node_id, created_at=now(),
                            nonce=new_nonce())  # fmt: skip
        return SummaryAsk(**(fields | changes)).signed(signer).to_dict()

    with trio.fail_after(30):
        await link.send("ask", ask=ask(1), of="summary")
        await link.send("ask", ask=ask(2, node=other.public_hex), of="summary")
        await link.send("ask", ask=ask(3, signer=other), of="summary")
        await link.send("ask", ask=ask(4, created_at=now() - 3600), of="summary")
        await link.send("ask", ask=ask(5) | {"keys": ["job:1:1"]}, of="summary")
        await link.send("tell", tell={"ask": 99, "node": me, "summary": {}}, of="summary")
        answer, *refusals = [await peer.told(n) for n in range(1, 6)]
    summary = answer["summary"]
    assert summary_problem(summary) == ""
    assert (summary["dead_letters"], summary["runners"]) == (1, 3)  # python 2, sh 1
    assert summary["runner_types"] == {"python": [2, 0], "sh": [1, 0]}
    assert summary["charts"]["every_s"] == 0.5
    assert "message:1:77" not in json.dumps(answer)  # totals, never a key or a detail
    assert "secret" not in json.dumps(answer)
    reasons = [r["reason"] for r in refusals]
    assert reasons == ["wrong_origin", "wrong_signer", "expired", "malformed"]
    counted = alice.info.state.counters.metrics
    assert counted["summary_refused_wrong_origin"] == counted["summary_refused_expired"] == 1
    assert counted["summary_tells_unasked"] == 1


async def test_two_consoles_show_each_others_figures_and_a_cross_node_timeline(node_factory):
    console = ConsoleConfig("127.0.0.1:0", chart_every_s=0.5)
    alice = await node_factory("alice", console=console)
    bob = await node_factory("bob", console=console)
    actor = await link_to(alice, bob)
    await bob.client.add_peer(alice.node_id, alice.info.ws_url, name="alice")
    await bob.store.dead_letter(1, "message:1:77", "malformed", "a test entry", queue="msg_in")
    url = alice.info.console_url
    with trio.fail_after(60):
        message = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(6*7)"
        )
        await alice.client.wait_results(message, 30)

        def bob_told(state: dict) -> bool:
            [card] = [p for p in state["peers"] if p["id"] == bob.node_id]
            told = card["summary"] or {}
            return told.get("dead_letters") == 1 and bool(told.get("charts", {}).get("at"))

        state = await next_state(url + "/api/events", bob_told)
        [card] = state["peers"]
        assert (card["summary"]["runners"], card["summary"]["reason"]) == (3, "")
        assert card["summary"]["links"]["up"] >= 1
        assert state["grid"]["charts"]["at"]  # this node's and bob's, combined

        [sent] = message.job
        status, _, body = await get(f"{url}/api/trace?context=1&key={sent.key}")
        assert status == 200
        doc = json.loads(body)
        [job] = doc["jobs"]
        assert (job["node"], job["status"], job["attempts"]) == (bob.node_id, "finished", 1)
        assert doc["nodes"][bob.node_id]["told"] is True
        assert "print(6*7)" not in body.decode()  # never its script, nor its output
        assert "stdout" not in body.decode()
        # without an actor to ask as, the timeline holds this node's part, bob named untold
        alone = Tracer(alice.info.state, Asker(alice.store, None, 1, alice.node_id, "no key"), 1)
        untold = await alone.timeline(1, sent.key)
        assert untold is not None
        assert untold["nodes"][bob.node_id]["told"] is False
        assert untold["nodes"][bob.node_id]["reason"] == "unknown_signer"
        bad, _, _ = await get(f"{url}/api/trace?context=1&key=actor:1")
        absent, _, _ = await get(f"{url}/api/trace?context=1&key=job:1:424242")
    assert (bad, absent) == (400, 404)
    assert read_key_file(alice.config.actor_key_path).public_hex == actor.public_hex
