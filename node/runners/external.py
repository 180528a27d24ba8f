"""External runners (docs/use/runners.md): answering what they finish, reaping the dead.

An external runner (any language, raw Redis commands) pops ``queue:<type>``, leases the job,
runs it, writes the final ``status``/``result``/``reason`` and pushes the job key on ``results``.
It cannot sign, so per context the node runs:

* the **results service**: pops ``results`` reliably (in-flight list ``inflight:results``) and,
  for each final job not answered yet, applies the retry policy (an error with retries left goes
  back through the ``delayed`` zset), or answers: a local origin gets its reply list pushed as
  a local runner's conclusion does, a remote origin gets a result message signed by this node.
  The answer and the ``answered`` mark on the job are one Lua transaction, so a crash between
  pop and answer re-answers nothing twice.
* the **reaper**: when a job's lease lapses (its score in the ``running`` zset, the lease's
  expiry by Valkey's clock, falls behind that clock) while the job is ``started``, and the
  attempt's process is gone, the attempt ends in ``error`` (``runner_lost``) and goes to
  ``results`` (so it is retried or answered as above). It sleeps until the earliest live lease
  lapses (runs_lapsed says when), at most a third of the lease TTL, the beat the runners renew
  on: a lease taken while it sleeps is seen at most that long after it lapses.

An expired lease is a suspicion, not a proof: a stall of the node or of Valkey longer than the
TTL lets the lease of a live process lapse. For this node's own runners the reaper knows: an
attempt still run by the live runner process that started it (``Runners.processes``: each
process of a slot has its own token base) re-takes its lease; any other is ended. An external
runner's process cannot be seen from here, so its
lapsed lease ends the attempt; its late result is then refused by the attempt fence (see
bus/store/atomic/runs.py). Jobs started by an earlier run of this node are left to that slot's
recovery at start (node/runners/recovery.py: recover_slot), which adopts what finished meanwhile.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import trio

from bus.core import keys
from bus.core.attempts import (
    AnswerHere,
    Attempt,
    Outcome,
    Plan,
    Retry,
    RetryPolicy,
    ended_as,
    plan_ending,
)
from bus.core.ids import ms_after, now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.queues import queue_of
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError
from bus.store import records
from bus.store.atomic import runs_trio
from bus.store.serve import Done, Handler, Popped, Queue, serve_queue
from node.intake.messages import result_message
from node.observe.ended_spans import attempt_ended
from node.state import NodeState

log = logging.getLogger(__name__)


async def run_results(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Answer the jobs external runners finish in context ``ctx`` until cancelled.

    Raises StoreError if Redis fails (the caller restarts the service)."""
    queue = Queue(ctx, keys.RESULTS, keys.RESULTS_INFLIGHT)  # the job hashes read with the pop
    await serve_queue(node.store, queue, Results(node, ctx), task_status=task_status)


class Results(Handler[None]):
    """Each finished job is retried or answered (:func:`answer`); an entry it cannot use (its
    key holds no hash, a field it reads is no number) is refused (``malformed_job``)."""

    name = "results"
    flaw = Reason.MALFORMED_JOB  # what answer() trips over is the job hash's content

    def __init__(self, node: NodeState, ctx: int) -> None:
        self.node, self.ctx = node, ctx

    async def each(self, popped: Popped) -> Done:
        await answer(self.node, self.ctx, popped.value, popped.fields)
        return Done.ACKED  # answer() acknowledges in the same step as what it writes


async def answer(
    node: NodeState, ctx: int, job_key: str, fields: dict[str, str] | None = None
) -> bool:
    """Retry or answer one finished job (``fields``: its hash, if read with the pop); False if
    there was nothing to do (not final, already answered, malformed: dead-lettered). Raises
    StoreError if Redis fails."""
    if fields is None:
        fields = await records.read_job(node.store, ctx, job_key)
    if not fields:
        detail = "the entry names no job hash"
        await node.store.refuse_entry(
            ctx, keys.RESULTS_INFLIGHT, job_key, Reason.MISSING_HASH, detail, queue=keys.RESULTS
        )
        return False
    status = fields.get("status", "")
    if status not in (JobStatus.FINISHED.value, JobStatus.ERROR.value) or "answered" in fields:
        await node.store.ack(ctx, keys.RESULTS_INFLIGHT, job_key)
        return False
    try:
        job = RunnerJob.from_hash(fields)
        attempt = int(fields.get("attempt") or 1)
        caller, ident = keys.parse_message_key(job.message_key)
    except (ModelError, ValueError) as exc:
        log.error("cannot answer %s (context %d): %s", job_key, ctx, exc)
        await node.store.dead_letter(
            ctx, job_key, Reason.MALFORMED_JOB, str(exc), queue=keys.RESULTS
        )
        await node.store.ack(ctx, keys.RESULTS_INFLIGHT, job_key)
        return False
    origin, reply_to = fields.get("origin", ""), fields.get("reply_to", "")
    here = node.identity.node_id
    request = Message(ident, caller, ctx, origin=origin, destination=here, reply_to=reply_to)
    ran = Attempt(attempt, fields.get("runner", ""), int(fields.get("started_at") or 0), now())
    outcome = Outcome(job.status, job.result, job.reason)
    plan = plan_ending(job, outcome, ran, RetryPolicy.of(job), request=request, here=here)
    read = runs_trio.Answered(job_key, status, fields.get("attempt", ""), plan.entry)
    done = await _answer(node, ctx, plan, read, request, queue_of(fields))
    if done:  # its span: no runner process of this node recorded one (node/observe/ended_spans.py)
        ended = ended_as(plan)
        await attempt_ended(node.store, here, ctx, job, attempt, ran.started_at, ended, job.reason)
    return done


