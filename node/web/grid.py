"""The console's grid view: this node and each of its peers as one card, and the grid's charts.

A card has two halves. What this node knows of a peer's link (up or down and since when, round
trip, outbox, breaker, last seen) comes from its own memory (feed.py: ``_peers``). What only
the peer knows (its queues, runners, counters and charts: its *summary*) comes from the peer
itself, over the authenticated link, by a signed summary ask (bus/core/summaries.py,
node/links/summary.py). :class:`Grid` asks every peer whose link is up once per round
(``every_s``, the charts' interval), all at once, each bounded by ``wait_s``, and keeps the
newest answer of each: a page never waits for a peer, and a peer that stops answering keeps its
last figures, marked with their age and the reason of the newest failure.

This node's own card carries the same summary (:func:`own_summary`), so that every card, and
the grid's charts (bus/core/summaries.py: ``grid_charts``), are drawn from one shape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NoReturn

import trio

from bus.core import keys
from bus.core.ids import now
from bus.core.summaries import grid_charts, summarise
from bus.wire.transport import Transport
from node.links.summary import SummaryDesk

log = logging.getLogger(__name__)


class Grid:
    """The newest summary each peer told (see the module's docstring)."""

    def __init__(
        self, desk: SummaryDesk, transport: Transport, every_s: float, wait_s: float
    ) -> None:
        self.desk, self.transport = desk, transport
        self.every_s, self.wait_s = every_s, wait_s
        self._told: dict[str, dict[str, Any]] = {}  # peer -> its newest summary, and when
        self._trouble: dict[str, tuple[str, str]] = {}  # peer -> (reason, detail) of the last try

    def summary(self, peer: str) -> dict[str, Any] | None:
        """What ``peer`` said of itself (:func:`own_summary`'s shape, and ``told_at`` in Unix s,
        ``reason``/``detail`` if the newest ask failed), or None if it never answered."""
        told = self._told.get(peer)
        reason, detail = self._trouble.get(peer, ("", ""))
        if told is None:
            return {"reason": reason, "detail": detail} if reason else None
        return told | {"reason": reason, "detail": detail}

    def charts(self, own: dict[str, Any]) -> dict[str, Any]:
        """The grid's charts: this node's (``own``) and every peer's told ones, combined."""
        return grid_charts([own, *(t.get("charts", {}) for t in self._told.values())])

    async def ask_round(self, peers: Iterable[str]) -> None:
        """Ask each of ``peers`` at once; returns when all answered or gave up."""
        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(self._ask, peer)

    async def _ask(self, peer: str) -> None:
        answer = await self.desk.ask(self.transport, peer, self.wait_s)
        if answer.summary is not None:
            self._told[peer] = answer.summary | {"told_at": now()}
            self._trouble.pop(peer, None)
        else:
            self._trouble[peer] = (answer.reason, answer.detail)

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Ask the peers whose link is up, every ``every_s`` (on deadlines). Reports started at
        once; never raises for a peer (a failed ask is kept as its card's reason)."""
        task_status.started()
        next_at = trio.current_time()
        while True:
            known = self.desk.node.peers.known
            await self.ask_round(p for p in sorted(known) if self.transport.link(p) is not None)
            next_at = max(next_at + self.every_s, trio.current_time())
            await trio.sleep_until(next_at)


def own_summary(contexts: list[dict[str, Any]], charts: dict[str, Any]) -> dict[str, Any]:
    """This node's figures for its grid card, from the console's context views and charts:
    what a peer's summary tells (bus/core/summaries.py), counters and links aside."""
    depths: dict[str, int] = {}
    runners: dict[str, tuple[int, int]] = {}
    for ctx in contexts:
        for name, n in ctx["queues"].items():
            depths[name] = depths.get(name, 0) + n
        depths[keys.DLQ] = depths.get(keys.DLQ, 0) + ctx["dlq"]["length"]
        for r in ctx["runners"]:
            live, busy = runners.get(r["script_type"], (0, 0))
            runners[r["script_type"]] = (live + 1, busy + bool(r["jobs"]))
    return summarise(depths, runners, {}, {}, charts)
