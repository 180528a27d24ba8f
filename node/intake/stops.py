"""Stopping a job: an actor-signed ``stop`` message reaches the node that runs the job.

Only the job's caller or an admin of its context may stop it. A running job's script is
killed (the runner ends it in ``error`` with reason ``stopped``); a queued one is taken off its
queue and ended here; a final one is left as it is. Either way the job's origin is answered
through the usual result path, so a waiting client learns the job was stopped. External
runners learn of a stop from ``stop:<script_type>``.
"""

from __future__ import annotations

import json
import logging

from bus.core.envelope import ResultBody
from bus.core.ids import now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from bus.errors import ModelError
from bus.store import records
from bus.store.atomic.routing import stop_job
from node.intake.messages import Rejected, queue_result
from node.state import NodeState

log = logging.getLogger(__name__)


def parse_stop(message: Message) -> str:
    """The job key a stop message names; Rejected('malformed') if there is none."""
    try:
        job_key = json.loads(message.message)["job_key"]
    except (ValueError, KeyError, TypeError):
        raise Rejected(Reason.MALFORMED, "a stop message names no job_key") from None
    if not isinstance(job_key, str) or not job_key.startswith("job:"):
        raise Rejected(Reason.MALFORMED, "a stop message names no job_key")
    return str(job_key)


async def apply_stop(node: NodeState, ctx: int, message: Message) -> None:
    """Stop the job ``message`` names (the caller is already authenticated and authorised to
    execute in ``ctx``). Raises Rejected: unknown_job, permission_denied."""
    job_key = parse_stop(message)
    fields = await records.read_job(node.store, ctx, job_key)
    if not fields:
        raise Rejected(Reason.UNKNOWN_JOB, f"no job {job_key} in context {ctx}")
    try:
        job = RunnerJob.from_hash(fields)
    except ModelError as exc:
        raise Rejected(Reason.MALFORMED, str(exc)) from None
    context = await node.store.get_context(ctx)
    if message.caller_id != job.caller_id and not (context and message.caller_id in context.admins):
        raise Rejected(
            Reason.PERMISSION_DENIED, "only the job's caller or a context admin may stop it"
        )
    reason = f"{Reason.STOPPED}: by actor {message.caller_id}"
    before = await stop_job(node.store, ctx, job_key, job.script_type, reason=reason, now=now())
    log.info("stop %s (was %s) by actor %d", job_key, before, message.caller_id)
    if before == "started":
        node.runners.stop_running(job_key, reason)
    elif before in ("dispatched", "waiting_for_prerequisites"):
        request = Message.from_hash(await records.read_message(node.store, ctx, job.message_key))
        body = ResultBody(request.key, job_key, JobStatus.ERROR, {}, reason)
        await queue_result(node, request, body)
