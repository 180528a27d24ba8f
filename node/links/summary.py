"""Summary asks over the links (bus/core/summaries.py): asking a peer for its figures, and
answering a peer's ask with this node's.

The asking side is the console's grid (node/web/grid.py): it asks each peer whose link is up,
waits on an event for the answer (in memory: the ask and its answer never touch the store), and
gives up after its bound. The answering side checks the ask's size and shape, that it names the
link's node, is for this node, is fresh and signed by that node's key; a refusal is answered
with its reason, logged and counted (``summary_refused_<reason>``). Nothing in an ask or a tell
can raise out of the link's reader.

An answer is built at most once per :data:`OWN_EVERY_S` whoever asks: a peer asking in a loop
costs this node one read of its queues and runners a second, no more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from bus.core import keys
from bus.core.ids import new_id, new_nonce, now
from bus.core.reasons import Reason
from bus.core.summaries import (
    MAX_ASK_BYTES,
    MAX_SUMMARY_BYTES,
    SummaryAsk,
    parse_summary_ask,
    summarise,
    summary_ask_problem,
    summary_problem,
)
from bus.core.traces import AskRefused
from bus.store import records
from bus.store.presence import live_runners
from bus.wire.transport import Link, Transport

if TYPE_CHECKING:
    from node.observe.sampler import Sampler
    from node.state import NodeState

log = logging.getLogger(__name__)

SUMMARY = "summary"  # the ``of`` of an ask or tell frame that is a summary's, not a trace's
OWN_EVERY_S = 1.0  # this node's summary is rebuilt at most this often
MAX_WAITING = 64  # asks awaiting an answer: the grid asks each peer once per round


@dataclass
class Answer:
    """A peer's answer to one ask: its summary, or why there is none (``reason``)."""

    summary: dict[str, Any] | None = None
    reason: str = ""
    detail: str = ""


@dataclass
class _Waiting:
    peer: str
    done: trio.Event
    answer: Answer


