"""The console's grid view: this node and each of its peers as one card.

A card has two halves. What this node knows of a peer's link (up or down and since when, round
trip, outbox, breaker, last seen) comes from its own memory (feed.py: ``_peers``). What only
the peer knows (its queues, runners and counters: its *summary*) must come from the peer
itself, over the authenticated link, by the signed peer query of issue 48 (part 3, branch
job-trace). :func:`peer_summary` is where that query plugs in: today it asks nobody and
returns None, and the page says the peer's own figures are not known here. This node's own
card carries the same summary (:func:`own_summary`), so a peer's answer, once there, is drawn
the same way.
"""

from __future__ import annotations

from typing import Any

from bus.core import keys
from node.state import NodeState


async def peer_summary(node: NodeState, peer_id: str) -> dict[str, Any] | None:
    """What peer ``peer_id`` says of itself, in :func:`own_summary`'s shape, or None while it
    cannot be asked. The plug for the signed peer query (issue 48, part 3): no peer is asked
    yet."""
    del node, peer_id
    return None


def own_summary(contexts: list[dict[str, Any]], charts: dict[str, Any]) -> dict[str, Any]:
    """This node's figures for its grid card: entries waiting in its queues (all contexts,
    dead letters apart), dead letters, runners live and busy, and the charts' newest point
    (jobs finished per second, round-trip p99 in ms; None before two samples)."""
    queued = dlq = runners = busy = 0
    for ctx in contexts:
        queued += sum(n for name, n in ctx["queues"].items() if name != keys.DLQ)
        dlq += ctx["dlq"]["length"]
        runners += len(ctx["runners"])
        busy += sum(1 for r in ctx["runners"] if r["jobs"])
    rates = charts.get("rates", {}).get("finished", [])
    p99 = charts.get("latency_ms", {}).get("roundtrip_p99", [])
    return {
        "queued": queued,
        "dead_letters": dlq,
        "runners": runners,
        "busy": busy,
        "finished_per_s": rates[-1] if rates else None,
        "roundtrip_p99_ms": p99[-1] if p99 else None,
    }
