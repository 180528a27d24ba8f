"""What the node itself does for its runner slots: recover a slot whose process died or whose
node died (adopting outcomes), conclude such attempts, and move due retries back to their queue.
The runner processes (node/worker/loop.py) pop, run and conclude every other attempt.

Each attempt is numbered (``attempt``, its fencing token: bus/store/atomic/runs.py) and holds a
lease (``lease:<job>``, TTL renewed by a heartbeat while the script runs, re-taken if a stall
let it lapse); status moves ``dispatched -> started -> finished | error``. A failed attempt is
retried after a backoff while the job has retries left (``delayed`` zset, moved back to the
queue when due). When a job ends, its final state, the signed result for the origin and the
removal from the slot's in-flight list are written in one Lua transaction that checks first
that the attempt is still the job's current one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import trio

from bus.core import queues
from bus.core.envelope import ResultBody
from bus.core.ids import ms_after, now_ms
from bus.core.models import Message, RunnerJob
from bus.errors import StoreError
from bus.store.atomic import runs
from node.intake.messages import result_message
from node.runners import adoption
from node.slot.exits import Outcome
from node.slot.lifecycle import RetryPolicy, after_attempt
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
    await conclude(node, ctx, job, request, outcome, runner, inflight, queue, attempt, 0)


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
    """Finish the job or schedule its retry; retried while Redis is unreachable, because the
    outcome exists only here (re-running the job instead would run it twice)."""
    nxt = after_attempt(
        outcome.status, outcome.reason, attempt, job.retries, policy=RetryPolicy.of(job)
    )
    entry = runs.attempt_entry(attempt, token, outcome.status.value, outcome.reason, started_at)
    delay = 0.2
    while True:
        try:
            if nxt.retry:
                due_ms = ms_after(nxt.delay_s)
                ok = await runs.retry_later(
                    node.store,
                    ctx,
                    job.key,
                    attempt,
                    inflight,
                    queue=queue,
                    reason=f"retrying after: {outcome.reason}",
                    entry=entry,
                    due_ms=due_ms,
                )
                node.wakeups.wake_retries(ctx)
            else:
                ok = await _finish(node, ctx, job, request, outcome, inflight, entry, attempt)
            break
        except StoreError as exc:
            log.warning("%s: cannot record the outcome yet (%s); retrying", job.key, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 5.0)
    if not ok:
        node.counters.count("stale_results")
        log.warning("%s: result of superseded attempt %d refused", job.key, attempt)
    else:
        node.counters.count("job_retries" if nxt.retry else "jobs_" + outcome.status.value)


async def _finish(
    node: NodeState,
    ctx: int,
    job: RunnerJob,
    request: Message,
    outcome: Outcome,
    inflight: str,
    entry: str,
    attempt: int,
) -> bool:
    result = outcome.result | {"attempts": str(attempt)}
    ending = runs.Ending(
        job.key, attempt, inflight, outcome.status.value, result, outcome.reason, entry
    )
    if request.origin == node.identity.node_id:  # answered here: no signed result message needed
        return await runs.finish_local(
            node.store,
            ctx,
            ending,
            request_key=request.key,
            reply_ttl_s=node.config.reply_ttl_s,
            reply_to=request.reply_to,
        )
    body = ResultBody(request.key, job.key, outcome.status, result, outcome.reason)
    answer = result_message(node, request, body)
    return await runs.finish(node.store, ctx, ending, answer=answer)


async def run_retry_scheduler(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Move failed attempts back to their queue when their backoff is over. Sleeps until the
    next retry is due, or until a runner schedules an earlier one (no polling)."""
    task_status.started()
    while True:
        wake = node.wakeups.retry_scheduled.setdefault(ctx, trio.Event())
        next_due = await runs.move_due(node.store, ctx, now_ms())
        wait_s = 3600.0 if next_due < 0 else max(0.0, (next_due - now_ms()) / 1000)
        with trio.move_on_after(wait_s):
            await wake.wait()
        node.wakeups.retry_scheduled[ctx] = trio.Event()
