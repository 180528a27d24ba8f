"""Message handling shared by the supervisor and the consumer: loading, rejecting, results."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Literal, TypeVar

from bus.core import keys, spans
from bus.core.envelope import ResultBody, build_result, reply_text, sign_message
from bus.core.ids import now
from bus.core.models import JobStatus, Message, MessageStatus, MessageType, RunnerJob
from bus.core.reasons import Reason
from bus.core.text import printable
from bus.core.tracecontext import MessageTrace, message_trace
from bus.errors import ModelError, Refused, StoreError
from bus.store import records
from bus.store.atomic import routing as atomic_routing
from bus.store.atomic.routing import ResultWrite
from bus.store.connection import Store
from bus.store.serve import Handler, Popped, Queue
from node.errors import Rejected
from node.state import NodeState

log = logging.getLogger(__name__)
T = TypeVar("T")
V = TypeVar("V")


async def load_message(node: NodeState, ctx: int, key: str) -> Message:
    """Read and parse a message hash; Rejected('malformed', ...) if it cannot be used."""
    return parse_message(ctx, key, await records.read_message(node.store, ctx, key))


def parse_message(ctx: int, key: str, fields: Mapping[str, str]) -> Message:
    """Parse the hash stored under ``key`` in context ``ctx``; Rejected if it is unusable."""
    if not fields:
        raise Rejected(Reason.MISSING_HASH, f"{key} has no hash in context {ctx}")
    try:
        message = Message.from_hash(fields)
    except ModelError as exc:
        raise Rejected(Reason.MALFORMED, str(exc)) from None
    if message.key != key:
        raise Rejected(Reason.MALFORMED, f"hash fields name {message.key}, stored under {key}")
    if message.context_id != ctx:
        raise Rejected(Reason.WRONG_CONTEXT, f"message is for context {message.context_id}")
    return message


def parsed_or_none(ctx: int, key: str, fields: Mapping[str, str]) -> Message | None:
    """The message a refused entry holds, if it parses at all (what ``reject`` tells its
    sender depends on it)."""
    try:
        return parse_message(ctx, key, fields)
    except Exception:  # unparsable: refused as such
        return None


class Intake(Handler[T]):
    """The handler of an intake queue (msg_out: the supervisor, msg_in: the consumer): a
    refused message is dead-lettered with its reason, its sender told (:func:`reject`)."""

    name = "intake"
    source = ""  # the queue, where a retry sends a refused message back
    judging = ""  # the operation of a message's first span, the one that judges it

    def __init__(self, node: NodeState, ctx: int, script_types: Collection[str]) -> None:
        self.node, self.ctx, self.script_types = node, ctx, script_types

    async def judged(
        self,
        popped: Popped,
        judge: Callable[[Message], Awaitable[V]],
        outcome: Callable[[V], str],
    ) -> tuple[Message, MessageTrace, V]:
        """The popped message parsed and judged (``judge``) inside its first span, a child of
        the trace it carries, which ends with ``outcome(verdict)`` or with the error (raised
        on: a Rejected is refused by the serve loop)."""
        message = parse_message(self.ctx, popped.value, popped.fields)
        trace = spans.judge_message(self.node.counters.count, message)
        span = self._span(self.judging, message, trace)
        try:
            verdict = await judge(message)
        except BaseException as exc:
            spans.end_error(span, exc)
            raise
        spans.end(span, outcome(verdict))
        return message, trace, verdict

    def _span(self, operation: str, message: Message, trace: MessageTrace) -> spans.Span | None:
        """This queue's span of one message: the judging one a CONSUMER span (the message
        taken from its queue), the others INTERNAL; named by the handler's module."""
        if not spans.recording():
            return None  # not even the node's id read: nothing records it
        kind: Literal["CONSUMER", "INTERNAL"] = (
            "CONSUMER" if operation == self.judging else "INTERNAL"
        )
        return spans.start_message_span(
            type(self).__module__,
            f"{operation} {self.source}",
            kind,
            self.node.identity.node_id,
            self.ctx,
            message,
            trace,
            self.source,
        )

    async def refuse(
        self, store: Store, queue: Queue, popped: Popped, refused: Refused, exc: Exception
    ) -> None:
        node, ctx, key = self.node, self.ctx, popped.value
        message = parsed_or_none(ctx, key, popped.fields)
        rejected = exc if isinstance(exc, Rejected) else Rejected(refused.reason, refused.detail)
        await reject(node, ctx, key, rejected, message, self.name, queue=self.source)
        if isinstance(exc, Rejected) and message is not None:
            await self.rejected(message, rejected)
        await store.ack(ctx, queue.inflight, key)

    async def rejected(self, message: Message, exc: Rejected) -> None:
        """What else refusing a parsed message (by the handler's verdict) takes."""


