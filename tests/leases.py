"""A runner's lease as data model version 3 keeps it: the job's score in the ``running`` zset,
the time (ms, Valkey's clock) it lapses (bus/core/keys.py RUNNING)."""

from __future__ import annotations

from bus.core import keys
from bus.store.connection import Store

_NOW_MS = "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)"


async def valkey_ms(store: Store, ctx: int = 1) -> int:
    """Valkey's clock (ms), which leases are scored by."""
    return int(await store.call(ctx, lambda r: r.eval(_NOW_MS, [], [])))


async def lease_left_ms(store: Store, job: str, ctx: int = 1) -> int | None:
    """How long until the lease of ``job`` lapses (below 0: lapsed); None if it holds none."""
    score = await store.call(ctx, lambda r: r.zscore(keys.RUNNING, job))
    if score is None:
        return None
    return int(score) - await valkey_ms(store, ctx)


async def lapse(store: Store, job: str, in_ms: int = -1, ctx: int = 1) -> None:
    """The lease of ``job`` lapses ``in_ms`` from now (in the past: as a stall lets it lapse)."""
    due = await valkey_ms(store, ctx) + in_ms
    await store.call(ctx, lambda r: r.zadd(keys.RUNNING, {job: due}))
