"""The node keeps room for itself (issue 46): it takes no new jobs while it lacks room, and no
peer may fill its ``msg_in`` faster than its consumer empties it.

Two causes hold new jobs back (node.state.IntakeHold), both watched by :func:`run_pressure_watch`
every ``pressure_check_s``:

- ``disk``: the file system of the node's home or of its Valkey data has less than
  ``disk_headroom_mb`` free. Valkey that cannot write its AOF refuses every write, and a job
  that fills the disk would take every context and a peer's acknowledged messages with it.
- ``store_memory``: Valkey uses more than ``100 - store_headroom_pct`` percent of its
  ``maxmemory`` (the embedded one is started with one: node/host/valkey.py). Past maxmemory
  Valkey refuses writes; a materialised job costs ~1.5 KB, a stored message ~0.9 KB.

While held, nothing new is written for a job: the supervisor leaves this node's own job messages
in ``msg_out`` and the consumer its job messages in ``msg_in`` (both waiting in their batch,
their entries in flight: a restart puts them back), and a link stores no ``msgs`` frame (its
reader waits, so the peer's window fills and the rest waits in the peer's durable outbox).
Results, acks and stops still flow, and jobs queued already still run: they are what frees room.
Nothing is refused and nothing is lost; intake resumes when the cause is gone.

A peer's link is held back on its own too (node.state.Inbound): at most ``max_msg_in_per_peer``
messages it delivered may wait in ``msg_in`` for the consumer; past that its link stores nothing
more until the consumer took some, so one flooding peer neither fills the store nor crowds the
other peers out of the consumer.

The watch also publishes the queue bounds admission enforces (node/intake/admission.py:
queue_bounds) in node:info, for ``hero-node status`` (:func:`published_bounds`, :func:`bounds_of`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import trio

from bus.store import records
from node.intake.admission import QueueBounds, queue_bounds

if TYPE_CHECKING:
    from node.config import NodeConfig
    from node.state import NodeState

log = logging.getLogger(__name__)

DISK, STORE_MEMORY = "disk", "store_memory"
HELD_FIELD = "intake_held"  # node:info: "" or "<cause>: <detail>; ..." (hero-node status)
MB = 1024 * 1024


# -- the verdicts (pure) -----------------------------------------------------------------------


def disk_verdict(config: NodeConfig, free: dict[Path, int]) -> str:
    """Why the disk holds new jobs ("" if it does not): the least free space of ``free``
    (bytes by path) under ``disk_headroom_mb``."""
    if not config.disk_headroom_mb or not free:
        return ""
    path, least = min(free.items(), key=lambda kv: kv[1])
    if least >= config.disk_headroom_mb * MB:
        return ""
    headroom = config.disk_headroom_mb
    return f"{least // MB} MiB free where {path} is, under the headroom of {headroom} MiB"


def memory_verdict(config: NodeConfig, used: int, maxmemory: int) -> str:
    """Why the store's memory holds new jobs ("" if it does not): ``used`` bytes above
    ``100 - store_headroom_pct`` percent of ``maxmemory`` (0: Valkey has no bound)."""
    if not maxmemory:
        return ""
    mark = maxmemory * (100 - config.store_headroom_pct) // 100
    if used < mark:
        return ""
    return (
        f"Valkey uses {used // MB} MiB of its maxmemory {maxmemory // MB} MiB, past the "
        f"{100 - config.store_headroom_pct}% mark"
    )


# -- the watcher ---------------------------------------------------------------------------------


def free_bytes(paths: Iterable[Path]) -> dict[Path, int]:
    """Free bytes for an unprivileged writer on the file system of each of ``paths``."""
    out = {}
    for path in paths:
        st = os.statvfs(path)
        out[path] = st.f_bavail * st.f_frsize
    return out


def watched_paths(config: NodeConfig) -> list[Path]:
    """The node's home and its embedded Valkey's data (when it runs one)."""
    paths = [config.home]
    if not config.redis_url and not config.store.replicated and config.valkey_dir.exists():
        paths.append(config.valkey_dir)
    return paths


async def run_pressure_watch(
    node: NodeState,
    *,
    measure_disk: Callable[[list[Path]], dict[Path, int]] = free_bytes,
    measure_memory: Callable[[], Awaitable[tuple[int, int]]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Hold or release new jobs (NodeState.pressure.hold) every ``pressure_check_s`` (on trio's
    clock) by the free disk space and the store's memory; reports started after the first
    look. A change is logged, counted (``intake_held_<cause>``) and published in node:info
    (``intake_held``, for ``hero-node status``). Raises StoreError if Valkey fails."""
    paths = watched_paths(node.config)

    async def memory() -> tuple[int, int]:
        return await records.memory_use(node.store)

    read_memory = measure_memory or memory
    started = False
    since = node.store.epoch
    while True:
        free = await trio.to_thread.run_sync(measure_disk, paths)
        verdicts = {
            DISK: disk_verdict(node.config, free),
            STORE_MEMORY: memory_verdict(node.config, *await read_memory()),
        }
        # a failover may have lost the last write (Store.waking_on_failover): written again
        lost = node.store.epoch != since
        if apply_verdicts(node, verdicts) or not started or lost:
            facts = {HELD_FIELD: node.pressure.hold.text()}
            if not started or lost:
                facts[BOUNDS_FIELD] = published_bounds(node.config)
            since = node.store.epoch
            await records.publish_node_info(node.store, facts)
        if not started:
            task_status.started()
            started = True
        await trio.sleep(node.config.pressure_check_s)


