"""Admission: the one decision on whether this node accepts a message, whatever its path, and
the atomic write that completes it for a job message (its jobs materialised).

Two paths lead here: the supervisor (``msg_out``: what this node's clients and services submit;
a job for this node is materialised right there) and the consumer (``msg_in``: what peers
delivered, and what this node routes to itself). Both are :class:`Intake` handlers: each entry
they pop is parsed here (:func:`parse_message`: a hash that is no message of this context is
refused as ``missing_hash``, ``malformed`` or ``wrong_context``) and judged by :func:`admit`,
so a message is judged by the same checks on either: its size (``oversize``), its shape (a
job's caller and context are the message's; a stop names a job; a result's body decodes), its
signature against the registered key, its freshness, the caller's permission in the context
and, for a job message from a peer, its signed ack deadline. Replays are refused atomically
where what a message causes is written: job and flow-job messages by the materialise script
(:func:`materialise_many`), results by the consumer's accept script; stops here.

Materialising a batch (replay check, job hashes, queue entries, message status, replay markers,
in-flight ack) is one Lua call (bus/store/atomic/lua/queues_materialise.lua). Each job hash it
writes carries the node's admission stamp (bus/core/admitted.py): no other place writes a job
after :func:`admit` accepted its message, and a runner process runs nothing without the stamp.

The ack deadline of a job message (signed: bus/core/deadlines.py): a destination refuses a job
message it receives (node/links/frames.py) or takes from ``msg_in`` after it (``expired``); its
origin declares the message failed only after it plus the allowed clock skew
(node/intake/deadlines.py). So, for clocks within ``max_skew_s`` of each other, a message its
client was told failed never runs.

Actors and contexts come from the node's cache (node/state.py), kept while ``registry:version``
holds the value they were loaded under: every write of an actor or a context bumps it, and the
script that pops what admission judges reads it after its pops (Store.pop_read_batch and
pop_read_wait: no round trip of its own), so a key removed or a permission withdrawn before a
message was submitted is never granted from the cache. Any refusal is re-checked against Redis
before it stands, so nothing granted a moment ago is refused because of the cache either.

Queue bounds: an actor may hold at most ``max_queued_per_actor`` jobs queued and not started
yet in a context, the context at most ``max_queued_per_context`` (:func:`queue_bounds`), so
one flooding actor neither exhausts the store nor delays the other actors' jobs by more than
its bound. The counts live in Valkey and a bound can only hold if it is checked in the same
atomic step that queues the jobs and counts them (two batches may materialise at once, on
this node's two paths or after a restart): so the materialise script checks them, with the
bounds decided here, and its verdict becomes the refusal here (:func:`quota_refusal`,
``quota_exceeded``), dead-lettered and answered like every other.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Literal, NamedTuple, TypeVar

from bus.core import admitted, keys, spans
from bus.core.deadlines import ack_deadline
from bus.core.envelope import ResultBody
from bus.core.ids import now
from bus.core.models import JobStatus, Message, MessageType, RunnerJob
from bus.core.queues import target_queue
from bus.core.reasons import Reason
from bus.core.tracecontext import MessageTrace
from bus.core.verify import freshness_problem, judge, permission_problem
from bus.errors import ModelError, Refused
from bus.store import records
from bus.store.atomic.queues import JobWrite, materialise_batch
from bus.store.connection import Store
from bus.store.serve import Handler, Popped, Queue
from node.config import NodeConfig
from node.flows.trust import authorise_flow_job
from node.intake.messages import Rejected, answer_unrunnable, reject, signed_here
from node.intake.stops import parse_stop
from node.sandbox.probe import Isolation
from node.state import NodeState

log = logging.getLogger(__name__)
T = TypeVar("T")
V = TypeVar("V")

NODE_SIGNED = (MessageType.RESULT, MessageType.FLOW_JOB)
# the node counter of messages whose signature verified (node/observe/metrics.py)
VERIFIED = "signatures_verified"


# -- an intake queue's entry: parsed, then judged ---------------------------------------------


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
    """The handler of an intake queue (msg_out: the supervisor, msg_in: the consumer): each
    popped entry parsed and judged (:meth:`judged`); a refused message is dead-lettered with
    its reason, its sender told (node/intake/messages.py :func:`reject`)."""

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


# -- the checks ----------------------------------------------------------------------------------


async def admit(
    node: NodeState,
    ctx: int,
    message: Message,
    *,
    incoming: bool,
    stored: Mapping[str, str],
) -> ResultBody | None:
    """Raise Rejected with the reason ``message`` may not be accepted in context ``ctx``;
    for a result message return its decoded body. ``incoming``: taken from ``msg_in`` (the
    consumer), else from ``msg_out`` (the supervisor). ``stored``: the hash ``message`` was
    parsed from, as popped (:func:`check_size` measures it). Cheap checks come first, so an
    oversize or misshapen message costs no signature check and no round trip."""
    check_size(node.config, message, stored)
    check_shape(ctx, message)
    check_reply_to(message)
    if incoming and message.destination != node.identity.node_id:
        raise Rejected(Reason.WRONG_DESTINATION, f"addressed to {message.destination[:16]}…")
    body = await _check_signer(node, ctx, message, incoming=incoming)
    if not incoming and message.origin != node.identity.node_id:
        raise Rejected(Reason.WRONG_ORIGIN, "messages in msg_out must name this node as origin")
    if incoming and message.origin != node.identity.node_id:
        check_ack_deadline(message, now())
    if incoming and message.message_type is MessageType.STOP:
        await check_replay(node, ctx, message)
    return body


# -- size and shape (pure) ----------------------------------------------------------------------


def stored_size(fields: Mapping[str, str]) -> int:
    """Bytes of a message hash's names and values (UTF-8; what cannot be encoded counts one)."""
    # one encode of all the values: the UTF-8 encoder pairs no surrogates across two values
    # (nor within one), so it counts what each value's own encode counts, in C
    return sum(map(len, fields)) + _utf8_size("".join(fields.values()))


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (what cannot be encoded counts one); no encode for ASCII
    text (most messages), whose bytes are its characters."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def size_limit(config: NodeConfig, message_type: str) -> int:
    """The most bytes a message of ``message_type`` may hold. An actor's message is held to
    ``max_message_bytes``; a node-signed one (a result, a flow job carrying its prerequisites'
    results) is built by a node from outputs bounded by ``max_output_bytes`` and only has to
    fit a link frame."""
    if message_type in NODE_SIGNED:
        return config.max_frame_bytes
    return config.max_message_bytes


