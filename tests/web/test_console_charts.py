"""The charts' data through a real node: jobs that ran reach ``/api/charts`` and the live feed
(rates, round-trip percentiles, queue depths), and the grid's own summary. The sampler's
arithmetic is tested alone in test_sampler.py."""

from __future__ import annotations

import json
from typing import Any

import trio

from crypto import read_key_file
from node.config.console import ConsoleConfig
from tests.console_http import get, next_state
from tests.nodes import link_to

FAST_CHARTS = ConsoleConfig("127.0.0.1:0", chart_every_s=0.5)
JOBS = 4


def saw_jobs(state: dict[str, Any]) -> bool:
    """A chart point counted finished jobs, and one has their round trip."""
    charts = state["charts"]
    return any(charts["rates"]["finished"]) and any(
        p is not None for p in charts["latency_ms"]["roundtrip_p50"]
    )


async def test_charts_show_jobs_that_ran_on_a_real_node(node_factory):
    node = await node_factory("a", console=FAST_CHARTS)
    url = node.info.console_url
    actor = read_key_file(node.config.actor_key_path)
    with trio.fail_after(45):
        for _ in range(JOBS):
            message = await node.client.submit_job(
                actor, 1, to="self", context_id=1, script_type="python", script="print(1)"
            )
            [result] = await node.client.wait_results(message, 30)
            assert result.status == "finished"
        state = await next_state(url + "/api/events", saw_jobs)
        status, headers, body = await get(url + "/api/charts")
    assert status == 200
    assert headers["content-type"] == "application/json"
    charts = json.loads(body)
    assert charts["every_s"] == 0.5
    points = len(charts["at"])
    assert points >= 1
    assert charts["at"] == sorted(charts["at"])
    columns = [*charts["rates"].values(), *charts["latency_ms"].values()]
    assert all(len(c) == points for c in [*columns, *charts["depths"].values()])
    assert set(charts["rates"]) == {"submitted", "finished", "failed", "retried"}
    assert {"msg_out", "msg_in", "queue:python", "queue:sh", "dlq", "outbox"} <= set(
        charts["depths"]
    )
    # the charts are read from the same ring: the endpoint has what the feed showed, or more
    assert sum(charts["rates"]["finished"]) >= sum(state["charts"]["rates"]["finished"]) > 0
    for p50, p99 in zip(
        charts["latency_ms"]["roundtrip_p50"], charts["latency_ms"]["roundtrip_p99"], strict=True
    ):
        assert (p50 is None) == (p99 is None)
        assert p50 is None or 0 < p50 <= p99
    assert not any(charts["rates"]["failed"])
    summary = state["node"]["summary"]
    assert summary["runners"] == 3  # python 2, sh 1 (node_factory)
    assert summary["dead_letters"] == 0


async def test_the_grid_shows_each_peers_link_and_breaker(node_factory):
    alice = await node_factory("alice", console=FAST_CHARTS)
    bob = await node_factory("bob")
    await link_to(alice, bob)
    with trio.fail_after(30):
        state = await next_state(
            alice.info.console_url + "/api/events",
            lambda s: any(p["link"] == "up" for p in s["peers"]),
        )
    [peer] = state["peers"]
    assert peer["name"] == "bob"
    assert peer["breaker"] == "closed"
    assert peer["failures"] == 0
    # what only bob knows comes only from bob's answer to the grid's ask: not in yet, or bob's
    # own figures (the grid asks as soon as the link is up, so either may be the first state)
    summary = peer["summary"]
    assert summary is None or (
        summary["reason"] == "" and summary["queued"] == summary["dead_letters"] == 0
    ), summary