def apply_verdicts(node: NodeState, verdicts: dict[str, str]) -> bool:
    """Hold or release each cause by its verdict; whether anything changed (logged)."""
    hold, changed = node.pressure.hold, False
    for cause, why in verdicts.items():
        if why and hold.hold(cause, why):
            log.warning("holding new jobs: %s", why, extra={"cause": cause})
            node.counters.count(f"intake_held_{cause}")
            changed = True
        elif not why and hold.release(cause):
            log.warning("taking new jobs again: %s has room", cause, extra={"cause": cause})
            changed = True
    return changed


# -- the queue bounds as the node publishes them (node/intake/admission.py: queue_bounds) ----


def raised_bounds(config: NodeConfig) -> list[str]:
    """Each context whose ``[queue_limits]`` raise (or lift) a node-wide bound: logged loudly
    at start, since such a context may hold more of the store than the operator planned."""
    out = []
    base = QueueBounds(config.max_queued_per_actor, config.max_queued_per_context)
    for ctx in sorted(config.queue_limits, key=int):
        own = queue_bounds(config, int(ctx))
        for name, mine, node_wide in zip(QueueBounds._fields, own, base, strict=True):
            if node_wide and (mine == 0 or mine > node_wide):
                shown = mine or "lifted"
                out.append(f"context {ctx}: {name} queue bound {shown} (node-wide {node_wide})")
    return out


BOUNDS_FIELD = "queue_bounds"  # node:info: the node's queue bounds, for hero-node status


def published_bounds(config: NodeConfig) -> str:
    """The queue bounds as node:info publishes them: ``{"default": [actor, context], "<ctx>":
    [actor, context], ...}`` (JSON; 0: no bound)."""
    table = {
        "default": list(QueueBounds(config.max_queued_per_actor, config.max_queued_per_context))
    }
    table |= {ctx: list(queue_bounds(config, int(ctx))) for ctx in config.queue_limits}
    return json.dumps(table)


def bounds_of(info: Mapping[str, str], ctx: int) -> QueueBounds:
    """Context ``ctx``'s queue bounds as the node published them (0, 0 if it did not)."""
    try:
        table = json.loads(info.get(BOUNDS_FIELD) or "{}")
        return QueueBounds(*table.get(str(ctx), table["default"]))
    except (ValueError, KeyError, TypeError):
        return QueueBounds(0, 0)