def check_size(config: NodeConfig, message: Message, stored: Mapping[str, str]) -> None:
    """Rejected('oversize') for a script above ``max_script_bytes`` or a message whose stored
    hash, ``stored`` as popped (fields the message does not use count too), is above its
    :func:`size_limit`."""
    for job in message.job:
        size = _utf8_size(job.script)
        if size > config.max_script_bytes:
            raise Rejected(
                Reason.OVERSIZE, f"script of {job.key}: {size} bytes > {config.max_script_bytes}"
            )
    size, limit = stored_size(stored), size_limit(config, message.message_type)
    if size > limit:
        raise Rejected(Reason.OVERSIZE, f"message of {size} bytes > {limit}")


def check_shape(ctx: int, message: Message) -> None:
    """Rejected('malformed') unless every job carried is the message's caller's, in its
    context, once; a stop names a job."""
    seen: set[int] = set()
    for job in message.job:
        if job.caller_id != message.caller_id or job.context_id != ctx:
            raise Rejected(
                Reason.MALFORMED,
                f"job {job.key} (context {job.context_id}) is not of the message's caller "
                f"{message.caller_id} and context {ctx}",
            )
        if job.id in seen:
            raise Rejected(Reason.MALFORMED, f"job {job.key} appears twice in the message")
        seen.add(job.id)
    if message.message_type is MessageType.STOP:
        parse_stop(message)


def check_reply_to(message: Message) -> None:
    """Rejected('bad_reply_to') unless the message's ``reply_to`` is empty or an inbox name
    (bus/core/keys.py): a client may only name its inbox, never a key of its choice."""
    problem = keys.inbox_name_problem(message.reply_to) if message.reply_to else ""
    if problem:
        raise Rejected(Reason.BAD_REPLY_TO, f"reply_to {message.reply_to[:80]!r}: {problem}")


# -- queue bounds (pure; enforced by the materialise script) ------------------------------------


class QueueBounds(NamedTuple):
    """The most jobs queued and not started yet in one context: per actor, and in all (0:
    no bound)."""

    actor: int
    context: int


# the materialise script's codes for a message refused by a bound (queues.materialise_batch)
OVER_ACTOR_BOUND, OVER_CONTEXT_BOUND = 4, 5


def queue_bounds(config: NodeConfig, ctx: int) -> QueueBounds:
    """Context ``ctx``'s queue bounds: its entry in ``[queue_limits]``, else the node's."""
    own = config.queue_limits.get(str(ctx), {})
    return QueueBounds(
        own.get("actor", config.max_queued_per_actor),
        own.get("context", config.max_queued_per_context),
    )


