"""The consumer of one context: pops ``msg_in``, verifies, authorises, and materialises jobs.

Job messages must be signed by the registered key of ``actor:<caller_id>`` and the caller must be
an admin or executor of the context; each job becomes ``job:<caller_id>:<id>`` and its key is
queued on ``queue:<script_type>``. Result messages must be signed by the node that executed the
job; they update the origin's job copy and wake the waiting client. Materialising is idempotent
by message key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from typing import NoReturn

import trio

from bus.core import keys, spans
from bus.core.deadlines import RECEIVED_FROM, unacknowledged
from bus.core.envelope import ResultBody
from bus.core.ids import now
from bus.core.models import JobStatus, Message, MessageStatus, MessageType
from bus.core.reasons import Reason
from bus.core.tracecontext import NO_TRACE, MessageTrace, message_trace
from bus.store import records
from bus.store.atomic import routing
from bus.store.atomic.routing import ResultWrite
from bus.store.serve import Done, Popped, Queue, serve_queue
from node.intake.admission import Intake, admit, materialise_fresh
from node.intake.held import hold
from node.intake.messages import Rejected, reject
from node.intake.stops import apply_stop
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "consumer"
VerifiedResult = tuple[Message, ResultBody]  # a result message and its decoded body


async def run_consumer(
    node: NodeState,
    ctx: int,
    script_types: Collection[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Process context ``ctx``'s incoming messages until cancelled; reports started after
    recovery. Raises StoreError if Valkey fails (see bus/store/serve.py)."""
    queue = msg_in_queue(node, ctx)
    await serve_queue(node.store, queue, Consumer(node, ctx, script_types), task_status=task_status)


def msg_in_queue(node: NodeState, ctx: int) -> Queue:
    """Context ``ctx``'s ``msg_in`` as the consumer pops it: with the hashes links and the
    supervisor pushed handed over, and what it takes off counted off its peers' links'
    waiting messages at once (node.state.Inbound: they may deliver more)."""
    inbound = node.pressure.inbound
    known = inbound.known[ctx]
    inflight = keys.inflight(SERVICE)
    return Queue(ctx, keys.MSG_IN, inflight, registry=True, known=known, taken=inbound.popped)


class Consumer(Intake["Message | VerifiedResult"]):
    """Each message of msg_in is admitted (:func:`handle_incoming`); the batch's verified
    results are accepted together, then its job messages materialised in one step."""

    name, source, judging = SERVICE, keys.MSG_IN, "verify"

    def __init__(self, node: NodeState, ctx: int, script_types: Collection[str]) -> None:
        super().__init__(node, ctx, script_types)
        self.traces: dict[str, MessageTrace] = {}  # of this pop's admitted job messages

    async def each(self, popped: Popped) -> Message | VerifiedResult | Done:
        message, trace, verdict = await self.judged(
            popped, lambda m: handle_incoming(self.node, self.ctx, m, popped.fields), _outcome
        )
        if isinstance(verdict, Message):
            self.traces[message.key] = trace
        return verdict

    async def batch(self, items: list[Message | VerifiedResult]) -> None:
        node, ctx, inflight = self.node, self.ctx, keys.inflight(SERVICE)
        traces, self.traces = self.traces, {}
        results = [i for i in items if isinstance(i, tuple)]
        jobs = [i for i in items if not isinstance(i, tuple)]
        if results:
            await accept_results(node, ctx, results, inflight)
        if jobs:
            # no new job while the node lacks room (node/intake/pressure.py): they wait here
            await node.pressure.hold.wait_open()
            made = [(m, self._span("materialise", m, traces.get(m.key, NO_TRACE))) for m in jobs]
            try:
                await materialise_fresh(node, ctx, jobs, self.script_types, inflight, SERVICE)
            except BaseException as exc:
                for _, span in made:
                    spans.end_error(span, exc)
                raise
            for _, span in made:
                spans.end(span, "materialised")


def _outcome(verdict: Message | VerifiedResult | Done) -> str:
    """What admitting a message led to, as its span says."""
    if isinstance(verdict, Message):
        return "admitted"
    if isinstance(verdict, tuple):
        return "result"
    return "handled"  # a stop applied, a delivery held, a chat or mail stored


async def handle_incoming(
    node: NodeState, ctx: int, message: Message, stored: Mapping[str, str]
) -> Message | VerifiedResult | Done:
    """Accept ``message``: an admitted job (or flow job) message is returned as it is, a
    result message with its verified body (both accepted with their batch, replay checks
    included); a stop is applied and acknowledged; chat and mail are stored (Done.ACK).
    Raises Rejected with the reason it is refused (the one admission check:
    node/intake/admission.py); ``stored``: the hash ``message`` was parsed from, as popped."""
    body = await admit(node, ctx, message, incoming=True, stored=stored)
    if body is not None:
        return message, body
    if message.message_type in (MessageType.JOB, MessageType.FLOW_JOB):
        peer = unacknowledged(node.identity.boot, message, stored)
        if not peer and not await node.pressure.inbound.owed.written(ctx, message.key):
            peer = stored.get(RECEIVED_FROM, "")  # its link ended before its ack was written
        if peer:  # maybe never acknowledged (that, or a restart): not run until it is
            await hold(node, ctx, message, peer, keys.inflight(SERVICE))
            return Done.ACKED
        return message
    if message.message_type is MessageType.STOP:
        await apply_stop(node, ctx, message)
        inflight = keys.inflight(SERVICE)
        await routing.accept_stop(node.store, ctx, inflight, stop_accept(node, message))
        return Done.ACKED
    # chat and mail are stored; nothing runs
    await records.mark_message(
        node.store, ctx, message.key, {"status": MessageStatus.PROCESSED.value}
    )
    return Done.ACK


