"""What the web console shows, as one JSON-able snapshot, read from the node's memory (peers,
links, counters) and from its Valkey (queues, runners, jobs, flows, messages, dead letters).

One snapshot serves every open page: it is built at most once per ``MIN_INTERVAL_S`` whatever
the number of pages, so the console's reads stay a small, bounded load beside the job path.
Nothing here writes, and no field of a snapshot holds key material or a password: the node's
Redis URL, the actors' keys, job scripts and job environments are never read into it.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio

from bus.client.api import Client
from bus.core import keys
from bus.core.ids import now
from bus.core.queues import consume_order, slot_bases
from bus.errors import BusError
from bus.store import records
from bus.store.presence import live_runners
from bus.wire.transport import Transport
from node.observe import tallies
from node.observe.sampler import Sampler
from node.state import NodeState
from node.web.grid import Grid, own_summary
from node.web.recent import Recent
from node.web.views import (
    JOB_FIELDS,
    MESSAGE_FIELDS,
    dead_letter_view,
    flow_view,
    job_view,
    message_view,
)

log = logging.getLogger(__name__)

MIN_INTERVAL_S: Final = 1.0  # the newest snapshot is reused by every page for this long
RUNNERS_INTERVAL_S: Final = 3.0  # runners are found by SCAN: looked up less often
JOBS_SHOWN: Final = 30
FLOWS_SHOWN: Final = 6
MESSAGES_SHOWN: Final = 20
DEAD_LETTERS_SHOWN: Final = 20
OUTBOX_LOOKED_AT: Final = 500  # entries of a peer's outbox read to tell a message's place


class Feed:
    """Snapshots of one running node for its console."""

    def __init__(
        self,
        node: NodeState,
        transport: Transport,
        sampler: Sampler | None = None,
        grid: Grid | None = None,
    ) -> None:
        self.node = node
        self.transport = transport
        self.sampler = sampler  # the charts' ring (node/observe/sampler.py); None: no charts
        self.grid = grid  # the peers' summaries (node/web/grid.py); None: none asked
        self.client = Client(node.store)
        self._recent: dict[tuple[int, str], Recent] = {}
        self._lock = trio.Lock()
        self._snapshot: dict[str, Any] = {}
        self._taken_at = -MIN_INTERVAL_S
        self._runners: dict[int, list[dict[str, Any]]] = {}
        self._runners_at = -RUNNERS_INTERVAL_S

    async def snapshot(self) -> dict[str, Any]:
        """The node now (or up to MIN_INTERVAL_S ago). Raises StoreError if Redis fails."""
        async with self._lock:
            if trio.current_time() - self._taken_at >= MIN_INTERVAL_S:
                self._snapshot = await self._take()
                self._taken_at = trio.current_time()
            return self._snapshot

    async def _take(self) -> dict[str, Any]:
        contexts = await self.node.store.context_ids()
        if trio.current_time() - self._runners_at >= RUNNERS_INTERVAL_S:
            self._runners = {ctx: await self._live_runners(ctx) for ctx in contexts}
            self._runners_at = trio.current_time()
        peers = await self._peers()
        views = [await self._context(ctx) for ctx in contexts]
        charts = self.charts()
        return {
            "now": now(),
            "node": await self._node() | {"summary": own_summary(views, charts)},
            "peers": peers,
            "charts": charts,
            "grid": {"charts": self.grid.charts(charts) if self.grid is not None else charts},
            "contexts": views,
            "jobs": await self._jobs(contexts),
            "flows": await self._flows(contexts),
            "messages": await self._messages(contexts, peers),
        }

    def charts(self) -> dict[str, Any]:
        """The charts' series (sampler.series); {} without a sampler."""
        return self.sampler.series() if self.sampler is not None else {}

    async def _node(self) -> dict[str, Any]:
        info = await records.node_info(self.node.store)
        shown = ("id", "name", "ws_url", "pid", "started_at", "isolation", "isolation_why")
        return {k: info.get(k, "") for k in shown} | {
            "id": self.node.identity.node_id,
            "name": self.node.config.name,
            "counters": tallies.snapshot(self.node.counters, self.transport),
        }

    # -- peers and their links -------------------------------------------------------------------

    async def _peers(self) -> list[dict[str, Any]]:
        peers = sorted(self.node.peers.known.values(), key=lambda p: (p.name, p.id))
        store, out = self.node.store, []
        lens = await records.depths(
            store,
            keys.ACTORS_DB,
            [k for p in peers for k in (keys.outbox(p.id), keys.outbox_inflight(p.id))],
        )
        breakers = self.node.peers.breakers
        for i, peer in enumerate(peers):
            view = self.transport.states.get(peer.id)
            breaker = breakers.get(peer.id)
            out.append(
                {
                    "id": peer.id,
                    "name": peer.name,
                    "address": peer.address,
                    "link": view.state,
                    "since": view.since,
                    "last_seen": view.last_seen,
                    "rtt_ms": view.rtt_ms if view.rtt_ms >= 0 else None,
                    "error": view.error,
                    "encryption": view.encryption,  # "" and why (plaintext): a cleartext link
                    "plaintext": view.plaintext,
                    "outbox": lens[2 * i],
                    "in_flight": lens[2 * i + 1],
                    "breaker": breakers.state(peer.id).value,
                    "failures": breaker.failures,
                    "summary": self.grid.summary(peer.id) if self.grid is not None else None,
                }
            )
        return out

    def _node_name(self, node_id: str) -> str:
        if node_id == self.node.identity.node_id:
            return self.node.config.name
        peer = self.node.peers.known.get(node_id)
        return (peer.name if peer is not None and peer.name else "") or node_id[:12]

    # -- contexts: queues, runners, dead letters -------------------------------------------------

    def _queues(self) -> list[str]:
        config, names = self.node.config, [keys.MSG_OUT, keys.MSG_IN]
        for script_type, slots in config.runners.items():
            group = config.runner_groups.get(script_type, "")
            for slot in range(max(slots, 1)):
                for name in consume_order(slot_bases(script_type, group, str(slot))):
                    if name not in names:
                        names.append(name)
        return names

    async def _context(self, ctx: int) -> dict[str, Any]:
        store, names = self.node.store, self._queues()
        lens = await records.depths(store, ctx, [*names, keys.DLQ])
        letters = []
        for raw in await records.head(store, ctx, keys.DLQ, DEAD_LETTERS_SHOWN):
            letters.append(dead_letter_view(raw))
        queues = dict(zip(names, lens, strict=False))
        return {
            "id": ctx,
            # the plain queues always; a priority or targeted one while it holds something
            "queues": {k: v for k, v in queues.items() if v or k.count(":") <= 1},
            "runners": self._runners.get(ctx, []),
            "dlq": {"length": lens[-1], "entries": letters},
        }

    async def _live_runners(self, ctx: int) -> list[dict[str, Any]]:
        return [
            {
                "id": r.runner_id,
                "script_type": r.script_type,
                "local": r.local,
                "jobs": r.jobs,
                "last_heartbeat": r.presence.get("last_heartbeat", 0),
            }
            for r in await live_runners(self.node.store, ctx)
        ]

    # -- jobs, flows, messages -------------------------------------------------------------------

    async def _newest(self, ctx: int, pattern: str, keep: int) -> list[str]:
        recent = self._recent.get((ctx, pattern))
        if recent is None:
            recent = self._recent[(ctx, pattern)] = Recent(ctx, pattern, keep)
        await recent.refresh(self.node.store)
        return recent.newest

    def _forget(self, ctx: int, pattern: str, key: str) -> None:
        self._recent[(ctx, pattern)].forget(key)

    async def _jobs(self, contexts: list[int]) -> list[dict[str, Any]]:
        out = []
        for ctx in contexts:
            names = await self._newest(ctx, "job:*", JOBS_SHOWN)
            rows = await records.read_fields(self.node.store, ctx, names, JOB_FIELDS)
            views = []
            for key, row in zip(names, rows, strict=True):
                if not row:
                    self._forget(ctx, "job:*", key)
                    continue
                views.append(job_view(ctx, key, row))
            await self._where(ctx, views)
            out.extend(views)
        out.sort(key=lambda j: j["created_at"], reverse=True)
        return out[:JOBS_SHOWN]

    async def _where(self, ctx: int, jobs: list[dict[str, Any]]) -> None:
        """Name the node each job runs on: the destination of the message that carried it."""
        carriers = await records.read_fields(
            self.node.store, ctx, [j["message"] for j in jobs], ["destination"]
        )
        for job, carrier in zip(jobs, carriers, strict=True):
            job["node"] = self._node_name(carrier.get("destination") or self.node.identity.node_id)

    async def _flows(self, contexts: list[int]) -> list[dict[str, Any]]:
        out = []
        for ctx in contexts:
            for key in await self._newest(ctx, "flow:*", FLOWS_SHOWN):
                try:
                    state = await self.client.flow_state(int(key.split(":")[1]), ctx)
                except (BusError, ValueError, IndexError):
                    self._forget(ctx, "flow:*", key)
                    continue
                out.append(flow_view(ctx, state, self._node_name))
        return out

    async def _messages(
        self, contexts: list[int], peers: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        queued, sent = await self._outbox_entries(peers)
        out = []
        for ctx in contexts:
            names = await self._newest(ctx, "message:*", MESSAGES_SHOWN)
            rows = await records.read_fields(self.node.store, ctx, names, MESSAGE_FIELDS)
            for key, row in zip(names, rows, strict=True):
                if not row:
                    self._forget(ctx, "message:*", key)
                    continue
                entry = keys.outbox_entry(ctx, key)
                place = "queued" if entry in queued else "sent" if entry in sent else ""
                out.append(
                    message_view(ctx, key, row, place, self.node.identity.node_id, self._node_name)
                )
        out.sort(key=lambda m: m["created_at"], reverse=True)
        return out[:MESSAGES_SHOWN]

    async def _outbox_entries(self, peers: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
        """The entries waiting in the peers' outboxes, and those sent and not yet acked."""
        queued: set[str] = set()
        sent: set[str] = set()
        store = self.node.store
        for peer in peers:
            if peer["outbox"]:
                box = keys.outbox(peer["id"])
                queued.update(await records.head(store, keys.ACTORS_DB, box, OUTBOX_LOOKED_AT))
            if peer["in_flight"]:
                box = keys.outbox_inflight(peer["id"])
                sent.update(await records.head(store, keys.ACTORS_DB, box, OUTBOX_LOOKED_AT))
        return queued, sent