# -- whether a job can run here (pure) ----------------------------------------------------------


def unrunnable(
    script_type: str,
    script_types: Collection[str],
    local_slots: Mapping[str, int],
    isolation: Isolation | None,
) -> Rejected | None:
    """Why a job of ``script_type`` admitted here would never run (None if it can): no runner
    for its type (``unknown_script_type``), or a type this node's own runners serve
    (``local_slots`` > 0) while it can build no sandbox, so none runs (``isolation_refused``:
    without it the job would wait in its queue, its caller in silence). A type served by
    external runners only (0 slots) does not depend on the node's sandbox."""
    if script_type not in script_types:
        known = ", ".join(sorted(script_types))
        return Rejected(
            Reason.UNKNOWN_SCRIPT_TYPE,
            f"no runner for {script_type!r} on this node (known: {known})",
        )
    if isolation is not None and not isolation.runs_jobs and local_slots.get(script_type, 0):
        fix = f"; to run jobs there: {isolation.fix}" if isolation.fix else ""
        return Rejected(
            Reason.ISOLATION_REFUSED, f"this node runs no {script_type!r} job: {isolation.why}{fix}"
        )
    return None


# -- the ack deadline (pure; its rule: bus/core/deadlines.py) --------------------------------------


def check_ack_deadline(message: Message, stamp: int) -> None:
    """Rejected('expired') for a job message past its ack deadline at ``stamp``: its origin
    may have told its client it failed. Other messages carry no deadline of their origin."""
    if message.message_type is not MessageType.JOB:
        return
    late = stamp - ack_deadline(message)
    if late > 0:
        raise Rejected(
            Reason.EXPIRED, f"received {late} s after its ack deadline (created_at + timeout_ack)"
        )


def delivery_problem(fields: Mapping[str, str], config: NodeConfig, stamp: int) -> Rejected | None:
    """What a link refuses at once in a message's raw fields (None if nothing): its size, or a
    job message past its ack deadline. The fields are not verified yet (the consumer judges
    the signed ones again); they come from an authenticated peer, which can only make its
    own message refused."""
    size, limit = stored_size(fields), size_limit(config, fields.get("message_type", ""))
    if size > limit:
        return Rejected(Reason.OVERSIZE, f"message of {size} bytes > {limit}")
    if fields.get("message_type") != MessageType.JOB.value:
        return None
    try:
        deadline = int(fields.get("created_at", "")) + int(fields.get("timeout_ack") or "30")
    except ValueError:
        return None  # malformed: the consumer says so, with the other checks
    if stamp > deadline:
        return Rejected(Reason.EXPIRED, f"received {stamp - deadline} s after its ack deadline")
    return None


# -- who signed it, and may they ---------------------------------------------------------------


async def _check_signer(
    node: NodeState, ctx: int, message: Message, *, incoming: bool
) -> ResultBody | None:
    kind = message.message_type
    if kind is MessageType.RESULT and incoming:
        return verify_result(node, message)
    if kind is MessageType.FLOW_JOB and incoming:  # flows hook: see node/flows/trust.py
        await authorise_flow_job(node, ctx, message)
    elif kind in NODE_SIGNED:
        _check_own(node, message)
    else:
        await authorise_caller(node, ctx, message)
    return None


def _check_own(node: NodeState, message: Message) -> None:
    """A result or flow-job message in msg_out: created and signed by this node.

    A result message this process signed itself moments ago (same key, same signature entry:
    :func:`node.intake.messages.signed_here`) is not verified again here, only checked for
    origin and freshness. Verifying it here is not what lets no one in: every result is
    verified against this node's registered key by whoever acts on it, before it changes
    anything: the peer's consumer (:func:`verify_result`), or ours for a request of this node
    (the supervisor routes it through our msg_in). A hash altered in Redis after signing fails
    there, is dead-lettered and changes nothing. Every other result in msg_out (written by some
    other Redis client, or left from before a restart) is verified in full, so a forgery is
    refused here, at the origin."""
    if message.origin != node.identity.node_id:
        raise Rejected(Reason.FORGED_RESULT, "result messages in msg_out must come from this node")
    if message.message_type is MessageType.RESULT and signed_here(node, message):
        stale = freshness_problem(message, now(), node.identity.freshness)
        if stale is not None:
            raise Rejected.by_verdict(stale)
        return
    verdict = judge(message, node.identity.node_id, now=now(), freshness=node.identity.freshness)
    if not verdict.ok:
        raise Rejected.by_verdict(verdict)
    node.counters.count(VERIFIED)


