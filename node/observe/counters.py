"""The node's counters, published where ``hero-node status`` reads them.

Services count what happens to messages, jobs and links (:meth:`Counters.count`), the
transport counts the handshakes and frames it refuses (``Transport.refused``) and ``resilient``
counts each service's restarts (``Counters.restarts``). They live in the node's memory;
:func:`run_counters` writes them, as one JSON object, to the ``counters`` field of DB 0's
``node:info``, the hash ``hero-node status`` already reads. One field, rewritten whole, so a
counter of an earlier run of the node never lingers beside the current ones.
"""

from __future__ import annotations

import json
from typing import Final, NoReturn

import trio

from bus.store import registry
from bus.store.connection import Store
from bus.wire.transport import Transport
from node.state import Counters

COUNTERS_FIELD: Final = "counters"
# A busy node counts thousands of times a second; whoever reads the counters needs them about
# this fresh, and the node then writes at most once per interval.
PUBLISH_INTERVAL_S: Final = 1.0


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
    await registry.publish_node_info(store, {COUNTERS_FIELD: text})


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
