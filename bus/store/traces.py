"""Named operations of trace asks (bus/core/traces.py) between a client and its node, in DB 0:
the client hands its node a signed ask, the node carries it to the peer and pushes the peer's
answer on a list only that ask names, which the client pops.

Not a reliable queue on purpose: an ask changes nothing and its client waits a few seconds for
it; one lost in a crash is asked again by running the command again, and an answer nobody popped
expires (:data:`TOLD_TTL_S`) instead of piling up."""

from __future__ import annotations

from bus.core import keys
from bus.store.connection import Store

TOLD_TTL_S = 60  # an answer whose client gave up leaves after this


async def hand_ask(store: Store, ask_json: str) -> None:
    """Give the node an ask to carry (JSON of :meth:`bus.core.traces.Ask.to_dict`)."""
    await store.lpush(keys.ACTORS_DB, keys.TRACE_ASKS, ask_json)


async def next_ask(store: Store, timeout_s: float) -> str | None:
    """The next ask a client handed this node, waiting up to ``timeout_s`` (None: none came)."""
    return await store.blpop(keys.ACTORS_DB, keys.TRACE_ASKS, timeout_s)


async def tell_client(store: Store, ask_id: int, tell_json: str) -> None:
    """Push the answer to ask ``ask_id`` for its client (expiring in :data:`TOLD_TTL_S`)."""
    told = keys.trace_told(ask_id)
    async with store.transaction(keys.ACTORS_DB) as tx:
        tx.lpush(told, [tell_json])
        tx.expire(told, TOLD_TTL_S)


async def wait_told(store: Store, ask_id: int, timeout_s: float) -> str | None:
    """The answer to ask ``ask_id``, waiting up to ``timeout_s`` (None: none came)."""
    return await store.blpop(keys.ACTORS_DB, keys.trace_told(ask_id), timeout_s)
