"""Atomic steps of the flow engine (``flows_*.lua``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import keys
from bus.atomic import script

if TYPE_CHECKING:
    from bus.store import Store

__all__ = ["due_to_events", "end_unfinished"]


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
