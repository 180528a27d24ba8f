"""What a node's runner slots write besides their attempts (bus/store/atomic/runs.py): their
registration, their presence heartbeat, and the hand-over of a job whose process outlived a
restart. Each is one MULTI/EXEC transaction, so a reader never sees half of it."""

from __future__ import annotations

from collections.abc import Mapping

from bus.core import keys
from bus.core.models import Runner
from bus.store.connection import Store

__all__ = ["hand_over", "register_runners", "write_presence"]


async def register_runners(store: Store, ctx: int, runners: list[Runner]) -> None:
    """Write (or refresh) the ``runner:<id>`` hashes of ``runners``; a hash that exists keeps
    its ``created_at``. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        for runner in runners:
            fields = runner.to_hash()
            created = fields.pop("created_at")
            tx.hset(keys.runner(runner.id), fields)
            tx.hsetnx(keys.runner(runner.id), "created_at", created)


async def write_presence(store: Store, ctx: int, values: Mapping[str, str], ttl_s: int) -> None:
    """Set ``presence:runner:<id>`` to each runner id's heartbeat in ``values`` (JSON text),
    expiring after ``ttl_s``. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        for runner_id, value in values.items():
            tx.set(keys.presence_runner(runner_id), value, ex=ttl_s)


async def hand_over(store: Store, ctx: int, job_key: str, source: str, target: str) -> None:
    """Move ``job_key`` from the list ``source`` to the end of ``target`` (an adopted job
    leaves its slot's in-flight list for the adopting list). Raises StoreError."""
    async with store.transaction(ctx) as tx:
        tx.lrem(source, 1, job_key)
        tx.rpush(target, [job_key])
