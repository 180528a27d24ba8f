"""What the node tallies in its memory, written to Valkey on a beat: its counters and the job
statistics its own scripts hand back. Each is kept where a count costs nothing (node/state.py:
Counters, JobStats), written at most once a second after a change, and written again whole
after the store has seen a failover, which may have lost the last write
(Store.waking_on_failover).

**Counters.** Services count what happens to messages, jobs and links (:meth:`Counters.count`),
the transport counts the handshakes and frames it refuses (``Transport.refused``) and
``resilient`` counts each service's restarts (``Counters.restarts``). :func:`run_counters`
writes them, as one JSON object, to the ``counters`` field of DB 0's ``node:info``, the hash
``hero-node status`` already reads. One field, rewritten whole, so a counter of an earlier run
of the node never lingers beside the current ones.

**Job statistics**, for ``stats:jobs``. Materialising a job (``submitted``, ``received``) and
accepting a result (``answered``, the round trip) are counted by the scripts that do them, with
Valkey's clock, but handed back to the node (stats_jobs.lua: stats_collected) instead of one
``HINCRBY`` per figure per job. :class:`JobStatsWriter` writes the node's totals, one field
``node|<node id>`` per context (a JSON object, as a runner slot's: bus/core/stats.py),
at most once every :data:`WRITE_INTERVAL_S` after a change, before each metrics scrape (so a
scrape shows every job answered before it) and when the node stops; and every context's totals
again after a failover. A node killed loses what it counted since its last write (at most that
interval); the next run goes on from its field.
"""

from __future__ import annotations

import contextlib
import json
from typing import Final, NoReturn

import orjson
import trio

from bus.core.stats import NODE_FIELD, StatsBatch, totals_of
from bus.errors import StoreError
from bus.store import records
from bus.store.connection import Store
from bus.wire.transport import Transport
from node.state import Counters, JobStats

COUNTERS_FIELD: Final = "counters"
# A busy node counts thousands of times a second; whoever reads the counters needs them about
# this fresh, and the node then writes at most once per interval.
PUBLISH_INTERVAL_S: Final = 1.0
# a scrape writes first, so this bounds only what a killed node loses and how stale a reader
# of stats:jobs that is not this node's scrape may be
WRITE_INTERVAL_S: Final = 1.0


# -- the counters (node:info) -------------------------------------------------------------------


def snapshot(counters: Counters, transport: Transport) -> dict[str, int]:
    """Every counter of the node by name: its own, ``refused:<reason>`` of the transport and
    ``restarts:<service>``."""
    out = dict(sorted(counters.metrics.items()))
    out.update((f"refused:{r}", n) for r, n in sorted(transport.refused.items()))
    out.update((f"restarts:{s}", n) for s, n in sorted(counters.restarts.items()))
    return out


async def publish(counters: Counters, store: Store, transport: Transport) -> None:
    # re-armed before the snapshot is taken: a count during the write is published next time
    counters.counted = trio.Event()
    text = json.dumps(snapshot(counters, transport), separators=(",", ":"))
    await records.publish_node_info(store, {COUNTERS_FIELD: text})


async def run_counters(
    counters: Counters,
    store: Store,
    transport: Transport,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Publish the counters, then again after each change and after each failover the store
    sees (a failover may lose a write: Store.waking_on_failover), at most once every
    PUBLISH_INTERVAL_S. Reports started after the first write. Raises StoreError if Redis
    fails (``resilient`` restarts it)."""
    with store.waking_on_failover(lambda: counters.counted.set()):
        await publish(counters, store, transport)
        task_status.started()
        while True:
            await trio.sleep(PUBLISH_INTERVAL_S)
            await counters.counted.wait()
            await publish(counters, store, transport)


def read(info: dict[str, str]) -> dict[str, int]:
    """The counters a ``node:info`` hash holds ({} before the node first published them)."""
    try:
        counters = json.loads(info.get(COUNTERS_FIELD, "{}"))
    except ValueError:
        return {}
    if not isinstance(counters, dict):
        return {}
    return {str(k): v for k, v in counters.items() if isinstance(v, int)}


# -- the job statistics (stats:jobs) -----------------------------------------------------------


class JobStatsWriter:
    """Writes a node's :class:`JobStats` (one writer per node: the totals it last wrote are
    kept here, read once per context from Valkey)."""

    def __init__(self, stats: JobStats, store: Store, node_id: str) -> None:
        self.stats, self.store = stats, store
        self.field = NODE_FIELD + node_id[:16]
        self.totals: dict[int, StatsBatch] = {}
        self.lock = trio.Lock()
        self.again = False  # the store saw a failover: every total is written again

    async def write(self) -> None:
        """Write every context's totals with what was counted since (after a failover, also
        those with nothing new); what a failed write held is counted again in the next one.
        StoreError if Valkey fails."""
        async with self.lock:
            self.stats.counted = trio.Event()  # a count during the write: written next time
            every, self.again = self.again, False
            again = [ctx for ctx in self.totals if every and ctx not in self.stats.pending]
            for ctx in [*self.stats.pending, *again]:
                batch = self.stats.pending.pop(ctx, StatsBatch())
                try:
                    totals = self.totals.get(ctx)
                    if totals is None:
                        totals = totals_of(await records.stats_totals(self.store, ctx, self.field))
                    totals = totals.merged(batch)
                    text = orjson.dumps(totals.figures()).decode()
                    await records.set_stats_totals(self.store, ctx, self.field, text)
                except BaseException:
                    self.again = self.again or every
                    later = self.stats.pending.get(ctx, StatsBatch())
                    self.stats.pending[ctx] = batch.merged(later)
                    self.stats.counted.set()
                    raise
                self.totals[ctx] = totals

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Write after each change and after the store has seen a failover, at most once
        every WRITE_INTERVAL_S, and once more when cancelled (the node stopping). Raises
        StoreError if Valkey fails (``resilient`` restarts it)."""
        self.stats.write = self.write  # the metrics scrape writes before it reads

        def seen() -> None:
            self.again = True
            self.stats.counted.set()

        # restarted after a store error, which a failover may explain: every total again
        if self.totals:
            seen()
        task_status.started()
        try:
            with self.store.waking_on_failover(seen):
                while True:
                    await self.stats.counted.wait()
                    await self.write()
                    await trio.sleep(WRITE_INTERVAL_S)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                with contextlib.suppress(StoreError):  # stopping: those counts are lost
                    await self.write()
