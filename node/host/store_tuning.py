"""The node's side of a replicated store: who fsyncs every write, kept right across failovers.

Every data server starts with ``appendfsync always``; this service lets the current primary
fsync once a second (its promises still wait for ``WAITAOF 1 R``, which makes it fsync at once)
and keeps the replicas at ``always``, at start and after each failover the Sentinels announce
(bus/store/topology.py). Correctness never depends on it, only the cost of a write does. It
also says in the log what the store's promise does at start and whenever the Sentinels see a
server go down or come back (docs/operate/promise.md), makes the promise count the set again
then, and makes a replica at once an old primary that answers again after a failover.

A failover also drops the store's connections to the old primary (Store.follow_failover), and
the runner processes' (``follow``: node/runners/processes.py): one that stalled (SIGSTOP) or
was cut off would otherwise hold every command sent to it until it came back, and then take
writes it can no longer pass on to a replica before it notices that its replicas are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from bus.errors import StoreError
from bus.store.connection import Store
from bus.store.promise import EVERY_REPLICA
from bus.store.topology import (
    DOWN_EVENTS,
    SWITCH_EVENTS,
    WOKEN_EVENTS,
    demote_woken_primaries,
    tune_fsync,
    watch_every_sentinel,
    watch_failovers,
)

log = logging.getLogger(__name__)


async def run_store_tuning(
    store: Store,
    url: str,
    follow: Callable[[], None] = lambda: None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async def retune(event: str = "") -> None:
        if event.startswith(DOWN_EVENTS):
            if store.barrier is not None:  # counted out, or back: count before a promise
                store.barrier.replicas.changed()
            await say_promise(event)
            return
        if event.startswith("+switch-master"):  # a new primary: leave the old one
            store.follow_failover()
            follow()
        primary, replicas = await tune_fsync(url)
        log.info(
            "store: primary %s fsyncs every second, replicas %s every write%s",
            primary,
            ", ".join(replicas) or "(none up)",
            f" (after {event})" if event else "",
        )

    demoting = trio.Lock()

    async def demote(event: str) -> None:
        """An old primary answering again is made a replica now, not 8-18 s later by the
        Sentinels: until then no promise every-replica is given (bus/store/topology.py).
        Every Sentinel's events count: the last to take a new configuration settles it."""
        async with demoting:
            for server in await demote_woken_primaries(url):
                log.warning(
                    "store: %s said it is a primary: made a replica (after %s)", server, event
                )

    async def say_promise(event: str = "") -> None:
        """What the promise does now, in the log: a replica down may stop writes."""
        try:
            promise = (await store.topology()).get("promise", {})
        except StoreError as exc:  # no Sentinel answers now: the next event says it
            log.info("store: promise not read (%s)", exc)
            return
        if promise:
            say = (
                log.warning if promise["refusing"] or promise["name"] != EVERY_REPLICA else log.info
            )
            after = f" (after {event})" if event else ""
            say("store: promise %s: %s%s", promise["name"], promise["now"], after)

    await retune()
    await say_promise()
    task_status.started()
    async with trio.open_nursery() as nursery:
        # a Sentinel that goes ends its own watch; the next start of this service watches all
        nursery.start_soon(watch_every_sentinel, url, demote, ("+switch-master", *WOKEN_EVENTS))
        await watch_failovers(url, retune, SWITCH_EVENTS + DOWN_EVENTS)
        nursery.cancel_scope.cancel()
