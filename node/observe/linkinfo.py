"""Publishes the state of every peer link (bus/wire/linkstate.py) in DB 0's ``node:info``.

One field, ``links``: a JSON object by peer node id of ``{state, since, last_seen, rtt_ms,
error}`` (docs/architecture/data-model.md), rewritten whole on each change, at most once per
PUBLISH_INTERVAL_S, as the counters are (node/observe/tallies.py). ``hero-node status`` and the web
console read it; a peer that is not in it was never dialled nor heard from since the node
started.
"""

from __future__ import annotations

import json
from typing import Final, NoReturn

import trio

from bus.store import records
from bus.store.connection import Store
from bus.wire.transport import Transport

LINKS_FIELD: Final = "links"
PUBLISH_INTERVAL_S: Final = 1.0


async def publish_links(store: Store, transport: Transport) -> None:
    text = json.dumps(transport.states.snapshot(), separators=(",", ":"))
    await records.publish_node_info(store, {LINKS_FIELD: text})


async def run_link_info(
    store: Store,
    transport: Transport,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Publish the link states, then again after each change and after each failover the
    store sees (Store.waking_on_failover), at most once every PUBLISH_INTERVAL_S. Reports
    started after the first write. Raises StoreError if Redis fails (``resilient`` restarts
    it)."""
    with store.waking_on_failover(lambda: transport.states.changed.set()):
        await publish_links(store, transport)
        task_status.started()
        while True:
            await trio.sleep(PUBLISH_INTERVAL_S)
            await transport.states.changed.wait()
            await publish_links(store, transport)


def read_links(info: dict[str, str]) -> dict[str, dict[str, object]]:
    """The link states a ``node:info`` hash holds, by peer id ({} if none were published)."""
    try:
        links = json.loads(info.get(LINKS_FIELD, "{}"))
    except ValueError:
        return {}
    if not isinstance(links, dict):
        return {}
    return {str(k): v for k, v in links.items() if isinstance(v, dict)}
