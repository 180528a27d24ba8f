"""Runner pools: per context and script type, N slots that pop ``queue:<type>`` and execute.

Status moves ``dispatched -> started -> finished | error``. When a job ends, its final state,
the signed result message for the origin and the removal from the slot's in-flight list are
written in one transaction.
"""

from __future__ import annotations

import json
import logging
from typing import NoReturn

import trio

from bus import keys
from bus.envelope import ResultBody
from bus.errors import ModelError
from bus.ids import now
from bus.models import JobStatus, Message, RunnerJob
from node.executor import Outcome, execute
from node.messages import result_message
from node.state import NodeState

log = logging.getLogger(__name__)

POP_TIMEOUT_S = 5.0


async def run_runner_pool(
    node: NodeState,
    ctx: int,
    script_type: str,
    command: list[str],
    slots: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``slots`` runners for ``script_type`` in context ``ctx`` until cancelled."""
    async with trio.open_nursery() as nursery:
        for slot in range(slots):
            await nursery.start(run_runner, node, ctx, script_type, command, slot)
        task_status.started()


async def run_runner(
    node: NodeState,
    ctx: int,
    script_type: str,
    command: list[str],
    slot: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    queue = keys.queue(script_type)
    inflight = keys.inflight(f"runner:{script_type}:{slot}")
    await node.store.recover(ctx, inflight, queue)
    task_status.started()
    while True:
        job_key = await node.store.pop_reliable(ctx, queue, inflight, POP_TIMEOUT_S)
        if job_key is None:
            continue
        await run_job(node, ctx, job_key, command, inflight)


async def run_job(
    node: NodeState, ctx: int, job_key: str, command: list[str], inflight: str
) -> None:
    fields = await node.store.hgetall(ctx, job_key)
    try:
        job = RunnerJob.from_hash(fields)
        request = Message.from_hash(await node.store.hgetall(ctx, job.message_key))
    except ModelError as exc:
        log.error("cannot run %s (context %d): %s", job_key, ctx, exc)
        await node.store.dead_letter(ctx, job_key, "malformed_job", str(exc))
        await node.store.ack(ctx, inflight, job_key)
        return
    await node.store.hset(
        ctx, job_key, {"status": JobStatus.STARTED.value, "updated_at": str(now())}
    )
    log.debug("running %s (%s)", job_key, job.script_type)
    outcome = await execute(job, command, max_output_bytes=node.config.max_output_bytes)
    await finish(node, ctx, job, request, outcome, inflight)


async def finish(
    node: NodeState, ctx: int, job: RunnerJob, request: Message, outcome: Outcome, inflight: str
) -> None:
    body = ResultBody(request.key, job.key, outcome.status, outcome.result, outcome.reason)
    answer = result_message(node, request, body)
    async with node.store.transaction(ctx) as tx:
        tx.hset(
            job.key,
            {
                "status": outcome.status.value,
                "result": json.dumps(outcome.result),
                "reason": outcome.reason,
                "updated_at": str(now()),
            },
        )
        tx.hset(answer.key, answer.to_hash())
        tx.lpush(keys.MSG_OUT, [answer.key])
        tx.lrem(inflight, 1, job.key)
    node.count("jobs_" + outcome.status.value)
