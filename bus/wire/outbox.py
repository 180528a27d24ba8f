"""Durable per-peer outboxes: store-and-forward from the supervisor to a peer's ``msg_in``.

An entry ``<context id>|<message key>`` waits in ``outbox:<peer>`` (DB 0) until a link is up,
moves to ``outbox:<peer>:inflight`` when sent, and is removed only when the peer acks it (after
it stored the message and queued it; the node's link reader applies the ack and opens the
link's window, node/links/frames.py). When a link drops, unacked entries go back to the outbox
and are resent; the receiver's idempotent delivery makes a resend harmless. Messages travel in
``msgs`` frames of whatever the outbox held when popped; an ``acks`` frame answers one of them,
or several the receiver read together (bus/wire/transport.py: Link.post_answers).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from bus.core import keys, spans
from bus.core.frames import MAX_BATCH, encode_msg_item, encode_msgs, msgs_frame_size
from bus.core.models import Hash
from bus.core.reasons import Reason
from bus.core.tracecontext import MessageTrace, message_trace
from bus.errors import ContentError, Refused, TransportError
from bus.store.connection import Store
from bus.store.serve import Handler, Popped, Queue, serve_queue
from bus.wire.transport import Link, Transport, Window

log = logging.getLogger(__name__)

MAX_RESENDS = 100  # a link that flaps must not dead-letter what it carries
# message hashes the supervisor handed over with their entries (PeerOutbox.remember), kept at
# most this many: entries that wait for a link are read again when it comes up
MAX_REMEMBERED = 1024


Undeliverable = Callable[[int, str, Refused], Awaitable[None]]


class PeerOutbox:
    """The durable outbox of one peer and the task that forwards it (see module doc)."""

    def __init__(
        self,
        store: Store,
        transport: Transport,
        peer_id: str,
        on_undeliverable: Undeliverable,
        *,
        ack_timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.transport = transport
        self.peer_id = peer_id
        self.on_undeliverable = on_undeliverable
        # the window of the link it sends on (an unused one until a link is up): where a
        # withdrawn message's place opens again (node/intake/deadlines.py: withdraw)
        self.window = Window()
        self.ack_timeout_s = ack_timeout_s
        self.source, self.inflight = keys.outbox(peer_id), keys.outbox_inflight(peer_id)
        self._contexts: set[int] = set()  # served contexts, re-read when an entry names another
        self._remembered: dict[str, Hash] = {}

    def remember(self, value: str, fields: Hash) -> None:
        """The message hash of entry ``value``, as the supervisor read it just before it
        pushed the entry: the entry's next pop sends it without reading it again. Only a
        message its client was told failed may not be sent, and that one is taken out of
        the outbox lists first (node/intake/deadlines.py: withdraw); a link that goes down
        forgets them all, so a message that waits for a link is read when it goes."""
        self._remembered[value] = fields
        if len(self._remembered) > MAX_REMEMBERED:
            del self._remembered[next(iter(self._remembered))]

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Forward the outbox over whatever link to the peer is up, forever. Whatever was sent
        on a link that went down unacknowledged is sent again on the next one (recovered when
        serving starts on it)."""
        task_status.started()
        queue = Queue(  # entries stay in flight until the peer acks: recovered per link
            keys.ACTORS_DB,
            self.source,
            self.inflight,
            read=False,
            max_redeliveries=MAX_RESENDS,
            recover_after_failover=False,
        )
        while True:
            link = await self.transport.wait_link(self.peer_id)
            self._remembered.clear()  # remembered while no link was up: read when sent
            self.window = link.window  # the peer's acks open it (node/links/frames.py)
            try:
                await serve_queue(self.store, queue, _Forward(self, link))
            except TransportError as exc:
                if not link.closed.is_set():
                    log.info("outbox to %s… paused: %s", self.peer_id[:16], exc)
                await link.close()

    async def send(self, link: Link, entries: list[tuple[int, str, str]]) -> None:
        """Send what one pop took from the outbox in ``msgs`` frames: each batch is what was
        queued at that moment (nothing waits for a batch to fill), split by count and bytes."""
        traces: list[MessageTrace] | None = [] if spans.recording() else None
        items = await self._encode(await self._load(entries), traces)
        sent = 0
        for chunk in self._chunks(items):
            await link.window.acquire(len(chunk), self.ack_timeout_s)
            span = self._frame_span(traces[sent : sent + len(chunk)] if traces else [])
            sent += len(chunk)
            try:
                await link.send_raw(encode_msgs(chunk))
            except BaseException as exc:
                spans.end_error(span, exc)
                raise
            spans.end(span, "sent")

    def _frame_span(self, traces: list[MessageTrace]) -> spans.Span | None:
        """The span of one ``msgs`` frame to the peer, linked to the messages it carries."""
        links = [spans.link_to(t.parent) for t in traces if t.parent is not None]
        attributes = {
            spans.PEER: self.peer_id,
            spans.BATCH_COUNT: len(traces),
            spans.DESTINATION: self.peer_id,
        }
        name = f"send {self.peer_id[:16]}"
        return spans.start(__name__, name, "PRODUCER", attributes=attributes, links=links)

    async def _load(
        self, entries: list[tuple[int, str, str]]
    ) -> list[tuple[str, Hash | str | None]]:
        """The message hashes of a batch of entries (context, key, entry): those remembered,
        and one read per context for the others; in place of a hash, the type a key holds
        instead (see Store.read_hashes), or None for an entry that names a context this node
        does not serve."""
        by_ctx: dict[int, list[str]] = {}
        found: dict[str, Hash | str] = {}
        for ctx, key, value in entries:
            fields = self._remembered.pop(value, None)
            if fields is not None:
                found[value] = fields
            else:
                by_ctx.setdefault(ctx, []).append(key)
        if not by_ctx.keys() <= self._contexts:
            self._contexts = set(await self.store.context_ids())
        for ctx, message_keys in by_ctx.items():
            if ctx not in self._contexts:  # never open a client on a database no one serves
                continue
            try:
                hashes = await self.store.read_hashes(ctx, message_keys)
            except ContentError:  # no such database
                continue
            found |= {
                keys.outbox_entry(ctx, k): h for k, h in zip(message_keys, hashes, strict=True)
            }
        return [(value, found.get(value)) for _, _, value in entries]

    async def _encode(
        self, loaded: list[tuple[str, Hash | str | None]], traces: list[MessageTrace] | None
    ) -> list[str]:
        """The ``msgs`` items of the entries that can be sent; the others leave the outbox.
        ``traces`` (when spans are recorded) gets the trace of each item's message."""
        items: list[str] = []
        for value, fields in loaded:
            item = await self._encode_one(value, fields)
            if item is not None:
                items.append(item)
                if traces is not None and isinstance(fields, dict):
                    trace = fields.get("traceparent", ""), fields.get("tracestate", "")
                    traces.append(message_trace(*trace))
        return items

    async def _encode_one(self, value: str, fields: Hash | str | None) -> str | None:
        ctx, key = keys.parse_outbox_entry(value)
        if fields is None:
            await self._refuse(value, Reason.UNKNOWN_CONTEXT, f"this node serves no context {ctx}")
            return None
        if isinstance(fields, str):
            await self._refuse(value, Reason.WRONG_TYPE, f"{key} holds a {fields}, not a hash")
            return None
        if not fields:
            await self._refuse(value, Reason.MISSING_HASH, f"{key} has no hash in context {ctx}")
            return None
        if fields.get("status") == "error":  # failed meanwhile (e.g. timeout_ack): withdrawn
            log.info("outbox entry %s (context %d) failed meanwhile; not sent", key, ctx)
            await self._drop(value)
            return None
        item = encode_msg_item(ctx, key, fields)
        limit = self.transport.config.max_frame_bytes
        if msgs_frame_size(len(item), 1) > limit:
            await self._drop(value)
            await self.on_undeliverable(
                ctx, key, Refused(Reason.OVERSIZE, f"the message exceeds {limit} bytes")
            )
            return None
        return item

    def _chunks(self, items: list[str]) -> list[list[str]]:
        """Consecutive runs of ``items`` that each fit one frame (bytes) and the window."""
        most = min(MAX_BATCH, self.transport.config.window)
        limit = self.transport.config.max_frame_bytes
        chunks: list[list[str]] = []
        current: list[str] = []
        size = 0
        for item in items:
            if current and (
                len(current) >= most or msgs_frame_size(size + len(item), len(current) + 1) > limit
            ):
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += len(item)
        if current:
            chunks.append(current)
        return chunks

    async def _drop(self, value: str) -> None:
        await self.store.ack(keys.ACTORS_DB, self.inflight, value)

    async def _refuse(self, value: str, reason: Reason, detail: str) -> None:
        """An entry that names no message to send: dead-lettered in DB 0 (the outbox's)."""
        await self.store.refuse_entry(
            keys.ACTORS_DB, self.inflight, value, reason, detail, queue=self.source
        )


class _Forward(Handler[tuple[int, str, str]]):
    """Serving an outbox on one link: each entry is parsed (one that is no
    ``<context>|<message key>`` is refused), the batch sent; the entries stay in flight until
    the peer acks them (node/links/frames.py). Serving stops when the link closes."""

    name = "outbox"

    def __init__(self, outbox: PeerOutbox, link: Link) -> None:
        self.outbox, self.link = outbox, link

    async def before_pop(self) -> None:
        if self.link.closed.is_set():
            raise TransportError("the link closed")

    async def each(self, popped: Popped) -> tuple[int, str, str]:
        try:
            ctx, key = keys.parse_outbox_entry(popped.value)
        except ValueError as exc:
            raise Refused(Reason.MALFORMED_ENTRY, str(exc)) from None
        return ctx, key, popped.value

    async def batch(self, items: list[tuple[int, str, str]]) -> None:
        await self.outbox.send(self.link, items)
