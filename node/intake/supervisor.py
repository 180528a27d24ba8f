"""The supervisor of one context: pops ``msg_out``, checks the sender, routes the message.

Routing: to this node's own ``msg_in`` when the destination is this node, else to the durable
outbox of the destination peer. A message that fails a check goes to ``dlq`` with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import NoReturn

import trio

from bus.core import keys, spans
from bus.core.deadlines import ack_deadline, deadline_times
from bus.core.ids import now
from bus.core.models import Hash, JobStatus, Message, MessageType
from bus.core.reasons import Reason
from bus.core.tracecontext import NO_TRACE, MessageTrace
from bus.errors import StoreError
from bus.store import records, serve
from bus.store.atomic import routing
from bus.store.atomic.queues import JobWrite
from bus.store.serve import Popped, Queue, serve_queue
from node.intake.admission import Intake, admit, materialise_fresh, parse_message
from node.intake.messages import Rejected
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "supervisor"
HIGH_WATER = 256
BACKPRESSURE_MAX_S = 2.0


async def run_supervisor(
    node: NodeState,
    ctx: int,
    script_types: Collection[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Route context ``ctx``'s outgoing messages until cancelled; reports started after
    recovery. Raises StoreError if Valkey fails (see bus/store/serve.py)."""
    queue = Queue(ctx, keys.MSG_OUT, keys.inflight(SERVICE), registry=True)
    await serve_queue(
        node.store, queue, Supervisor(node, ctx, script_types), task_status=task_status
    )


class Supervisor(Intake[Message]):
    """Each message of msg_out is checked (:func:`check`); the batch of those that may go on
    is routed together, the jobs that run on this node materialised in one step."""

    name, source, judging = SERVICE, keys.MSG_OUT, "admit"

    def __init__(self, node: NodeState, ctx: int, script_types: Collection[str]) -> None:
        super().__init__(node, ctx, script_types)
        self.hashes: dict[str, Hash] = {}  # the hashes of the checked messages of this pop
        self.traces: dict[str, MessageTrace] = {}  # and the traces they continue

    async def each(self, popped: Popped) -> Message:
        message, trace, _ = await self.judged(
            popped,
            lambda m: check_parsed(self.node, self.ctx, m, popped.fields),
            lambda _: "admitted",
        )
        self.hashes[popped.value] = popped.fields  # a batch follows: it takes them
        self.traces[popped.value] = trace
        return message

    async def batch(self, items: list[Message]) -> None:
        hashes, self.hashes = self.hashes, {}
        traces, self.traces = self.traces, {}
        routes = [(m, self._span("route", m, traces.get(m.key, NO_TRACE))) for m in items]
        try:
            await handle_batch(self.node, self.ctx, items, self.script_types, hashes)
        except BaseException as exc:
            for _, span in routes:
                spans.end_error(span, exc)
            raise
        node_id = self.node.identity.node_id
        for message, span in routes:
            if span is None:  # not recorded: no outcome to build
                continue
            where = "local" if message.destination == node_id else "outbox"
            spans.end(span, where, attributes={spans.PEER: message.destination})

    async def rejected(self, message: Message, exc: Rejected) -> None:
        """A refused job message of this node's own clients gets failed copies of its jobs."""
        if message.message_type is MessageType.JOB:
            await _refused_copies(self.node, self.ctx, message, exc)


async def handle_batch(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    script_types: Collection[str],
    hashes: Mapping[str, Hash] | None = None,
) -> None:
    """Route checked messages popped together from msg_out, the jobs that run on this node
    materialised together in one step (a batch of one when the queue is short); ``hashes``:
    the messages' hashes as read, by key, which a peer's outbox then need not read again."""
    inflight = keys.inflight(SERVICE)
    local: list[Message] = []
    remote: list[Message] = []
    for message in messages:
        if message.destination == node.identity.node_id and message.message_type is MessageType.JOB:
            local.append(message)
        else:
            remote.append(message)
    if remote:
        await route_many(node, ctx, remote, inflight, hashes or {})
    if local:
        # no new job while the node lacks room (node/intake/pressure.py): they wait here, in flight
        await node.pressure.hold.wait_open()
        await _backpressure(node, ctx, local)
        await materialise_fresh(node, ctx, local, script_types, inflight, SERVICE)
        node.counters.count("routed", len(local))


async def _backpressure(node: NodeState, ctx: int, local: list[Message]) -> None:
    """Materialise no further ahead of the runners than HIGH_WATER queued jobs per type: a deep
    msg_out backlog then costs the runners nothing while they work (it waits, unverified, in
    msg_out). When the queue is at the mark, wait until this node's runners have taken enough
    for a whole batch to fit (one wake-up and one LLEN per batch, not per job); re-checked at
    least every second (runners of other processes, e.g. external ones, take jobs too). Never
    waits more than BACKPRESSURE_MAX_S per batch, so the other messages in msg_out (results to
    route back, stops) are delayed by at most that while this node's runners are saturated.
    Far from the mark (as the last materialisation found the queue), it costs no round trip,
    nor the set of ``local``'s types (the job messages about to be materialised), whose
    queues it measures.

    The mark counts the type's queue only. With a fair share below it (``fair_share_jobs``,
    100 by default), one actor's jobs past its share wait in its own list instead
    (node/intake/fair_share.py), so a single actor's backlog is judged and materialised ahead
    into that list, up to its queue bound: that is what lets another actor's later job pass
    it, and what a node restarted on a deep backlog does while its runners come up."""
    if (
        node.backpressure.queue_depth.get(ctx, 0) < HIGH_WATER
    ):  # no round trip while far from the mark
        return
    script_types = {j.script_type for m in local for j in m.job}
    with trio.move_on_after(BACKPRESSURE_MAX_S):
        while True:
            depths = await records.queue_depths(node.store, ctx, script_types)
            depth = node.backpressure.queue_depth[ctx] = max(depths, default=0)
            if depth < HIGH_WATER:
                return
            with trio.move_on_after(1.0):
                await node.backpressure.wait_jobs_taken(depth - (HIGH_WATER - serve.BATCH))