def verify_result(node: NodeState, message: Message) -> ResultBody:
    """A result message signed by the node it names as origin (a node we know), fresh, with
    a well-formed body (returned); Rejected otherwise. Pure: what Redis knows is checked
    with its batch."""
    signer = message.origin if node.peers.is_known_node(message.origin) else None
    verdict = judge(message, signer, now=now(), freshness=node.identity.freshness)
    if not verdict.ok:
        raise Rejected.by_verdict(verdict)
    node.counters.count(VERIFIED)
    try:
        return ResultBody.decode(message.message)
    except ModelError as exc:
        raise Rejected(Reason.MALFORMED, str(exc)) from None


async def authorise_caller(node: NodeState, ctx: int, message: Message) -> None:
    """Raise Rejected (unknown_signer, bad_signature, expired, from_future, unknown_context,
    permission_denied; wrong_algorithm, malformed_key, uncompressed_key, invalid_point,
    high_s) unless ``message``'s caller signed it with its registered key, of an algorithm
    ``ctx`` accepts, and may execute in ``ctx``."""
    try:
        await _check(node, ctx, message, fresh=False)
    except Rejected:
        node.registry.forget()
        await _check(node, ctx, message, fresh=True)


async def _check(node: NodeState, ctx: int, message: Message, *, fresh: bool) -> None:
    caller = message.caller_id
    version = "" if fresh else await node.registry.version()
    actor = await (node.store.get_actor(caller) if fresh else node.registry.actor(caller, version))
    verdict = judge(
        message,
        actor.pubkey if actor else None,
        now=now(),
        freshness=node.identity.freshness,
        algorithm=actor.algorithm if actor else "",
        accepted=node.identity.algorithms.accepted(ctx),
    )
    if not verdict.ok:
        raise Rejected.by_verdict(verdict, f"actor {caller}")
    node.counters.count(VERIFIED)
    context = await (node.store.get_context(ctx) if fresh else node.registry.context(ctx, version))
    denied = permission_problem(context, ctx, caller)
    if denied is not None:
        raise Rejected.by_verdict(denied)


async def check_replay(node: NodeState, ctx: int, message: Message) -> None:
    """Rejected('replay') for a message key or nonce accepted within the freshness window."""
    nonce_key = keys.nonce(message.caller_id, message.nonce or "-")
    seen_key, seen_nonce = await records.replay_markers(node.store, ctx, message.key, nonce_key)
    if seen_key or seen_nonce:
        what = "message key" if seen_key else "nonce"
        raise Rejected(Reason.REPLAY, f"{what} of {message.key} was already accepted")


# -- materialising: the write that completes admission, in one atomic step ----------------------

REPLAY_WHAT = {1: "message key", 2: "nonce"}


def quota_refusal(message: Message, code: int, detail: str) -> Rejected:
    """The refusal of ``message`` for the materialise script's bound verdict ``code`` (4: its
    actor's bound, 5: the context's) and its ``detail`` ("<depth> <bound>")."""
    depth, _, bound = detail.partition(" ")
    jobs = len(message.job)
    if code == OVER_ACTOR_BOUND:
        who = f"actor {message.caller_id} holds {depth} queued jobs in context {message.context_id}"
    else:
        who = f"context {message.context_id} holds {depth} queued jobs"
    return Rejected(Reason.QUOTA_EXCEEDED, f"{who}; {jobs} more would pass its bound of {bound}")


def refusal(message: Message, code: int, owner: str) -> Rejected:
    """Why the materialise script refused ``message`` (``code`` > 0)."""
    if code in (OVER_ACTOR_BOUND, OVER_CONTEXT_BOUND):
        return quota_refusal(message, code, owner)
    if code in REPLAY_WHAT:
        return Rejected(Reason.REPLAY, f"{REPLAY_WHAT[code]} of {message.key} was already accepted")
    job_key, _, holder = owner.partition(" ")
    return Rejected(Reason.JOB_EXISTS, f"{job_key} exists already, held by {holder}")


async def materialise_fresh(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    script_types: Collection[str],
    inflight: str,
    service: str,
) -> None:
    """Materialise a batch of authorised job messages in one atomic step (materialise_batch);
    a replay (its key or nonce accepted before, or earlier in this batch) or a message naming
    a job key of another message is refused and dead-lettered."""
    refused, ended = await materialise_many(node, ctx, messages, script_types, inflight)
    _log_queued(ctx, messages, refused, ended)
    for message, exc in refused:
        queue = keys.MSG_IN if service == "consumer" else keys.MSG_OUT
        await reject(node, ctx, message.key, exc, message, service, queue=queue)
        await node.store.ack(ctx, inflight, message.key)


