"""Atomic steps of the flow engine (``flows_*.lua``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus.core import keys
from bus.core.models import Message
from bus.store.atomic import script

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = [
    "FlowWrite",
    "due_to_events",
    "end_unfinished",
    "release",
    "set_jobs",
    "write_flow",
]


async def due_to_events(store: Store, ctx: int, now: int) -> int:
    """Move every flow whose deadline is at or before ``now`` (s) onto ``flow_events``;
    returns the next deadline (s), -1 if none is armed."""
    names = [keys.FLOW_DEADLINES, keys.FLOW_EVENTS]
    return int(await store.script(ctx, script("flows_due_to_events"), names, [str(now)]))


async def end_unfinished(store: Store, ctx: int, job_keys: list[str], reason: str, now: int) -> int:
    """End in error (``reason``) each job copy of ``job_keys`` not final yet (one without a
    copy included); returns how many it ended."""
    ended = await store.script(ctx, script("flows_end_unfinished"), job_keys, [reason, str(now)])
    return int(ended)


async def set_jobs(store: Store, ctx: int, job_keys: list[str], fields: dict[str, str]) -> None:
    """Set ``fields`` on each job copy of ``job_keys`` (doomed or refused jobs ending in
    error), in one transaction. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        for job_key in job_keys:
            tx.hset(job_key, fields)


async def release(
    store: Store, ctx: int, job_key: str, copy: dict[str, str], message: Message
) -> None:
    """Write the released job's copy (``copy``, which marks it dispatched), store its
    ``flow_job`` message and queue it on ``msg_out``, in one transaction: a job is dispatched
    exactly when its message is on its way. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        tx.hset(job_key, copy)
        tx.hset(message.key, message.to_hash())
        tx.lpush(keys.MSG_OUT, [message.key])


@dataclass(frozen=True)
class FlowWrite:
    """A flow's fields to write (``status`` among them); ``done`` when the flow is final,
    else ``deadline`` (s; None to leave it) re-arms it; ``progress_ttl_s`` is the TTL of its
    progress list."""

    flow_id: int
    fields: dict[str, str]
    done: bool
    deadline: int | None
    progress_ttl_s: int


async def write_flow(store: Store, ctx: int, write: FlowWrite) -> None:
    """Write the flow's fields; a final flow leaves ``flows:active`` and ``flow_deadlines``,
    another is (re)armed there; its status is pushed on ``flow_progress:<id>`` for waiting
    clients. One transaction. Raises StoreError."""
    flow_id = str(write.flow_id)
    progress = keys.flow_progress(write.flow_id)
    async with store.transaction(ctx) as tx:
        tx.hset(keys.flow(write.flow_id), write.fields)
        if write.done:
            tx.srem(keys.FLOWS_ACTIVE, [flow_id])
            tx.zrem(keys.FLOW_DEADLINES, [flow_id])
        elif write.deadline is not None:
            tx.zadd(keys.FLOW_DEADLINES, {flow_id: write.deadline})
        tx.lpush(progress, [write.fields["status"]])
        tx.expire(progress, write.progress_ttl_s)
