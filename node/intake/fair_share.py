"""Fair share between actors: the waiting jobs of a context moved into its queues as they drain.

An actor that holds ``fair_share_jobs`` of its jobs in a context's queues has its next ones wait,
in order, in its own list (the materialise script, bus/store/atomic/lua/quota_depth.lua). So
another actor's job waits behind at most ``fair_share_jobs`` jobs of each actor (and those
running), not behind the 10,000 a flooding actor may hold under its queue bound. Every start or
stop that frees a place while anyone waits pushes one wake-up entry (``quota_left``, in the
runners' start scripts too); :func:`run_fair_share` blocks on it and answers each with one
refill script, round robin over the waiting actors. No timer and no poll: an idle context costs
one blocking pop per :data:`WAKE_WAIT_S`.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import trio

from bus.core import keys
from bus.core.reasons import Reason
from bus.store.atomic import fair_share
from node.state import NodeState

log = logging.getLogger(__name__)

WAKE_WAIT_S = 5.0  # the blocking pop's bound (as serve_queue's): it only re-arms the pop


async def refill(node: NodeState, ctx: int) -> int:
    """Move context ``ctx``'s waiting jobs into their queues up to each actor's fair share, in
    as many scripts as it takes; the jobs moved. A waiting entry that names no queue is dead-
    lettered (``malformed_entry``) and logged. Raises StoreError."""
    moved = 0
    while True:
        done = await fair_share.refill(node.store, ctx, node.config.fair_share_jobs)
        moved += done.moved
        for queue in done.queues:  # idle slots block on the plain type queue only
            script_type = queue.split(":")[1] if queue.count(":") >= 1 else ""
            if script_type and queue != keys.queue(script_type):
                node.wakeups.wake_idle_slots(ctx, script_type)
        for entry in done.bad:
            detail = "a fair-share waiting entry is not '<queue> <job key>'"
            log.warning("context %d: %s: %r, dropped", ctx, detail, entry)
            await node.store.dead_letter(ctx, entry, Reason.MALFORMED_ENTRY, detail)
        if not done.more:
            return moved


async def run_fair_share(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Refill context ``ctx``'s queues from its actors' waiting lists at every wake-up.

    One refill runs before ``started`` is reported: it moves what a restart (or a lowered, or
    lifted, ``fair_share_jobs``) left waiting with room in the queues. With ``fair_share_jobs``
    0 nothing new waits, and that first refill moves every waiting job. Raises StoreError
    (node/resilient.py restarts the service, whose first refill catches up)."""
    moved = await refill(node, ctx)
    if moved:
        log.info("context %d: %d waiting jobs moved into their queues at start", ctx, moved)
    task_status.started()
    while True:
        if await fair_share.wait_wake(node.store, ctx, WAKE_WAIT_S):
            await refill(node, ctx)
