"""Fair share between actors: the waiting jobs moved into their queues, and the wake-up.

An actor holding ``fair_share_jobs`` of its jobs in a context's queues has its next ones wait in
its own list (``lua/quota_depth.lua`` ``quota_push``, in the materialise script). A start or a
stop that frees a place pushes one entry on ``quota:fair:wake`` while anyone waits
(``quota_left``); :func:`wait_wake` blocks on it and :func:`refill` answers it, one script per
wake (``lua/quota_refill.lua``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus.core import keys
from bus.store.atomic import script

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = ["REFILL_MOST", "Refill", "refill", "wait_wake", "waiting"]

# Jobs one refill moves at most: a script of ~4 commands a job stays near a millisecond, and
# holds Valkey no longer however many actors wait; the rest goes on in the next call.
REFILL_MOST = 1000


@dataclass(frozen=True)
class Refill:
    moved: int  # jobs moved from waiting lists into their queues
    more: bool  # it stopped at its bound with actors still waiting: call again
    bad: list[str]  # waiting entries that named no queue, dropped
    queues: list[str]  # the queues jobs moved to


async def refill(store: Store, ctx: int, fair_share_jobs: int, most: int = REFILL_MOST) -> Refill:
    """Move context ``ctx``'s waiting jobs into their queues, each actor up to
    ``fair_share_jobs`` held there (0: all of them), round robin, at most ``most``, in one
    atomic script. Raises StoreError."""
    moved, more, bad, queues = await store.script(
        ctx, script("quota_refill"), [], [str(fair_share_jobs), str(most)]
    )
    return Refill(int(moved), bool(int(more)), [str(b) for b in bad], [str(q) for q in queues])


async def wait_wake(store: Store, ctx: int, timeout_s: float) -> bool:
    """Block until a freed place wakes context ``ctx``'s fair share (True), or ``timeout_s``
    passed (False). Raises StoreError."""
    return await store.blpop(ctx, keys.QUOTA_FAIR_WAKE, timeout_s) is not None


async def waiting(store: Store, ctx: int, actor: int) -> list[str]:
    """``actor``'s waiting entries in context ``ctx`` (``<queue> <job key>``), oldest first."""
    entries = await store.read(ctx, lambda r: r.lrange(keys.quota_wait(actor), 0, -1))
    return [str(e) for e in reversed(entries)]
