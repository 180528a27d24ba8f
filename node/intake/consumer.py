"""The consumer of one context: pops ``msg_in``, verifies, authorises, and materialises jobs.

Job messages must be signed by the registered key of ``actor:<caller_id>`` and the caller must be
an admin or executor of the context; each job becomes ``job:<caller_id>:<id>`` and its key is
queued on ``queue:<script_type>``. Result messages must be signed by the node that executed the
job; they update the origin's job copy and wake the waiting client. Materialising is idempotent
by message key.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import NoReturn

import trio

from bus.core import keys
from bus.core.envelope import ResultBody
from bus.core.models import Message, MessageStatus, MessageType
from bus.core.reasons import Reason
from bus.errors import ContentError, StoreError
from bus.store.atomic import routing
from node.intake.admission import admit
from node.intake.materialise import materialise_fresh
from node.intake.messages import (
    Rejected,
    parse_message,
    reject,
    reply_targets,
    result_write,
)
from node.intake.stops import apply_stop
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "consumer"
POP_TIMEOUT_S = 5.0
BATCH = 64
VerifiedResult = tuple[Message, ResultBody]  # a result message and its decoded body


async def run_consumer(
    node: NodeState,
    ctx: int,
    script_types: Collection[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Process context ``ctx``'s incoming messages until cancelled."""
    inflight = keys.inflight(SERVICE)
    await node.store.recover(ctx, inflight, keys.MSG_IN)
    task_status.started()
    while True:
        # What is queued already, with its hashes, in one round trip; else a blocking pop.
        batch = await node.store.pop_read(ctx, keys.MSG_IN, inflight, BATCH, POP_TIMEOUT_S)
        jobs: list[Message] = []
        results: list[VerifiedResult] = []
        for key, fields in batch:
            handled = await _handle_guarded(node, ctx, key, fields, inflight, jobs, results)
            if not handled:
                await node.store.ack(ctx, inflight, key)
        if results:
            await accept_results(node, ctx, results, inflight)
        if jobs:
            await materialise_fresh(node, ctx, jobs, script_types, inflight, SERVICE)


async def _handle_guarded(
    node: NodeState,
    ctx: int,
    key: str,
    fields: dict[str, str],
    inflight: str,
    jobs: list[Message],
    results: list[VerifiedResult],
) -> bool:
    """Handle one message of a batch (its job messages and verified result messages are
    collected, to be accepted together); True if it is acknowledged already or will be with
    its batch."""
    message: Message | None = None
    try:
        message = parse_message(ctx, key, fields)
        return await handle_incoming(node, ctx, message, inflight, jobs, results)
    except Rejected as exc:
        await reject(node, ctx, key, exc, message, SERVICE, queue=keys.MSG_IN)
    except StoreError:
        raise
    except ContentError as exc:  # a key the message names holds something unusable
        refused = Rejected(exc.reason, str(exc))
        await reject(node, ctx, key, refused, message, SERVICE, queue=keys.MSG_IN)
    except Exception as exc:  # a bug must not stop the queue: record it and go on
        log.exception("consumer failed on %s (context %d)", key, ctx)
        await reject(
            node,
            ctx,
            key,
            Rejected(Reason.INTERNAL_ERROR, repr(exc)),
            message,
            SERVICE,
            queue=keys.MSG_IN,
        )
    return False


async def handle_incoming(
    node: NodeState,
    ctx: int,
    message: Message,
    inflight: str,
    jobs: list[Message],
    results: list[VerifiedResult],
) -> bool:
    """Accept ``message``; True when it was acknowledged with what it caused, or will be with
    its batch: an admitted job (or flow job) message goes to ``jobs``, a result message to
    ``results`` (both accepted together, replay checks included). Raises Rejected with the
    reason it is refused (the one admission check: node/intake/admission.py)."""
    body = await admit(node, ctx, message, incoming=True)
    if body is not None:
        results.append((message, body))
    elif message.message_type in (MessageType.JOB, MessageType.FLOW_JOB):
        jobs.append(message)
    elif message.message_type is MessageType.STOP:
        await apply_stop(node, ctx, message)
        await routing.accept_stop(node.store, ctx, inflight, stop_accept(node, message))
    else:  # chat and mail are stored; nothing runs
        await node.store.hset(ctx, message.key, {"status": MessageStatus.PROCESSED.value})
        return False
    return True


def stop_accept(node: NodeState, message: Message) -> routing.StopAccept:
    """What accepting stop ``message`` writes: its replay markers, kept for the freshness
    window."""
    nonce_key = keys.nonce(message.caller_id, message.nonce) if message.nonce else ""
    return routing.StopAccept(message.key, node.freshness.window_s, nonce_key)


async def accept_results(
    node: NodeState, ctx: int, results: list[VerifiedResult], inflight: str
) -> None:
    """Apply a batch of verified result messages in one round trip (one more to read the
    requests' inboxes when the node does not remember them): per message, one atomic script
    checks what Redis knows and writes the job copy, the request, the reply that wakes the
    client, the replay markers and the ack.
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
    verdicts = await routing.accept_results(
        node.store, ctx, inflight, accepts, window_s=node.freshness.window_s, node_id=node.node_id
    )
    for (message, body), (reason, detail) in zip(results, verdicts, strict=True):
        if reason != "ok":
            exc = _refusal(ctx, message, body, Reason(str(reason)), str(detail))
            await reject(node, ctx, message.key, exc, message, SERVICE, queue=keys.MSG_IN)
            await node.store.ack(ctx, inflight, message.key)


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