async def reject(
    node: NodeState,
    ctx: int,
    key: str,
    exc: Rejected,
    message: Message | None,
    service: str,
    *,
    queue: str = "",
) -> None:
    """Dead-letter a message with its reason, mark it failed, and tell its sender why.

    The sender is told through error results for each of its jobs (only for job messages whose
    origin is a node we know), so a client waiting on the reply list does not wait forever.
    """
    log.warning(
        "%s rejected %s (context %d): %s",
        service,
        printable(key),
        ctx,
        exc,
        extra={"message_key": printable(key), "ctx": ctx, "reason": str(exc.reason)},
    )
    node.counters.count(f"rejected_{exc.reason}")
    await node.store.dead_letter(ctx, key, exc.reason, exc.detail, queue=queue)
    if message is None and queue == keys.MSG_OUT:
        await _answer_unparsed(node, ctx, key, exc, service)
    if message is None or exc.reason == Reason.REPLAY:  # a replay's hash is the original's: keep it
        return
    try:
        await _mark_refused(node, ctx, key, exc, message)
    except StoreError:
        raise
    except Exception:  # the dead letter is written; a flaw in telling the sender stops nothing
        log.exception("%s could not tell the sender of %s why", service, printable(key))


async def _answer_unparsed(
    node: NodeState, ctx: int, key: str, exc: Rejected, service: str
) -> None:
    """A message of this node's own clients (``msg_out``) that cannot even be parsed (a
    negative timeout, say) gets no result message, which needs a parsed request: its waiting
    client is answered here, on its reply list, with one error per job the hash names (one
    without a job key if it names none), so that it stops waiting at once: the reply every
    other end writes (:func:`bus.core.envelope.reply_text`)."""
    why, error = f"{exc.reason}: {exc.detail}", JobStatus.ERROR.value
    try:
        jobs = _job_keys(await records.read_message(node.store, ctx, key)) or [""]
        replies = [reply_text(key, job, error, {}, why) for job in jobs]
        reply = keys.reply(key)
        await records.push_replies(node.store, ctx, reply, replies, node.config.reply_ttl_s)
    except StoreError:
        raise
    except Exception:  # the dead letter is written; a flaw in telling the client stops nothing
        log.exception("%s could not answer the client of %s", service, printable(key))


def _job_keys(fields: Mapping[str, str]) -> list[str]:
    """The job keys an unparsable message hash names, read leniently ([] if none can be)."""
    try:
        jobs = json.loads(fields.get("job") or "[]")
        return [keys.job(int(j["caller_id"]), int(j["id"])) for j in jobs]
    except (ValueError, TypeError, KeyError):
        return []


async def _mark_refused(
    node: NodeState, ctx: int, key: str, exc: Rejected, message: Message
) -> None:
    """The refused message's status, and its sender's error results (see :func:`reject`)."""
    await records.mark_message(
        node.store,
        ctx,
        key,
        {"status": MessageStatus.ERROR.value, "reason": exc.reason, "updated_at": str(now())},
    )
    if _should_notify(node, message, exc.reason):
        for job in message.job:
            body = ResultBody(key, job.key, JobStatus.ERROR, {}, f"{exc.reason}: {exc.detail}")
            await queue_result(node, message, body)


