"""Trace asks over the links (bus/core/traces.py): carrying a client's ask to a peer, answering
a peer's ask from this node's records, and handing the answer back to the client.

The answering side checks, in this order: the ask's shape and size, that its link comes from the
node it names and that it is for this node and fresh, then against this node's own registry that
the context exists, the actor is registered, its signature verifies and it is a reader, executor
or admin of the context. A refusal is answered (a ``tell`` with the reason), logged and counted
(``trace_refused_<reason>``); nothing in an ask can raise out of the link's reader.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import trio

from bus.core.ids import now
from bus.core.reasons import Reason
from bus.core.traces import (
    FLOW_FIELDS,
    JOB_FIELDS,
    MAX_ASK_BYTES,
    MAX_TELL_BYTES,
    MESSAGE_FIELDS,
    Ask,
    AskRefused,
    Tell,
    actor_problem,
    ask_problem,
    flow_dag,
    parse_ask,
    parse_tell,
    told_attempts,
    told_fields,
)
from bus.errors import ContentError
from bus.store import records, traces
from bus.store.connection import Store
from bus.wire.transport import Link, Transport
from node.state import NodeState

log = logging.getLogger(__name__)

ASK_WAIT_S = 5.0  # the bound of one blocking pop for the next ask
MAX_OUTSTANDING = 256  # asks carried and not answered yet; the oldest is forgotten past this


async def read_told(store: Store, ctx: int, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What this node tells of ``names`` in context ``ctx`` (bus/core/traces.py's fields only):
    absent keys are left out; a job's message comes with it. The command's own node reads its
    records the same way it answers a peer."""
    told: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            if name.startswith("flow:"):
                fields = await records.read_flow(store, ctx, int(name.removeprefix("flow:")))
                if fields:
                    told[name] = {
                        "fields": told_fields(fields, FLOW_FIELDS),
                        "dag": flow_dag(fields),
                    }
                continue
            fields = await records.read_record(store, ctx, name)
            if not fields:
                continue
            if name.startswith("message:"):
                told[name] = {"fields": told_fields(fields, MESSAGE_FIELDS)}
                continue
            told[name] = {
                "fields": told_fields(fields, JOB_FIELDS),
                "attempts": told_attempts(_entries(await records.read_attempts(store, ctx, name))),
            }
            carrier = fields.get("message_key", "")
            if carrier.startswith("message:") and carrier not in told:
                message = await records.read_message(store, ctx, carrier)
                if message:
                    told[carrier] = {"fields": told_fields(message, MESSAGE_FIELDS)}
        except ContentError as exc:  # a key of another type: not a record to tell
            log.info("trace: %s in context %d not told: %s", name[:80], ctx, exc)
    return told


