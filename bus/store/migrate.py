"""The stored data model's migrations, run by a node at start before any service (PROTOCOL.md
section 5, "Data model version"): a store another version wrote is brought to this one.

Version 3 (this one) moved the replay markers from a string per marker into one hash with a
TTL per field, and the queue depths from a set of each actor's queued jobs (plus a
context-wide count) to a mark in each counted job's own hash, and the runners' leases from a
string per started job (``lease:<job>``, with a TTL) beside a set ``running`` into one sorted
set ``running`` scored with each lease's expiry. A store without :data:`keys.DATA_MODEL` was
written by version 2; the leases are migrated by their shape (a set ``running``), since a
store an earlier build of version 3 wrote may hold them too. Each step is atomic (a script
per context, or per batch of markers or leases) and may run again: a node killed half-way
migrates the rest at its next start, and writes the version only once every context is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from bus.core import keys
from bus.errors import StoreError
from bus.store.atomic import script
from bus.store.connection import Store

log = logging.getLogger(__name__)

MARKERS_PER_CALL = 500  # v2 replay markers moved per script call (one atomic step each)
LEASES_PER_CALL = 500  # v2 leases moved per script call


@dataclass(frozen=True)
class Migrated:
    """What a context's migration to version 3 moved."""

    ctx: int
    markers: int  # replay markers moved into the replay hash
    counted: int  # queued jobs marked as counted for their actor
    leases: int = 0  # started jobs whose lease moved into the running zset


async def data_model_version(store: Store) -> int:
    """The version of the data model the store holds (2 when it names none)."""
    found = await store.get(keys.ACTORS_DB, keys.DATA_MODEL)
    try:
        return 2 if found is None else int(found)
    except ValueError:
        raise StoreError(f"{keys.DATA_MODEL} holds {found!r}, not a version number") from None


async def migrate(store: Store, contexts: Iterable[int]) -> list[Migrated]:
    """Bring the store to data model version :data:`keys.DATA_MODEL_VERSION` (each of
    ``contexts``' DBs); what was moved per context ([] when the store was at this version).
    Raises StoreError for a store of a newer version than this node knows, or if Valkey fails."""
    version = await data_model_version(store)
    if version > keys.DATA_MODEL_VERSION:
        raise StoreError(
            f"the store holds data model version {version}; this node knows up to "
            f"{keys.DATA_MODEL_VERSION}: run a newer hero-node"
        )
    done = []
    for ctx in sorted(set(contexts)):
        leases = await _leases_v3(store, ctx, everything=version < keys.DATA_MODEL_VERSION)
        if version < keys.DATA_MODEL_VERSION:
            done.append(replace(await _context_v3(store, ctx), leases=leases))
        elif leases:
            done.append(Migrated(ctx, 0, 0, leases))
    if version < keys.DATA_MODEL_VERSION:
        version_now = str(keys.DATA_MODEL_VERSION)
        await store.call(keys.ACTORS_DB, lambda r: r.set(keys.DATA_MODEL, version_now))
    for m in done:
        if m.markers or m.counted or m.leases:
            log.warning(
                "context %d migrated to data model version %d: %d replay marker(s) moved, "
                "%d queued job(s) counted, %d started job(s)' lease(s) moved",
                m.ctx,
                keys.DATA_MODEL_VERSION,
                m.markers,
                m.counted,
                m.leases,
            )
    return done


async def _leases_v3(store: Store, ctx: int, *, everything: bool) -> int:
    """The v2 leases and ``running`` set of context ``ctx`` into the ``running`` zset; how many
    started jobs it now holds from them. Unless ``everything`` (a version-2 store), only where
    ``running`` is still a set: a store without one has nothing of the old shape to scan for."""
    if not everything:
        found = await store.call(ctx, lambda r: r.type(keys.RUNNING))
        if str(found) != "set":
            return 0
    leases = sorted(await store.scan_keys(ctx, keys.V2_LEASE_PATTERN))
    move = script("migrate_runs_v3")
    moved = int(await store.script(ctx, move, [keys.RUNNING, *leases[:LEASES_PER_CALL]], []))
    for i in range(LEASES_PER_CALL, len(leases), LEASES_PER_CALL):
        chunk = leases[i : i + LEASES_PER_CALL]
        moved += int(await store.script(ctx, move, [keys.RUNNING, *chunk], []))
    return moved


async def _context_v3(store: Store, ctx: int) -> Migrated:
    markers = 0
    old = await store.scan_keys(ctx, keys.V2_SEEN_PATTERN)
    old += await store.scan_keys(ctx, keys.V2_NONCE_PATTERN)
    move = script("migrate_replay_v3")
    for i in range(0, len(old), MARKERS_PER_CALL):
        chunk = old[i : i + MARKERS_PER_CALL]
        markers += int(await store.script(ctx, move, [keys.REPLAY, *chunk], []))
    sets = sorted(await store.scan_keys(ctx, keys.V2_QUOTA_JOBS_PATTERN))
    actors = [name.rsplit(":", 1)[1] for name in sets]
    counted = await store.script(ctx, script("migrate_quota_v3"), [keys.QUOTA_DEPTH, *sets], actors)
    return Migrated(ctx, markers, int(counted))
