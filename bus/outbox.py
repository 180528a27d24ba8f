"""Durable per-peer outboxes: store-and-forward from the supervisor to a peer's ``msg_in``.

An entry ``<context id>|<message key>`` waits in ``outbox:<peer>`` (DB 0) until a link is up,
moves to ``outbox:<peer>:inflight`` when sent, and is removed only when the peer acks it (after
it stored the message and queued it). When a link drops, unacked entries go back to the outbox
and are resent; the receiver's idempotent delivery makes a resend harmless.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import trio

from bus import keys
from bus.errors import StoreError, TransportError
from bus.store import Store
from bus.transport import Link, Transport

log = logging.getLogger(__name__)

POP_TIMEOUT_S = 5.0


def entry(context_id: int, message_key: str) -> str:
    return f"{context_id}|{message_key}"


def parse_entry(value: str) -> tuple[int, str]:
    ctx, _, key = value.partition("|")
    return int(ctx), key


async def enqueue(store: Store, peer_id: str, context_id: int, message_key: str) -> None:
    await store.lpush(keys.ACTORS_DB, keys.outbox(peer_id), entry(context_id, message_key))


async def acked(store: Store, peer_id: str, context_id: int, message_key: str) -> None:
    await store.ack(keys.ACTORS_DB, keys.outbox_inflight(peer_id), entry(context_id, message_key))


async def run_outbox(
    store: Store,
    transport: Transport,
    peer_id: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Forward ``peer_id``'s outbox over whatever link to it is up, forever."""
    source, inflight = keys.outbox(peer_id), keys.outbox_inflight(peer_id)
    task_status.started()
    while True:
        link = await transport.wait_link(peer_id)
        await store.recover(keys.ACTORS_DB, inflight, source)
        try:
            await _pump(store, link, source, inflight)
        except TransportError as exc:
            log.info("outbox to %s… paused: %s", peer_id[:16], exc)
        except StoreError as exc:
            log.error("outbox to %s… cannot reach redis: %s", peer_id[:16], exc)
            await trio.sleep(1)


async def _pump(store: Store, link: Link, source: str, inflight: str) -> None:
    while not link.closed.is_set():
        value = await store.pop_reliable(keys.ACTORS_DB, source, inflight, POP_TIMEOUT_S)
        if value is None:
            continue
        batch = [value, *await store.pop_more(keys.ACTORS_DB, source, inflight, 63)]
        for item in batch:
            await _send(store, link, inflight, item)


async def _send(store: Store, link: Link, inflight: str, item: str) -> None:
    try:
        ctx, key = parse_entry(item)
    except ValueError:
        log.error("dropping malformed outbox entry %r", item)
        await store.ack(keys.ACTORS_DB, inflight, item)
        return
    fields = await store.hgetall(ctx, key)
    if not fields:
        log.error("outbox entry %s (context %d) has no message hash; dropped", key, ctx)
        await store.ack(keys.ACTORS_DB, inflight, item)
        return
    await link.send("msg", ctx=ctx, key=key, fields=fields)