def _entries(texts: Sequence[str]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for text in texts:
        try:
            entry = json.loads(text)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


class TraceDesk:
    """The node's side of trace asks: ``carry_asks`` carries its clients' asks to peers, ``on_ask``
    and ``on_tell`` are the link handler's callbacks for the two frames."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        # ask id -> the peer it was carried to: only that peer's tell is handed to the client
        self._carried: OrderedDict[int, str] = OrderedDict()

    async def carry_asks(
        self, transport: Transport, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Carry each ask a client hands this node to its target peer. Reports started at
        once. Raises StoreError when the store fails (node.resilient restarts it)."""
        task_status.started()
        while True:
            text = await traces.next_ask(self.node.store, ASK_WAIT_S)
            if text is not None:
                await self._carry(transport, text)

    async def _carry(self, transport: Transport, text: str) -> None:
        try:
            ask = parse_ask(json.loads(text))
        except (ValueError, RecursionError, AskRefused) as exc:
            log.warning("trace ask from a client dropped: %s", exc, extra={"reason": "malformed"})
            self.node.counters.count("trace_asks_malformed")
            return
        if ask.node != self.node.identity.node_id:
            refused = AskRefused(Reason.WRONG_ORIGIN, "the ask names another node than this one")
            await self._answer_client(ask, refused)
            return
        link = transport.link(ask.target)
        if link is None:
            detail = f"no link to {ask.target[:16]}… now"
            await self._answer_client(ask, AskRefused(Reason.PEER_UNAVAILABLE, detail))
            return
        self._carried[ask.id] = ask.target
        while len(self._carried) > MAX_OUTSTANDING:
            self._carried.popitem(last=False)
        link.post("ask", ask=ask.to_dict())
        self.node.counters.count("trace_asks_sent")

    async def _answer_client(self, ask: Ask, refused: AskRefused) -> None:
        tell = Tell(ask.id, ask.target, reason=refused.reason, detail=refused.detail)
        await traces.tell_client(self.node.store, ask.id, json.dumps(tell.to_dict()))

    # -- a peer's ask ----------------------------------------------------------------------------

    async def on_ask(self, link: Link, body: Mapping[str, Any]) -> None:
        raw = body.get("ask")
        ask_id = raw.get("id") if isinstance(raw, dict) else None
        ask_id = ask_id if isinstance(ask_id, int) and not isinstance(ask_id, bool) else 0
        try:
            if len(json.dumps(raw)) > MAX_ASK_BYTES:
                raise AskRefused(Reason.OVERSIZE, f"ask larger than {MAX_ASK_BYTES} bytes")
            ask = parse_ask(raw)
            problem = ask_problem(
                ask,
                link_peer=link.peer_id,
                own_id=self.node.identity.node_id,
                now=now(),
                freshness=self.node.identity.freshness,
            ) or await self._registry_problem(ask)
            if problem is not None:
                raise problem
            told = await read_told(self.node.store, ask.context_id, ask.keys)
            tell = Tell(ask.id, self.node.identity.node_id, told).to_dict()
            if len(json.dumps(tell)) > MAX_TELL_BYTES:
                raise AskRefused(Reason.OVERSIZE, f"answer larger than {MAX_TELL_BYTES} bytes")
        except AskRefused as refused:
            self._refused(link, ask_id, refused)
            return
        link.post("tell", tell=tell)
        self.node.counters.count("trace_asks_answered")

    async def _registry_problem(self, ask: Ask) -> AskRefused | None:
        ctx = ask.context_id
        if not 0 < ctx < self.node.config.valkey_databases:
            return actor_problem(ask, None, "", None)
        version = await self.node.registry.version()
        context = await self.node.registry.context(ctx, version)
        actor = await self.node.registry.actor(ask.caller_id, version)
        readers = None
        if context is not None:
            readers = [*context.readers, *context.executors, *context.admins]
        pubkey = actor.pubkey if actor is not None else None
        algorithm = actor.algorithm if actor is not None else ""
        return actor_problem(ask, pubkey, algorithm, readers)

    def _refused(self, link: Link, ask_id: int, refused: AskRefused) -> None:
        log.warning(
            "trace ask %d from %s… refused: %s",
            ask_id,
            link.peer_id[:16],
            refused,
            extra={"peer": link.peer_id, "reason": refused.reason},
        )
        self.node.counters.count(f"trace_refused_{refused.reason}")
        tell = Tell(
            ask_id, self.node.identity.node_id, reason=refused.reason, detail=refused.detail
        )
        link.post("tell", tell=tell.to_dict())

    # -- a peer's answer -------------------------------------------------------------------------

    async def on_tell(self, link: Link, body: Mapping[str, Any]) -> None:
        raw = body.get("tell")
        try:
            tell = parse_tell(raw)
        except AskRefused as bad:
            log.warning("bad tell from %s…: %s", link.peer_id[:16], bad)
            self.node.counters.count("trace_tells_malformed")
            ask_id = raw.get("ask") if isinstance(raw, dict) else None
            if isinstance(ask_id, int) and self._carried.get(ask_id) == link.peer_id:
                del self._carried[ask_id]  # its client is told why, not left to time out
                said = Tell(ask_id, link.peer_id, reason=bad.reason, detail=bad.detail)
                await traces.tell_client(self.node.store, ask_id, json.dumps(said.to_dict()))
            return
        if self._carried.get(tell.ask) != link.peer_id:
            log.warning(
                "tell for ask %d from %s…, which was not asked", tell.ask, link.peer_id[:16]
            )
            self.node.counters.count("trace_tells_unasked")
            return
        del self._carried[tell.ask]
        told = Tell(tell.ask, link.peer_id, tell.records, tell.reason, tell.detail)
        await traces.tell_client(self.node.store, tell.ask, json.dumps(told.to_dict()))
