"""Durable per-peer outboxes: store-and-forward from the supervisor to a peer's ``msg_in``.

An entry ``<context id>|<message key>`` waits in ``outbox:<peer>`` (DB 0) until a link is up,
moves to ``outbox:<peer>:inflight`` when sent, and is removed only when the peer acks it (after
it stored the message and queued it). When a link drops, unacked entries go back to the outbox
and are resent; the receiver's idempotent delivery makes a resend harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from bus import keys
from bus.errors import TransportError
from bus.frames import encode_frame
from bus.store import Store
from bus.transport import Link, Transport

log = logging.getLogger(__name__)

POP_TIMEOUT_S = 5.0
BATCH = 64
MAX_RESENDS = 100  # a link that flaps must not dead-letter what it carries


def entry(context_id: int, message_key: str) -> str:
    return f"{context_id}|{message_key}"


def parse_entry(value: str) -> tuple[int, str]:
    ctx, _, key = value.partition("|")
    return int(ctx), key


async def enqueue(store: Store, peer_id: str, context_id: int, message_key: str) -> None:
    await store.lpush(keys.ACTORS_DB, keys.outbox(peer_id), entry(context_id, message_key))


Undeliverable = Callable[[int, str, str], Awaitable[None]]


class Window:
    """At most ``size`` unacknowledged frames on a link; each ack opens a place again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.unacked = 0
        self._opened = trio.Event()

    async def acquire(self, ack_timeout_s: float) -> None:
        """Wait for a place; TransportError if the peer acks nothing for ``ack_timeout_s``."""
        while self.unacked >= self.size:
            with trio.move_on_after(ack_timeout_s) as waited:
                await self._opened.wait()
            if waited.cancelled_caught:
                raise TransportError(f"no ack for {ack_timeout_s:g} s with a full window")
        self.unacked += 1

    def release(self) -> None:
        self.unacked = max(0, self.unacked - 1)
        self._opened.set()
        self._opened = trio.Event()

    def reset(self) -> None:
        self.unacked = 0


class PeerOutbox:
    """The durable outbox of one peer and the task that forwards it (see module doc)."""

    def __init__(
        self,
        store: Store,
        transport: Transport,
        peer_id: str,
        on_undeliverable: Undeliverable,
        *,
        window: int = 256,
        ack_timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.transport = transport
        self.peer_id = peer_id
        self.on_undeliverable = on_undeliverable
        self.window = Window(window)
        self.ack_timeout_s = ack_timeout_s
        self.source, self.inflight = keys.outbox(peer_id), keys.outbox_inflight(peer_id)

    async def acked(self, context_id: int, message_key: str) -> None:
        """The peer stored and queued the message (or refused it): it leaves the outbox."""
        await self.store.ack(keys.ACTORS_DB, self.inflight, entry(context_id, message_key))
        self.window.release()

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Forward the outbox over whatever link to the peer is up, forever. Whatever was sent
        on a link that went down unacknowledged is sent again on the next one."""
        task_status.started()
        while True:
            link = await self.transport.wait_link(self.peer_id)
            self.window.reset()
            await self.store.recover(
                keys.ACTORS_DB, self.inflight, self.source, max_redeliveries=MAX_RESENDS
            )
            try:
                await self._pump(link)
            except TransportError as exc:
                log.info("outbox to %s… paused: %s", self.peer_id[:16], exc)
                await link.close()

    async def _pump(self, link: Link) -> None:
        while not link.closed.is_set():
            value = await self.store.pop_reliable(
                keys.ACTORS_DB, self.source, self.inflight, POP_TIMEOUT_S
            )
            if value is None:
                continue
            batch = [
                value,
                *await self.store.pop_batch(keys.ACTORS_DB, self.source, self.inflight, BATCH - 1),
            ]
            for item, fields in await self._load(batch):
                await self.window.acquire(self.ack_timeout_s)
                await self._send(link, item, fields)

    async def _load(self, batch: list[str]) -> list[tuple[str, dict[str, str] | None]]:
        """The message hashes of a batch of entries, one pipelined read per context."""
        by_ctx: dict[int, list[str]] = {}
        for item in batch:
            try:
                ctx, key = parse_entry(item)
            except ValueError:
                continue
            by_ctx.setdefault(ctx, []).append(key)
        found: dict[str, dict[str, str]] = {}
        for ctx, message_keys in by_ctx.items():
            hashes = await self.store.hgetall_many(ctx, message_keys)
            found |= {entry(ctx, k): h for k, h in zip(message_keys, hashes, strict=True)}
        return [(item, found.get(item)) for item in batch]

    async def _send(self, link: Link, item: str, fields: dict[str, str] | None) -> None:
        try:
            ctx, key = parse_entry(item)
        except ValueError:
            log.error("dropping malformed outbox entry %r", item)
            await self._drop(item)
            return
        if not fields:
            log.error("outbox entry %s (context %d) has no message hash; dropped", key, ctx)
            await self._drop(item)
            return
        if fields.get("status") == "error":  # failed meanwhile (e.g. timeout_ack): withdrawn
            log.info("outbox entry %s (context %d) failed meanwhile; not sent", key, ctx)
            await self._drop(item)
            return
        frame = encode_frame("msg", ctx=ctx, key=key, fields=fields)
        if len(frame.encode()) > self.transport.config.max_frame_bytes:
            await self._drop(item)
            limit = self.transport.config.max_frame_bytes
            await self.on_undeliverable(ctx, key, f"oversize: the message exceeds {limit} bytes")
            return
        await link.send_raw(frame)

    async def _drop(self, item: str) -> None:
        await self.store.ack(keys.ACTORS_DB, self.inflight, item)
        self.window.release()