def stop_accept(node: NodeState, message: Message) -> routing.StopAccept:
    """What accepting stop ``message`` writes: its replay markers, kept for the freshness
    window."""
    nonce_key = keys.nonce(message.caller_id, message.nonce) if message.nonce else ""
    return routing.StopAccept(message.key, node.identity.freshness.window_s, nonce_key)


async def accept_results(
    node: NodeState, ctx: int, results: list[VerifiedResult], inflight: str
) -> None:
    """Apply a batch of verified result messages in one round trip (one more to read the
    requests' inboxes when the node does not remember them): one atomic script checks each
    against what Redis knows and writes its job copy, its request and the reply that wakes the
    client, then the batch's replay markers and its ack.
    Each refused one (a replay, also of another in this batch; an unknown request; a late
    result; a signer the request was not sent to) is dead-lettered and acknowledged alone."""
    inboxes = await reply_targets(node, ctx, [body.in_reply_to for _, body in results])
    accepts = [
        routing.ResultAccept(
            message_key=message.key,
            nonce_key=keys.nonce(message.caller_id, message.nonce) if message.nonce else "",
            origin=message.origin,
            write=result_write(node, body, reply_to),
        )
        for (message, body), reply_to in zip(results, inboxes, strict=True)
    ]
    counted: list[str] = []
    made = start_result_spans(node, ctx, results)
    verdicts = await routing.accept_results(
        node.store,
        ctx,
        inflight,
        accepts,
        window_s=node.identity.freshness.window_s,
        node_id=node.identity.node_id,
        counted=counted,
    )
    node.job_stats.add(ctx, counted)
    end_result_spans(made, verdicts)
    for (message, body), (reason, detail) in zip(results, verdicts, strict=True):
        if reason != "ok":
            exc = _refusal(ctx, message, body, Reason(str(reason)), str(detail))
            await reject(node, ctx, message.key, exc, message, SERVICE, queue=keys.MSG_IN)
            await node.store.ack(ctx, inflight, message.key)


async def reply_targets(node: NodeState, ctx: int, requests: list[str]) -> list[str]:
    """The ``reply_to`` of each request that results answer: remembered since it was sent,
    else read from the requests (one round trip for all those, after a restart say)."""
    known = {r: node.recent.reply_targets.get((ctx, r)) for r in requests}
    unknown = sorted(r for r, reply_to in known.items() if reply_to is None)
    found = await routing.reply_targets(node.store, ctx, unknown)
    read = dict(zip(unknown, found, strict=True))
    return [known[r] or read.get(r, "") for r in requests]


def result_write(node: NodeState, body: ResultBody, reply_to: str = "") -> ResultWrite:
    """What ``body`` changes at the origin: the job copy's final state, the request's status,
    the reply that wakes the waiting client (with a TTL; on the inbox the request's
    ``reply_to`` names, if any) and, for a flow's job, a wake-up of the flow engine
    (node/flows/engine.py); see bus/store/atomic/lua/routing_apply_result_fn.lua."""
    request_status = (
        MessageStatus.PROCESSED if body.status is JobStatus.FINISHED else MessageStatus.ERROR
    )
    return ResultWrite(
        job_key=body.job_key,
        request=body.in_reply_to,
        status=body.status.value,
        result=json.dumps(body.result),
        reason=body.reason,
        stamp=now(),
        request_status=request_status.value,
        reply=body.reply(),  # what the client reads (PROTOCOL.md section 8)
        reply_ttl_s=node.config.reply_ttl_s,
        reply_to=reply_to,
    )


def start_result_spans(
    node: NodeState, ctx: int, results: list[tuple[Message, ResultBody]]
) -> list[spans.Span | None]:
    """The result's way back, at its origin: one span per result applied (the job copy, the
    request, the client's reply), a child of the trace the result carries (its request's,
    bus/core/envelope.py build_result). The result was judged when it was verified: its
    trace context is not counted a second time. [] while nothing is recorded."""
    if not spans.recording():
        return []
    made = []
    for message, body in results:
        trace = message_trace(message.traceparent, message.tracestate)
        span = spans.start_message_span(
            __name__,
            f"apply {keys.MSG_IN}",
            "INTERNAL",
            node.identity.node_id,
            ctx,
            message,
            trace,
            keys.MSG_IN,
        )
        if span is not None:
            span.set_attribute(spans.JOB_KEY, body.job_key)
            span.set_attribute("hero.request.id", body.in_reply_to)
        made.append(span)
    return made


def end_result_spans(made: list[spans.Span | None], verdicts: list[tuple[str, str]]) -> None:
    """End the spans of :func:`start_result_spans` with each result's verdict."""
    for span, (reason, _) in zip(made, verdicts, strict=False):
        if reason == "ok":
            spans.end(span, "applied")
        else:
            spans.end(span, "rejected", str(reason))


def _refusal(ctx: int, message: Message, body: ResultBody, reason: Reason, detail: str) -> Rejected:
    request = body.in_reply_to
    if reason == Reason.WRONG_TYPE:
        return Rejected(reason, f"{detail}, not what a result updates")
    if reason == Reason.REPLAY:
        return Rejected(Reason.REPLAY, f"{detail} of {message.key} was already accepted")
    if reason == Reason.UNKNOWN_REQUEST:
        return Rejected(reason, f"no request {request} in context {ctx}")
    if reason == Reason.LATE_RESULT:
        return Rejected(reason, f"{request} already ended: {detail}")
    return Rejected(reason, f"{request} was not sent to the node that answered")
