"""What the node itself does for its runner slots: recover a slot whose process died or whose
node died (adopting outcomes), conclude such attempts, and move due retries back to their queue.
The runner processes (node/worker/loop.py) pop, run and conclude every other attempt.

Each attempt is numbered (``attempt``, its fencing token: bus/store/atomic/runs.py) and holds a
lease (its score in the ``running`` zset: when it lapses, renewed by a heartbeat while the
script runs, re-taken if a stall let it lapse); status moves
``dispatched -> started -> finished | error``. A failed attempt is retried after a backoff
while the job has retries left (``delayed`` zset, moved back to the queue when due). When a
job ends, its final state, the signed result for the origin and the removal from the slot's
in-flight list are written in one Lua transaction that checks first that the attempt is still
the job's current one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import trio

from bus.core import queues
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
from bus.core.ids import ms_after, now, now_ms
from bus.core.models import Message, RunnerJob
from bus.errors import StoreError
from bus.store.atomic import runs, runs_trio
from node.intake.messages import result_message
from node.observe.ended_spans import attempt_ended
from node.runners import adoption
from node.slot.away import Away
from node.state import NodeState

log = logging.getLogger(__name__)


async def recover_slot(
    node: NodeState, ctx: int, inflight: str, queue: str, logs: tuple[Path, Path]
) -> list[Callable[[], Awaitable[None]]]:
    """Jobs a previous run of this slot left behind: concluded with the outcome their process
    recorded, adopted when their process ends, or ``runner_lost`` (see
    node/runners/adoption.py); the tasks that wait for processes still running are returned.
    A job not started yet goes back to the queue."""
    return await adoption.recover_slot(node, ctx, inflight, queue, logs, _conclude_adopted)


async def _conclude_adopted(
    node: NodeState, ctx: int, left: adoption.LeftBehind, outcome: Outcome, inflight: str
) -> None:
    runner, queue = left.fields.get("runner", ""), queues.queue_of(left.fields)
    job, request, attempt = left.job, left.request, left.attempt
    started_at = int(left.fields.get("started_at") or 0)
    await conclude(node, ctx, job, request, outcome, runner, inflight, queue, attempt, started_at)


async def conclude(
    node: NodeState,
    ctx: int,
    job: RunnerJob,
    request: Message,
    outcome: Outcome,
    token: str,
    inflight: str,
    queue: str,
    attempt: int,
    started_at: int,
) -> None:
    """Execute the plan that ends the attempt (bus/core/attempts.py: plan_ending): the
    retry, or the answer; tried again while Redis is unreachable (node/slot/away.py), because
    the outcome exists only here (re-running the job instead would run it twice). ``queue``:
    where the job was queued, where its retry goes."""
    ran = Attempt(attempt, token, started_at, now())
    here = node.identity.node_id
    plan = plan_ending(job, outcome, ran, RetryPolicy.of(job), request=request, here=here)
    away = Away(job.key)
    tried = False  # a try whose write may stand (applied, then not confirmed durable)
    while True:
        since = node.store.epoch
        try:
            ok = await _execute(node, ctx, job.key, plan, attempt, inflight, queue)
            if ok:
                # on a replicated store, not before a replica has it: an end a failover lost
                # would leave the job started by a slot that has moved on, which nothing
                # would look at again until its lease lapsed
                await node.store.durable(since)
            break
        except StoreError as exc:
            tried = True
            await trio.sleep(away.failed(exc, log))
    if not ok and tried:  # the fence refused this try: most likely an earlier one stands
        log.info("%s: attempt %d already ended (by an earlier try)", job.key, attempt)
    elif not ok:
        node.counters.count("stale_results")
        log.warning("%s: result of superseded attempt %d refused", job.key, attempt)
    else:
        await attempt_ended(
            node.store, here, ctx, job, attempt, started_at, ended_as(plan), outcome.reason
        )


async def _execute(
    node: NodeState, ctx: int, job_key: str, plan: Plan, attempt: int, inflight: str, queue: str
) -> bool:
    """One try of the plan's writes; False if the attempt is not the job's current one."""
    if isinstance(plan, Retry):
        ok = await runs_trio.retry_later(
            node.store,
            ctx,
            job_key,
            attempt,
            inflight,
            queue=queue,
            cause=plan.cause,
            entry=plan.entry,
            due_ms=ms_after(plan.delay_s),
        )
        node.wakeups.wake_retries(ctx)
        return ok
    ending = runs.ending_of(plan, job_key, attempt, inflight)
    if isinstance(plan, AnswerHere):  # answered here: no signed result message needed
        return await runs_trio.finish_local(
            node.store,
            ctx,
            ending,
            request_key=plan.body.in_reply_to,
            reply_ttl_s=node.config.reply_ttl_s,
            reply_to=plan.reply_to,
        )
    answer = result_message(node, plan.request, plan.body)
    return await runs_trio.finish(node.store, ctx, ending, answer=answer)


async def run_retry_scheduler(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Move failed attempts back to their queue when their backoff is over. Sleeps until the
    next retry is due, or until a runner schedules an earlier one (no polling)."""
    task_status.started()
    while True:
        wake = node.wakeups.retry_scheduled.setdefault(ctx, trio.Event())
        next_due = await runs_trio.move_due(node.store, ctx, now_ms())
        wait_s = 3600.0 if next_due < 0 else max(0.0, (next_due - now_ms()) / 1000)
        with trio.move_on_after(wait_s):
            await wake.wait()
        node.wakeups.retry_scheduled[ctx] = trio.Event()
