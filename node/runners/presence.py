"""Runner registration and presence.

Every runner slot is registered as ``runner:<id>`` (the spec's Runner hash, plus
``script_type``) in its context DB, with id ``<node id, 12 hex>:<ctx>:<type>:<slot>``. While the
node runs, ``presence:runner:<id>`` holds a JSON heartbeat with a TTL of ``PRESENCE_TTL_S``,
refreshed every ``PRESENCE_REFRESH_S`` by one timer task per context for all its slots (a
slot's liveness is its node's: a slot task that fails is restarted by ``resilient``). A clean
stop deletes the presence keys; a crash lets them expire.

The heartbeat names the runner's in-flight list (``inflight``): a runner is busy with the job
keys in that list (between its pop and the job's final transition). So "busy" needs no hook in
the runner's job code, and external runners that follow docs/use/runners.md show up alike.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import trio

from bus.core.ids import now
from bus.core.models import Runner
from bus.store import records
from bus.store.atomic import slots as atomic_slots
from bus.store.connection import Store
from node.state import Identity

log = logging.getLogger(__name__)

PRESENCE_TTL_S = 15
PRESENCE_REFRESH_S = 5.0


@dataclass(frozen=True)
class Slot:
    """One local runner slot: its id, type, the lists it consumes (in order) and its
    in-flight list."""

    runner_id: str
    script_type: str
    queues: tuple[str, ...]
    inflight: str


def runner_id(node_id: str, ctx: int, script_type: str, slot: int) -> str:
    return f"{node_id[:12]}:{ctx}:{script_type}:{slot}"


async def run_presence(
    identity: Identity,
    store: Store,
    ctx: int,
    slots: list[Slot],
    address: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register ``slots`` and keep their presence alive until cancelled; then delete it.

    Raises StoreError if Redis fails (the caller restarts the service)."""
    since = store.epoch
    await register(identity, store, ctx, slots, address)
    started_at = now()
    try:
        await _beat(identity, store, ctx, slots, started_at)
        task_status.started()
        while True:
            await trio.sleep(PRESENCE_REFRESH_S)  # a heartbeat timer, not polling for state
            if store.epoch != since:  # a failover may have lost the registration: again
                since = store.epoch
                await register(identity, store, ctx, slots, address)
            await _beat(identity, store, ctx, slots, started_at)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await _clear(store, ctx, slots)


async def register(
    identity: Identity, store: Store, ctx: int, slots: list[Slot], address: str
) -> None:
    """Write (or refresh) the ``runner:<id>`` hashes; created_at is kept from a previous run."""
    stamp = now()
    runners = [
        Runner(
            id=slot.runner_id,
            pubkey=identity.node_id,  # the node signs its runners' results
            address=address,
            topic=slot.queues[0],
            local=True,
            script_type=slot.script_type,
            created_at=stamp,
            updated_at=stamp,
        )
        for slot in slots
    ]
    await atomic_slots.register_runners(store, ctx, runners)


async def _beat(
    identity: Identity, store: Store, ctx: int, slots: list[Slot], started_at: int
) -> None:
    stamp = now()
    values = {
        slot.runner_id: json.dumps(
            {
                "node": identity.node_id,
                "pid": os.getpid(),
                "boot": identity.boot,
                "script_type": slot.script_type,
                "queues": list(slot.queues),
                "inflight": slot.inflight,
                "started_at": started_at,
                "last_heartbeat": stamp,
            }
        )
        for slot in slots
    }
    await atomic_slots.write_presence(store, ctx, values, PRESENCE_TTL_S)


async def _clear(store: Store, ctx: int, slots: list[Slot]) -> None:
    await records.clear_presence(store, ctx, [s.runner_id for s in slots])
