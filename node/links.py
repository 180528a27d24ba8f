"""What a node does with the frames its links carry (the transport only authenticates)."""

from __future__ import annotations

import logging

from bus import keys, outbox
from bus.frames import Frame
from bus.ids import now
from bus.models import MessageStatus
from bus.transport import Link
from node.messages import Rejected, load_message, reject
from node.state import NodeState

log = logging.getLogger(__name__)

_ACK_LUA = """
if redis.call('HGET', KEYS[1], 'destination') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'acked_at', ARGV[1])
if redis.call('HGET', KEYS[1], 'status') == 'dispatched' then
  redis.call('HSET', KEYS[1], 'status', 'acknowledged', 'updated_at', ARGV[1])
end
return 1
"""


class LinkHandler:
    """Frame callbacks for :class:`bus.transport.Transport`, bound to one node."""

    def __init__(self, node: NodeState, contexts: set[int]) -> None:
        self.node = node
        self.contexts = contexts  # the contexts this node serves (live set)

    async def on_frame(self, link: Link, frame: Frame) -> None:
        body = frame.body
        if frame.type == "msg":
            await self._deliver(link, body["ctx"], body["key"], dict(body["fields"]))
        elif frame.type == "ack":
            await self._acked(link, body["ctx"], body["key"])
        elif frame.type == "nack":
            await self._nacked(link, body["ctx"], body["key"], body["reason"])
        else:
            await self.on_bad_frame(link, f"unexpected {frame.type} frame after the handshake")

    async def on_bad_frame(self, link: Link, detail: str) -> None:
        log.warning("bad frame from %s…: %s", link.peer_id[:16], detail)
        self.node.count("bad_frames")
        await self.node.store.dead_letter(
            keys.ACTORS_DB, f"link:{link.peer_id}", "bad_frame", detail
        )

    async def _deliver(self, link: Link, ctx: int, key: str, fields: dict[str, str]) -> None:
        """Store the message and queue it on ``msg_in`` before acknowledging it."""
        reason = await self._check_delivery(ctx, key, fields)
        if reason:
            log.warning("refused %s from %s…: %s", key, link.peer_id[:16], reason)
            await self.node.store.dead_letter(keys.ACTORS_DB, key, "refused_delivery", reason)
            link.post("nack", ctx=ctx, key=key, reason=reason)
            return
        stamp = str(now())
        fields |= {
            "status": MessageStatus.DISPATCHED.value,
            "logs": "[]",
            "updated_at": stamp,
            "received_at": stamp,
        }
        fresh = await self.node.store.deliver(ctx, key, fields, keys.MSG_IN)
        self.node.count("delivered" if fresh else "redelivered")
        link.post("ack", ctx=ctx, key=key)

    async def _check_delivery(self, ctx: int, key: str, fields: dict[str, str]) -> str:
        if ctx not in self.contexts and not await self._registered(ctx):
            return f"unknown_context: context {ctx} does not exist on this node"
        try:
            caller, ident = keys.parse_message_key(key)
        except ValueError:
            return f"malformed: {key[:80]!r} is not a message key"
        if fields.get("caller_id") != str(caller) or fields.get("id") != str(ident):
            return "malformed: message fields do not match its key"
        if fields.get("context_id") != str(ctx):
            return "malformed: message is for another context"
        return ""

    async def _registered(self, ctx: int) -> bool:
        """A context registered but not yet picked up by the registry watcher still counts."""
        if not 0 < ctx < self.node.config.valkey_databases:
            return False
        found = await self.node.store.call(
            keys.ACTORS_DB, lambda r: r.sismember(keys.CONTEXTS, str(ctx))
        )
        return bool(found)

    async def _outbox_acked(self, link: Link, ctx: int, key: str) -> None:
        box = self.node.outboxes.get(link.peer_id)
        if box is not None:
            await box.acked(ctx, key)
        else:  # the peer registered a moment ago; its outbox task is starting
            entry = outbox.entry(ctx, key)
            await self.node.store.ack(keys.ACTORS_DB, keys.outbox_inflight(link.peer_id), entry)

    async def _acked(self, link: Link, ctx: int, key: str) -> None:
        await self._outbox_acked(link, ctx, key)
        args = [str(now()), link.peer_id]
        await self.node.store.call(ctx, lambda r: r.eval(_ACK_LUA, [key], args))

    async def _nacked(self, link: Link, ctx: int, key: str, reason: str) -> None:
        await self._outbox_acked(link, ctx, key)
        try:
            message = await load_message(self.node, ctx, key)
        except Rejected:
            message = None
        if message is None or message.destination != link.peer_id:
            log.warning(
                "nack for %s from %s…, which it was not sent to; ignored", key, link.peer_id[:16]
            )
            return
        token, _, detail = reason.partition(": ")
        await reject(
            self.node, ctx, key, Rejected(f"peer_refused_{token}", detail), message, "transport"
        )