def _log_queued(
    ctx: int,
    messages: list[Message],
    refused: list[tuple[Message, Rejected]],
    unrunnable: set[str],
) -> None:
    """One line per job queued here (what an operator follows, or greps by job key)."""
    if not log.isEnabledFor(logging.INFO):  # its arguments cost a node ~2 us per job
        return
    refused_keys = {m.key for m, _ in refused}
    for message in messages:
        if message.key in refused_keys:
            continue
        for job in message.job:
            if job.key in unrunnable:
                continue  # logged with its refusal by answer_unrunnable
            log.info(
                "job %s (%s) queued on %s, from %s… (context %d)",
                job.key,
                job.script_type,
                target_queue(job),
                message.origin[:16],
                ctx,
                extra={
                    "job": job.key,
                    "ctx": ctx,
                    "message_key": message.key,
                    "type": job.script_type,
                    "origin": message.origin,
                },
            )


Unrunnable = list[tuple[Message, RunnerJob, Rejected]]


def _writes(
    messages: list[Message],
    judge: Callable[[str], Rejected | None],
    stamp: int,
    ctx: int,
    key: bytes,
) -> tuple[list[tuple[Message, list[JobWrite]]], Unrunnable]:
    """Each message's job hashes (stamped with ``key``, in context ``ctx``) and queue entries,
    and its jobs that would never run here, with why (``judge``: admission.unrunnable)."""
    unrunnable: Unrunnable = []
    batch: list[tuple[Message, list[JobWrite]]] = []
    dispatched, when = JobStatus.DISPATCHED.value, str(stamp)
    for message in messages:
        writes = []
        for job in message.job:
            fields = job.to_hash()  # a dict of its own: completed in place, not copied
            fields["status"] = dispatched
            fields["created_at"] = fields["updated_at"] = when
            fields["message_key"] = message.key
            fields["origin"] = message.origin
            if message.reply_to:  # where the runner answers a request made here
                fields["reply_to"] = message.reply_to
            if message.traceparent:  # the runner's attempt continues it without a message read
                fields["traceparent"] = message.traceparent
                if message.tracestate:
                    fields["tracestate"] = message.tracestate
            queue = ""
            why = judge(job.script_type)
            if why is None:
                queue = target_queue(job)  # bus/core/queues.py
            else:
                fields |= {"status": JobStatus.ERROR.value, "reason": why.reason}
                unrunnable.append((message, job, why))
            fields[admitted.FIELD] = admitted.stamp(key, ctx, job.key, fields)
            writes.append(JobWrite(job.key, queue, fields))
        batch.append((message, writes))
    return batch, unrunnable


async def materialise_many(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    script_types: Collection[str],
    inflight: str,
) -> tuple[list[tuple[Message, Rejected]], set[str]]:
    """Write the jobs of checked messages, their queue entries, the message status, the replay
    markers and the ack, in one Lua call; returns the refused messages (replays, and those
    naming another message's job) with why, for which nothing was written, and the keys of
    the jobs written in error because they would never run here (answered at once)."""
    stamp = now()
    config = node.config

    def judge(script_type: str) -> Rejected | None:
        return unrunnable(script_type, script_types, config.runners, node.runners.isolation)

    batch, ended = _writes(messages, judge, stamp, ctx, node.identity.admission_key)
    types = sorted({job.script_type for m in messages for job in m.job} & set(script_types))
    counted: list[str] = []
    codes, node.backpressure.queue_depth[ctx], owners = await materialise_batch(
        node.store,
        ctx,
        inflight,
        batch,
        now=stamp,
        window_s=node.identity.freshness.window_s,
        depth_of=[keys.queue(t) for t in types],
        bounds=queue_bounds(node.config, ctx),
        fair_share_jobs=node.config.fair_share_jobs,
        counted=counted,
    )
    node.job_stats.add(ctx, counted)
    refused = [(m, refusal(m, c, o)) for m, c, o in zip(messages, codes, owners, strict=True) if c]
    for (_, writes), code in zip(batch, codes, strict=True):
        for w in writes:  # idle slots wait on the plain type queue only
            if not code and w.queue and w.queue != keys.queue(w.fields["script_type"]):
                node.wakeups.wake_idle_slots(ctx, w.fields["script_type"])
    node.counters.count(
        "materialised", sum(len(m.job) for m, c in zip(messages, codes, strict=True) if not c)
    )
    if not ended:  # nearly always: no set and no coroutine for nothing to answer
        return refused, set()
    refused_keys = {m.key for m, _ in refused}
    await answer_unrunnable(node, ended, refused_keys)
    return refused, {job.key for m, job, _ in ended if m.key not in refused_keys}
