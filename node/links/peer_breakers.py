"""The peers' circuit breakers (bus/wire/breakers.py) published in ``node:info`` (field
``breakers``) for ``hero-node status``."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, NoReturn

import trio

from bus.store import records

if TYPE_CHECKING:
    from bus.store.connection import Store
    from bus.wire.breakers import PeerBreakers

log = logging.getLogger(__name__)

BREAKERS_FIELD = "breakers"
PUBLISH_EVERY_S = 1.0


async def run_breaker_publisher(
    breakers: PeerBreakers,
    store: Store,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Write the breakers' states to ``node:info`` at start, after each change and after each
    failover the store sees (Store.waking_on_failover), at most once every PUBLISH_EVERY_S
    (a flapping link must not cost a write per event). Raises StoreError."""
    task_status.started()
    with store.waking_on_failover(lambda: breakers.changed.set()):
        while True:
            changed = breakers.changed
            snapshot = json.dumps(breakers.snapshot(), separators=(",", ":"))
            await records.publish_node_info(store, {BREAKERS_FIELD: snapshot})
            await trio.sleep(PUBLISH_EVERY_S)
            await changed.wait()  # at once if a breaker changed since the snapshot
