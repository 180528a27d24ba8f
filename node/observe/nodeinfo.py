"""The node's own facts in DB 0's ``node:info`` (id, addresses, pid, isolation, ...), where
``hero-node status`` and the clients on this machine find the node.

They are fixed for a run, so they are written once at start; but a failover may lose that
write (Store.waking_on_failover), and the new primary would then name the previous run of
the node (its pid, its start) to every reader until the node restarts. So they are written
again each time the store has seen a failover.
"""

from __future__ import annotations

from typing import Final, NoReturn

import trio

from bus.store import records
from bus.store.connection import Store

# a failover shows many signs (each command it refuses): at most one write per this interval
REWRITE_INTERVAL_S: Final = 1.0


async def run_node_info(
    store: Store,
    fields: dict[str, str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Write ``fields`` to ``node:info``, then again after each failover the store sees, at
    most once every REWRITE_INTERVAL_S. Reports started after the first write. Raises
    StoreError if Redis fails (``resilient`` restarts it)."""
    failover = trio.Event()

    def seen() -> None:
        failover.set()

    with store.waking_on_failover(seen):
        await records.publish_node_info(store, fields)
        task_status.started()
        while True:
            await trio.sleep(REWRITE_INTERVAL_S)
            await failover.wait()
            failover = trio.Event()  # before the write: a failover during it is seen next
            await records.publish_node_info(store, fields)