# Refusals of messages whose sender is not authenticated: the origin they name may never have
# sent them, so only this node's own clients are told.
UNAUTHENTICATED = frozenset(
    {
        Reason.BAD_SIGNATURE,
        Reason.UNKNOWN_SIGNER,
        Reason.MALFORMED,
        Reason.WRONG_SIGNER,
        Reason.MISSING_HASH,
        Reason.WRONG_CONTEXT,
    }
)


def _should_notify(node: NodeState, message: Message, reason: str) -> bool:
    """Whether the sender of a refused job message gets error results for its jobs.

    Never for a replay (the original was answered; answering again would let an attacker
    overwrite the origin's result); for unauthenticated messages only when they came from
    this node's own clients.
    """
    if (
        message.message_type not in (MessageType.JOB, MessageType.FLOW_JOB)
        or reason == Reason.REPLAY
    ):
        return False
    if reason in UNAUTHENTICATED:
        return message.origin == node.identity.node_id
    return node.peers.is_known_node(message.origin)


REPLY_MEMORY = 16_384  # requests sent to peers whose reply_to Recent.reply_targets keeps


def remember_reply_to(node: NodeState, message: Message) -> None:
    """Keep the signed ``reply_to`` of a job message this node sends to a peer (bounded)."""
    node.recent.reply_targets[message.context_id, message.key] = message.reply_to
    while len(node.recent.reply_targets) > REPLY_MEMORY:
        node.recent.reply_targets.popitem(last=False)


async def reply_targets(node: NodeState, ctx: int, requests: list[str]) -> list[str]:
    """The ``reply_to`` of each request that results answer: remembered since it was sent,
    else read from the requests (one round trip for all those, after a restart say)."""
    known = {r: node.recent.reply_targets.get((ctx, r)) for r in requests}
    unknown = sorted(r for r, reply_to in known.items() if reply_to is None)
    found = await atomic_routing.reply_targets(node.store, ctx, unknown)
    read = dict(zip(unknown, found, strict=True))
    return [known[r] or read.get(r, "") for r in requests]


def signed_here(node: NodeState, message: Message) -> bool:
    """True once if this node signed ``message`` (same key, same signature) since it started:
    itself (:func:`result_message`), or its signer for a runner process (the signer's notices,
    node/host/signer.py): the supervisor's shortcut, see check_outgoing. Both are one memory,
    the state's ``recent.signed_results``; on a miss, the signer's notices that wait in their
    socket are taken into it (the supervisor is their one reader), and it is looked at again.
    Bounded: what fell out, or was signed before a restart, is verified like any other."""
    signature = node.recent.signed_results.take(message.key)
    signer = node.identity.signer
    if signature is None and signer is not None:
        signer.hear()  # a batch's notices all at once: its other results find theirs above
        signature = node.recent.signed_results.take(message.key)
    return signature is not None and message.signatures == [signature]


def result_message(node: NodeState, request: Message, body: ResultBody) -> Message:
    """A result message answering ``request`` (:func:`bus.core.envelope.build_result`), signed
    by this node, addressed to its origin."""
    msg = build_result(request, body, origin=node.identity.node_id)
    signed = sign_message(msg, node.identity.key)
    node.recent.signed_results.keep(signed.key, signed.signatures[0])
    return signed


async def queue_result(node: NodeState, request: Message, body: ResultBody) -> None:
    msg = result_message(node, request, body)
    await atomic_routing.queue_outgoing(node.store, request.context_id, msg)


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


async def answer_unrunnable(
    node: NodeState, ended: list[tuple[Message, RunnerJob, Rejected]], refused: set[str]
) -> None:
    """Answer each job materialised in error, as it would never run here (node/intake/admission.py:
    unrunnable), unless its message was ``refused``: its origin, and the client waiting there,
    learn why at once."""
    for message, job, why in ended:
        if message.key in refused:
            continue
        detail = f"{why.reason}: {why.detail}"
        log.warning(
            "job %s: %s",
            job.key,
            detail,
            extra={"job": job.key, "ctx": message.context_id, "reason": why.reason},
        )
        node.counters.count(f"unrunnable_{why.reason}")
        await queue_result(
            node, message, ResultBody(message.key, job.key, JobStatus.ERROR, {}, detail)
        )
