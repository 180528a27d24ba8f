"""Materialising job messages: replay check, job hashes, queue entries, message status, replay
markers and the in-flight ack of a whole batch, in one Lua call (atomic, one round trip:
bus/store/atomic/lua/routing_materialise.lua). The batch travels as one JSON argument and the
server does the rest, so the check and the writes are one step and the client builds one
command per batch, not six per message.

Every job hash written here carries the node's admission stamp (bus/core/admitted.py): this is
the only place a job is written after :func:`node.intake.admission.admit` accepted its message
(the supervisor's local delivery, the consumer of ``msg_in``, and so the flow engine's releases,
which are messages on ``msg_out`` too), and a runner process runs nothing without the stamp.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from bus.core import admitted, keys
from bus.core.envelope import ResultBody
from bus.core.ids import now as now_s
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.queues import target_queue
from bus.core.reasons import Reason
from bus.store.atomic.routing import JobWrite, materialise_batch
from node.intake.admission import (
    OVER_ACTOR_BOUND,
    OVER_CONTEXT_BOUND,
    queue_bounds,
    quota_refusal,
    unrunnable,
)
from node.intake.messages import Rejected, queue_result, reject
from node.state import NodeState

REPLAY_WHAT = {1: "message key", 2: "nonce"}
log = logging.getLogger(__name__)


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
                continue  # logged with its refusal by _answer_unrunnable
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
    stamp = now_s()
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
    await _answer_unrunnable(node, ended, refused_keys)
    return refused, {job.key for m, job, _ in ended if m.key not in refused_keys}


async def _answer_unrunnable(node: NodeState, ended: Unrunnable, refused: set[str]) -> None:
    """Answer each materialised job that would never run here (it was written in error): its
    origin, and the client waiting there, learn why at once."""
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