class SummaryDesk:
    """This node's side of summary asks: :meth:`ask` a peer, :meth:`on_ask` and :meth:`on_tell`
    for the link handler. ``sampler``: the console's charts (set when the console runs; a
    node without one tells no charts)."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.sampler: Sampler | None = None
        self._waiting: dict[int, _Waiting] = {}
        self._own: dict[str, Any] = {}
        self._own_at = -OWN_EVERY_S

    async def ask(self, transport: Transport, peer: str, wait_s: float) -> Answer:
        """Ask ``peer`` for its summary and wait up to ``wait_s`` for it. Never raises for the
        peer: a link down, a refusal, a bad or late answer is an Answer with a reason."""
        link = transport.link(peer)
        if link is None:
            return Answer(reason=Reason.PEER_UNAVAILABLE, detail="no link now")
        if len(self._waiting) >= MAX_WAITING:
            return Answer(reason=Reason.OVERSIZE, detail=f"{MAX_WAITING} asks already waiting")
        own = self.node.identity
        ask = SummaryAsk(new_id(), own.node_id, peer, now(), new_nonce()).signed(own.key)
        waiting = self._waiting[ask.id] = _Waiting(peer, trio.Event(), Answer())
        try:
            link.post("ask", ask=ask.to_dict(), of=SUMMARY)
            with trio.move_on_after(wait_s):
                await waiting.done.wait()
        finally:
            del self._waiting[ask.id]
        if not waiting.done.is_set():
            return Answer(reason=Reason.PEER_UNAVAILABLE, detail=f"no answer within {wait_s:g} s")
        return waiting.answer

    # -- a peer's ask ----------------------------------------------------------------------------

    async def on_ask(self, link: Link, raw: object) -> None:
        ask_id = raw.get("id") if isinstance(raw, dict) else None
        ask_id = ask_id if isinstance(ask_id, int) and not isinstance(ask_id, bool) else 0
        identity = self.node.identity
        try:
            if len(json.dumps(raw)) > MAX_ASK_BYTES:
                raise AskRefused(Reason.OVERSIZE, f"ask larger than {MAX_ASK_BYTES} bytes")
            problem = summary_ask_problem(
                parse_summary_ask(raw),
                link_peer=link.peer_id,
                own_id=identity.node_id,
                now=now(),
                max_age_s=identity.freshness.max_age_s,
                max_skew_s=identity.freshness.max_skew_s,
            )
            if problem is not None:
                raise problem
            told = {"ask": ask_id, "node": identity.node_id, "summary": await self.own()}
            if len(json.dumps(told)) > MAX_SUMMARY_BYTES:
                raise AskRefused(Reason.OVERSIZE, f"summary larger than {MAX_SUMMARY_BYTES} bytes")
        except AskRefused as refused:
            log.warning(
                "summary ask %d from %s… refused: %s",
                ask_id,
                link.peer_id[:16],
                refused,
                extra={"peer": link.peer_id, "reason": refused.reason},
            )
            self.node.counters.count(f"summary_refused_{refused.reason}")
            reason = {"reason": refused.reason, "detail": refused.detail[:512]}
            link.post("tell", tell={"ask": ask_id, "node": identity.node_id} | reason, of=SUMMARY)
            return
        # not counted: a grid asks every few seconds, and a counter that changes wakes the
        # node's counters publisher (node/observe/tallies.py) as often; refusals are counted
        link.post("tell", tell=told, of=SUMMARY)

    async def own(self) -> dict[str, Any]:
        """This node's summary (bus/core/summaries.py), at most OWN_EVERY_S old. Raises
        StoreError if its Valkey fails."""
        if trio.current_time() - self._own_at >= OWN_EVERY_S:
            self._own = await self._read_own()
            self._own_at = trio.current_time()
        return self._own

    async def _read_own(self) -> dict[str, Any]:
        store, config = self.node.store, self.node.config
        names = [keys.MSG_OUT, keys.MSG_IN, *(keys.queue(t) for t in sorted(config.runners))]
        names.append(keys.DLQ)
        depths = dict.fromkeys(names, 0)
        runners: dict[str, tuple[int, int]] = {}
        for ctx in await store.context_ids():
            for name, n in zip(names, await records.depths(store, ctx, names), strict=True):
                depths[name] += n
            for runner in await live_runners(store, ctx):
                live, busy = runners.get(runner.script_type, (0, 0))
                runners[runner.script_type] = (live + 1, busy + bool(runner.jobs))
        depths["outbox"] = 0
        for peer in sorted(self.node.peers.known):
            depths["outbox"] += (await records.outbox_depths(store, peer))[0]
        transport = self.node.peers.transport
        up = sum(1 for p in self.node.peers.known if transport and transport.link(p))
        links = {"up": up, "down": len(self.node.peers.known) - up}
        counters = dict(self.node.counters.metrics)
        charts = self.sampler.series() if self.sampler is not None else {}
        return summarise(depths, runners, counters, links, charts)

    # -- a peer's answer -------------------------------------------------------------------------

    async def on_tell(self, link: Link, raw: object) -> None:
        ask_id = raw.get("ask") if isinstance(raw, dict) else None
        waiting = self._waiting.get(ask_id) if isinstance(ask_id, int) else None
        if waiting is None or waiting.peer != link.peer_id or waiting.done.is_set():
            log.warning("summary tell from %s… for no ask of ours to it", link.peer_id[:16])
            self.node.counters.count("summary_tells_unasked")
            return
        waiting.answer = _answer_of(raw)  # type: ignore[arg-type]  # a dict: it had an ask id
        if waiting.answer.reason == Reason.MALFORMED:
            log.warning("bad summary from %s…: %s", link.peer_id[:16], waiting.answer.detail)
            self.node.counters.count("summary_tells_malformed")
        waiting.done.set()


def _answer_of(raw: Mapping[str, Any]) -> Answer:
    reason, detail = raw.get("reason", ""), raw.get("detail", "")
    if reason:
        if not isinstance(reason, str) or not isinstance(detail, str):
            return Answer(reason=Reason.MALFORMED, detail="reason and detail must be strings")
        return Answer(reason=reason[:64], detail=detail[:512])
    summary = raw.get("summary")
    problem = summary_problem(summary)
    if problem:
        return Answer(reason=Reason.MALFORMED, detail=problem)
    return Answer(summary=summary)
