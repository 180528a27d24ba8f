"""What a node does with the frames its links carry (the transport only authenticates).

Messages arrive in batches (``msgs`` frames): each is checked on its own, the acceptable ones
are stored and queued together (one pipeline per context) and the whole batch is answered in
one ``acks`` frame, where a refused message is a nack with its reason; frames read together are
answered together (bus/wire/transport.py: Link.post_answers). Acks are applied the same way:
one round trip for the outbox, one per context for the messages' status.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from bus.core import keys, spans
from bus.core.deadlines import ACKED_IN, RECEIVED_FROM
from bus.core.frames import Ack, Frame, MsgItem, Nack, answers_of, fields_are_strings, msgs_of
from bus.core.ids import now
from bus.core.models import Hash, MessageStatus, MessageType
from bus.core.reasons import Reason
from bus.core.tracecontext import message_trace
from bus.store import records
from bus.store.atomic import routing
from bus.wire.transport import Link
from node.intake.admission import delivery_problem, load_message
from node.intake.messages import Rejected, reject
from node.links.summary import SUMMARY, SummaryDesk
from node.links.trace import TraceDesk
from node.state import NodeState

log = logging.getLogger(__name__)

# the messages the consumer runs only once their ack was written (node/state.py OwedAcks): the
# others run nothing, and an ack owed for them would be remembered with no one to take it
RUN = (MessageType.JOB.value, MessageType.FLOW_JOB.value)


class LinkHandler:
    """Frame callbacks for :class:`bus.wire.transport.Transport`, bound to one node."""

    def __init__(self, node: NodeState, contexts: set[int]) -> None:
        self.node = node
        self.contexts = contexts  # the contexts this node serves (live set)
        self.traces = TraceDesk(node)  # trace asks and answers (node/links/trace.py)
        self.summaries = SummaryDesk(node)  # the grid's summary asks (node/links/summary.py)

    async def on_frame(self, link: Link, frame: Frame) -> None:
        if frame.type == "msgs":
            await self._deliver(link, msgs_of(frame))
        elif frame.type == "acks":
            await self._answered(link, *answers_of(frame))
        elif frame.type == "ask" and frame.body.get("of") == SUMMARY:
            await self.summaries.on_ask(link, frame.body["ask"])
        elif frame.type == "ask":
            await self.traces.on_ask(link, frame.body)
        elif frame.type == "tell" and frame.body.get("of") == SUMMARY:
            await self.summaries.on_tell(link, frame.body["tell"])
        elif frame.type == "tell":
            await self.traces.on_tell(link, frame.body)
        else:
            await self.on_bad_frame(link, f"unexpected {frame.type} frame after the handshake")

    async def on_bad_frame(self, link: Link, detail: str) -> None:
        log.warning(
            "bad frame from %s…: %s",
            link.peer_id[:16],
            detail,
            extra={"peer": link.peer_id, "reason": Reason.BAD_FRAME},
        )
        self.node.counters.count("bad_frames")
        await self.node.store.dead_letter(
            keys.ACTORS_DB, f"link:{link.peer_id}", Reason.BAD_FRAME, detail
        )

    # -- receiving messages ----------------------------------------------------------------------

    async def _deliver(self, link: Link, items: Sequence[MsgItem]) -> None:
        """:meth:`_receive`, in the span of the frame (linked to the messages it carries)."""
        span = _frame_span(self.node.identity.node_id, link.peer_id, items)
        try:
            await self._receive(link, items)
        except BaseException as exc:
            spans.end_error(span, exc)
            raise
        spans.end(span, "stored")

    async def _receive(self, link: Link, items: Sequence[MsgItem]) -> None:
        """Store each message and queue it on ``msg_in`` before acknowledging it: the accepted
        ones of a batch in one pipeline per context, then its answers (posted, never sent from
        the reader, and merged with those of frames read with it: see
        :meth:`bus.wire.transport.Link.post_answers`). A refused
        message is dead-lettered and nacked; the others of its batch are delivered."""
        extra = delivery_fields(link.peer_id, self.node.identity.boot, now())
        nacks: list[dict[str, object]] = []
        by_ctx: dict[int, list[tuple[str, dict[str, str]]]] = {}
        known: dict[int, bool] = {}
        for ctx, key, fields in ((i.ctx, i.key, i.fields) for i in items):
            refused = await self._check_delivery(ctx, key, fields, known)
            if refused is not None:
                token = refused.reason
                log.warning(
                    "refused %s from %s…: %s",
                    key,
                    link.peer_id[:16],
                    refused,
                    extra={"message_key": key, "ctx": ctx, "peer": link.peer_id, "reason": token},
                )
                self.node.counters.count(f"refused_delivery_{token}")
                await self.node.store.dead_letter(
                    keys.ACTORS_DB, key, Reason.REFUSED_DELIVERY, str(refused)
                )
                nacks.append(Nack(ctx, key, token, refused.detail).item())
            else:
                by_ctx.setdefault(ctx, []).append((key, {**fields, **extra}))
        acks: list[dict[str, object]] = []
        if by_ctx:  # held back on the link: the rest waits in the peer's outbox
            await self._room_for(link)
        epoch = self.node.store.epoch  # a failover while storing them voids the acks
        last = len(by_ctx) - 1
        owed = self.node.pressure.inbound.owed  # none runs before its ack is written
        for i, (ctx, group) in enumerate(by_ctx.items()):
            # acknowledged means durable (on a replicated store: fsynced here and on a
            # replica): the last context's delivery returns once one WAITAOF on its
            # connection confirms it and, the contexts stored one after another, the others
            # (bus/store/durable.py); NotDurable ends the link unacked and the peer resends
            since = epoch if i == last else None
            owed.owe(ctx, (key for key, fields in group if fields.get("message_type") in RUN))
            acks.extend({"ctx": ctx, "key": key} for key, _ in group)
            try:
                stored = await self._store(link.peer_id, ctx, group, since)
            except BaseException:
                owed.settle(acks, written=False)
                raise
            self._count("delivered", sum(stored))
            self._count("redelivered", len(group) - sum(stored))
            for (key, _), new in zip(group, stored, strict=True):
                log.info(
                    "received %s from %s…%s",
                    key,
                    link.peer_id[:16],
                    "" if new else " again (stored already)",
                    extra={"message_key": key, "ctx": ctx, "peer": link.peer_id},
                )
        link.post_answers(acks, nacks)
        self._count("acks_sent", len(acks))
        self._count("nacks_sent", len(nacks))

    async def _store(
        self, peer: str, ctx: int, group: list[tuple[str, dict[str, str]]], since: int | None
    ) -> list[bool]:
        """Deliver ``group`` (routing.deliver), counted as waiting for the consumer from before
        it is queued (the consumer may pop it at once), then less what was stored already."""
        inbound = self.node.pressure.inbound
        inbound.delivered(peer, len(group))
        # the consumer takes what is stored here from memory, not by reading it back: it may
        # pop an entry before this task sees the reply, so the entries are announced first
        known = inbound.known[ctx]
        announced, kept = known.storing(key for key, _ in group), dict[str, Hash]()
        try:
            stored = await routing.deliver(self.node.store, ctx, group, durable_since=since)
            kept = {key: fields for (key, fields), new in zip(group, stored, strict=True) if new}
        except BaseException:
            inbound.delivered(peer, -len(group))
            raise
        finally:
            known.stored(announced, kept)
        inbound.delivered(peer, sum(stored) - len(group))
        return stored

    async def _room_for(self, link: Link) -> None:
        """Return once this node may store what the link's peer sent: nothing holds new jobs,
        and fewer than ``max_msg_in_per_peer`` of its messages wait in ``msg_in``
        (node/intake/pressure.py). Meanwhile this link reads no frame, so the peer's window
        fills and its messages wait in its durable outbox: held back, nothing lost. What
        was stored already is acked before the wait."""
        pressure, peer = self.node.pressure, link.peer_id
        if pressure.hold.held or pressure.inbound.waiting.get(peer, 0) >= self._per_peer:
            self._count("link_held_back", 1)
            link.answer_now()
        await pressure.hold.wait_open()
        await pressure.inbound.wait_room(peer, self._per_peer)

    @property
    def _per_peer(self) -> int:
        return self.node.config.max_msg_in_per_peer

    def _count(self, name: str, n: int) -> None:
        if n:
            self.node.counters.count(name, n)

    async def _check_delivery(
        self, ctx: int, key: str, fields: Mapping[str, Any], known: dict[int, bool]
    ) -> Rejected | None:
        """Why a message cannot be delivered (None if it can); ``known`` memoises, for one
        batch, whether a context this node does not serve yet is registered."""
        if ctx not in self.contexts:
            if ctx not in known:
                known[ctx] = await self._registered(ctx)
            if not known[ctx]:
                return Rejected(
                    Reason.UNKNOWN_CONTEXT, f"context {ctx} does not exist on this node"
                )
        if not fields_are_strings(fields):
            return Rejected(Reason.MALFORMED, "message fields must map strings to strings")
        try:
            caller, ident = keys.parse_message_key(key)
        except ValueError:
            return Rejected(Reason.MALFORMED, f"{key[:80]!r} is not a message key")
        if fields.get("caller_id") != str(caller) or fields.get("id") != str(ident):
            return Rejected(Reason.MALFORMED, "message fields do not match its key")
        if fields.get("context_id") != str(ctx):
            return Rejected(Reason.MALFORMED, "message is for another context")
        problem = delivery_problem(fields, self.node.config, now())
        stored = records.message_exists
        if (
            problem is not None
            and problem.reason == Reason.EXPIRED
            and await stored(self.node.store, ctx, key)
        ):
            return None  # stored in time, its ack lost: acknowledged again, stored once
        return problem

    async def _registered(self, ctx: int) -> bool:
        """A context registered but not yet picked up by the registry watcher still counts."""
        if not self._valid_db(ctx):
            return False
        return await records.serves_context(self.node.store, ctx)

    def _valid_db(self, ctx: int) -> bool:
        return 0 < ctx < self.node.config.valkey_databases

    # -- answers to what we sent -----------------------------------------------------------------

    async def _answered(self, link: Link, acks: Sequence[Ack], nacks: Sequence[Nack]) -> None:
        """The peer's answer to messages we sent: the acked ones are marked acknowledged (one
        round trip per context), then all of them leave the outbox (one round trip) and their
        places in the link's window open, and each refused one is failed with the peer's
        reason. In that order: a node killed between the two keeps an entry whose ack it
        recorded (sent again after its restart, the peer acks it again), never the reverse,
        an entry gone with its message still unacknowledged, which its deadline service
        would then fail while the peer runs it."""
        await self._mark_acked(link, acks)
        answered = [keys.outbox_entry(a.ctx, a.key) for a in acks]
        answered += [keys.outbox_entry(n.ctx, n.key) for n in nacks]
        link.window.release(
            await records.remove_outbox_inflight(self.node.store, link.peer_id, answered)
        )
        self._count("acks_received", len(acks))
        self._count("nacks_received", len(nacks))
        for nack in nacks:
            await self._nacked(link, nack)

    async def _mark_acked(self, link: Link, acks: Sequence[Ack]) -> None:
        by_ctx: dict[int, list[str]] = {}
        for ctx, key in ((a.ctx, a.key) for a in acks):
            if self._valid_db(ctx):  # we never sent anything else: no need to ask Redis
                by_ctx.setdefault(ctx, []).append(key)
        for ctx, message_keys in by_ctx.items():
            await routing.mark_acked(
                self.node.store, ctx, message_keys, now=now(), peer=link.peer_id
            )

    async def _nacked(self, link: Link, nack: Nack) -> None:
        ctx, key, token, detail = nack.ctx, nack.key, nack.reason, nack.detail
        message = None
        if self._valid_db(ctx):
            try:
                message = await load_message(self.node, ctx, key)
            except Rejected:
                pass
        if message is None or message.destination != link.peer_id:
            log.warning(
                "nack for %s from %s…, which it was not sent to; ignored", key, link.peer_id[:16]
            )
            return
        if message.status is MessageStatus.ERROR:  # e.g. timeout_ack: its client was told
            await self.node.store.dead_letter(ctx, key, f"{Reason.PEER_REFUSED}_{token}", detail)
            return
        await reject(self.node, ctx, key, Rejected.by_peer(token, detail), message, "transport")


def delivery_fields(peer: str, boot: str, stamp: int) -> dict[str, str]:
    """The bookkeeping fields a link adds to a message it stores (before acknowledging it):
    who it came from, and that this boot acknowledges it (read by bus/core/deadlines.py's
    unacknowledged)."""
    text = str(stamp)
    return {
        "status": MessageStatus.DISPATCHED.value,
        "logs": "[]",
        "updated_at": text,
        "received_at": text,
        RECEIVED_FROM: peer,
        ACKED_IN: boot,
    }


def _frame_span(node_id: str, peer_id: str, items: Sequence[MsgItem]) -> spans.Span | None:
    """The CONSUMER span of one ``msgs`` frame from ``peer_id``, linked to the traces of the
    messages it carries (as the sender's values: untrusted, so a bad one links nothing; the
    consumer judges and counts it)."""
    if not spans.recording():
        return None
    links = []
    for item in items:
        traceparent, tracestate = item.fields.get("traceparent"), item.fields.get("tracestate")
        if isinstance(traceparent, str):
            trace = message_trace(traceparent, tracestate if isinstance(tracestate, str) else "")
            if trace.parent is not None:
                links.append(spans.link_to(trace.parent))
    attributes = {spans.PEER: peer_id, spans.NODE: node_id, spans.BATCH_COUNT: len(items)}
    name = f"receive {peer_id[:16]}"
    return spans.start(__name__, name, "CONSUMER", attributes=attributes, links=links)