async def _answer(
    node: NodeState, ctx: int, plan: Plan, read: runs_trio.Answered, request: Message, queue: str
) -> bool:
    """The plan's writes, acknowledging the entry in the same step; False if done before."""
    if isinstance(plan, Retry):
        due_ms = ms_after(plan.delay_s)
        done = await runs_trio.answered_retry(
            node.store, ctx, read, cause=plan.cause, due_ms=due_ms, queue=queue
        )
        node.wakeups.wake_retries(ctx)
        return done
    if isinstance(plan, AnswerHere):
        return await runs_trio.answer_local(
            node.store,
            ctx,
            read,
            result=plan.body.result,
            request_key=request.key,
            reply=plan.reply,
            reply_ttl_s=node.config.reply_ttl_s,
            reply_to=plan.reply_to,
        )
    msg = result_message(node, request, plan.body)
    return await runs_trio.answer_remote(node.store, ctx, read, result=plan.body.result, answer=msg)


async def reap(node: NodeState, ctx: int, job_key: str) -> bool:
    """End the attempt on ``job_key`` whose lease expired if its process is gone (error
    ``runner_lost``, handed to the results service); an attempt this process still runs
    re-takes its lease instead. False if nothing was ended. Raises StoreError if Redis fails."""
    try:
        fields = await records.read_job(node.store, ctx, job_key)
    except ContentError as exc:  # no job: nothing to reap (the reaper goes on)
        log.warning("not reaping %s (context %d): %s", job_key, ctx, exc)
        return False
    token, attempt = fields.get("runner", ""), fields.get("attempt", "")
    if fields.get("status") != JobStatus.STARTED.value:
        return False
    runner = fields.get("runner_id") or token
    reason = f"{Reason.RUNNER_LOST}: the lease of runner {runner} expired"
    if _is_local(node, token):
        if not token.startswith(f"{node.identity.node_id[:12]}:{node.identity.boot}:"):
            return False  # an earlier run of this node: its slot's recovery adopts or ends it
        if attempt.isdigit() and _runs_it(node, ctx, job_key, token, fields.get("runner_id", "")):
            ttl_ms = node.config.lease_ttl_ms
            await runs_trio.renew(node.store, ctx, job_key, token, ttl_ms, int(attempt))
            return False
        reason = f"{Reason.RUNNER_LOST}: slot {runner} of this node no longer runs it"
    done = await runs_trio.reap(node.store, ctx, job_key, attempt, reason)
    if done:
        log.warning("%s (context %d): %s", job_key, ctx, reason)
        node.counters.count("runners_lost")
    return done


def _runs_it(node: NodeState, ctx: int, job_key: str, token: str, slot_id: str) -> bool:
    """Whether a live runner process of this node runs the attempt holding ``token``: its
    slot's process is alive and the token is the one that process takes for this job. A
    process restarted since is not the one (each has its own token base): its slot's
    recovery ended what its predecessor left, and if a failover lost that end, the lapsed
    lease ends it here."""
    process = node.runners.processes.get((ctx, slot_id))
    return process is not None and token == f"{process.token_base}:{job_key}"


def _is_local(node: NodeState, token: str) -> bool:
    """Whether a lease token is one of this node's runners' (this run's or an earlier one's)."""
    return token.startswith(f"{node.identity.node_id[:12]}:")


async def sweep(node: NodeState, ctx: int) -> int:
    """Reap every started job whose lease lapsed; how many. Raises StoreError."""
    return (await _sweep(node, ctx))[0]


async def _sweep(node: NodeState, ctx: int) -> tuple[int, float]:
    """:func:`sweep`, and the seconds until the earliest live lease lapses (-1: none; 0: more
    lapsed leases than one read returns were reaped, read again)."""
    lapsed, wait_s = await runs_trio.lapsed(node.store, ctx)
    reaped = sum([await reap(node, ctx, k) for k in lapsed])
    return reaped, 0.0 if reaped and len(lapsed) >= runs_trio.LAPSED_PER_CALL else wait_s


async def run_reaper(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Reap dead runners' jobs in context ``ctx`` until cancelled (see the module docstring).
    ``task_status`` reports once the reaper runs. Raises StoreError if Redis fails (the caller
    restarts the service)."""
    longest_s = node.config.lease_ttl_ms / 3000  # the renewals' beat (node/worker/job.py)
    task_status.started()
    while True:
        _, wait_s = await _sweep(node, ctx)
        await trio.sleep(wait_s if 0 <= wait_s < longest_s else longest_s)