async def check(node: NodeState, ctx: int, key: str, fields: dict[str, str]) -> Message:
    """The message under ``key`` when it may go on (routed with its batch; a job for this
    node is materialised right here: the caller was just verified, so no second hop through
    msg_in and no second verification); Rejected with the reason it may not."""
    message = parse_message(ctx, key, fields)
    await check_parsed(node, ctx, message, fields)
    return message


async def check_parsed(node: NodeState, ctx: int, message: Message, fields: Hash) -> None:
    """:func:`check` of a message already parsed from ``fields``."""
    await check_outgoing(node, ctx, message, fields)
    if message.destination != node.identity.node_id and message.destination not in node.peers.known:
        raise Rejected(
            Reason.UNKNOWN_DESTINATION, f"node {message.destination[:16]}… is not a peer"
        )
    if message.destination != node.identity.node_id and message.message_type is MessageType.JOB:
        ack_in_s = ack_deadline(message) - now()
        why = node.peers.breakers.refusal(message.destination, ack_in_s)
        if why is not None:
            raise Rejected(Reason.PEER_UNAVAILABLE, why)


async def _refused_copies(node: NodeState, ctx: int, message: Message, exc: Rejected) -> None:
    """A refused job message of this node's own clients never reaches route_many: its jobs'
    copies are written here, failed, so that the client sees why (its error result, queued by
    ``reject``, passes through this same task later, so it lands on the copy)."""
    if message.origin != node.identity.node_id:
        return
    failed = {"status": JobStatus.ERROR.value, "reason": exc.reason, "updated_at": str(now())}
    try:
        await routing.write_copies(node.store, ctx, message.key, origin_copies(message, failed))
    except StoreError:
        raise
    except Exception:  # the refusal is recorded already; a copy that cannot be written stops
        # nothing (a job key that holds another type, say)
        log.exception("no failed job copies for refused %s (context %d)", message.key, ctx)


async def check_outgoing(
    node: NodeState, ctx: int, message: Message, stored: Mapping[str, str]
) -> None:
    """Rejected unless ``message`` (parsed from ``stored``, the hash as popped) may leave
    msg_out: the one admission check (node/intake/admission.py), as the consumer runs it on
    msg_in."""
    await admit(node, ctx, message, incoming=False, stored=stored)


async def route_many(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    inflight: str,
    hashes: Mapping[str, Hash],
) -> None:
    """Send checked messages on: to this node's msg_in, or to each peer's durable outbox (one
    pipelined write per database), then acknowledge them all. A job message to a peer gets this
    node's copy of its jobs (the client wrote only the message: the origin tracks status and
    result in the copy) and arms its ack and result deadlines. The peer's outbox is handed the
    hashes just read with the entries (PeerOutbox.remember)."""
    by_peer: dict[str, list[str]] = {}
    known = node.pressure.inbound.known[ctx]  # the consumer's pop takes them from here
    for m in messages:
        if m.destination == node.identity.node_id and m.key in hashes:
            known.remember(m.key, hashes[m.key])
        elif m.destination != node.identity.node_id:
            value = keys.outbox_entry(ctx, m.key)
            by_peer.setdefault(m.destination, []).append(value)
            box = node.peers.outboxes.get(m.destination)
            if box is not None and m.key in hashes:
                box.remember(value, hashes[m.key])
            if m.message_type is MessageType.JOB:
                node.recent.remember_reply_to(m)
    if by_peer:
        await routing.push_outboxes(node.store, by_peer)
    stamp = str(now())
    counted: list[str] = []
    routed = [_routed(node, m, stamp) for m in messages]
    await routing.route(node.store, ctx, inflight, routed, counted)
    node.job_stats.add(ctx, counted)
    armed = [t for r in routed if r.deadlines is not None for t in r.deadlines]
    if armed:
        node.wakeups.deadline_armed(ctx, min(armed))
    node.counters.count("routed", len(messages))


def _routed(node: NodeState, message: Message, stamp: str) -> routing.Routed:
    """What routing ``message`` writes besides its outbox entry (see route_many)."""
    if message.destination == node.identity.node_id:
        return routing.Routed(message.key, True, [], None)
    if message.message_type is not MessageType.JOB:
        return routing.Routed(message.key, False, [], None)
    copies = origin_copies(message, {"updated_at": stamp})
    times = deadline_times(message, node.identity.freshness.max_skew_s)
    return routing.Routed(message.key, False, copies, times)


def origin_copies(message: Message, fields: dict[str, str]) -> list[JobWrite]:
    """The origin's copy of each job of ``message`` (job hash as the message carries it,
    linked to the message), with ``fields`` on top; written never over another message's job
    (bus.store.atomic.routing.write_own_job), and none under another caller's key (a refused message
    may name one)."""
    base = {"created_at": str(message.created_at), "message_key": message.key}
    return [
        JobWrite(job.key, "", job.to_hash() | base | fields)
        for job in message.job
        if job.caller_id == message.caller_id
    ]
