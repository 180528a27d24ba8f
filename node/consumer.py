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

from bus import keys
from bus.envelope import ResultBody, verify_message
from bus.errors import ModelError, StoreError
from bus.ids import now
from bus.models import JobStatus, Message, MessageStatus, MessageType
from node.messages import Rejected, apply_result, load_message, queue_result, reject
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "consumer"
POP_TIMEOUT_S = 5.0


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
        key = await node.store.pop_reliable(ctx, keys.MSG_IN, inflight, POP_TIMEOUT_S)
        if key is None:
            continue
        await _handle_guarded(node, ctx, key, script_types)
        await node.store.ack(ctx, inflight, key)


async def _handle_guarded(
    node: NodeState, ctx: int, key: str, script_types: Collection[str]
) -> None:
    message: Message | None = None
    try:
        message = await load_message(node, ctx, key)
        await handle_incoming(node, ctx, message, script_types)
    except Rejected as exc:
        await reject(node, ctx, key, exc, message, SERVICE)
    except StoreError:
        raise
    except Exception as exc:  # a bug must not stop the queue: record it and go on
        log.exception("consumer failed on %s (context %d)", key, ctx)
        await reject(node, ctx, key, Rejected("internal_error", repr(exc)), message, SERVICE)


async def handle_incoming(
    node: NodeState, ctx: int, message: Message, script_types: Collection[str]
) -> None:
    if message.destination != node.node_id:
        raise Rejected("wrong_destination", f"addressed to {message.destination[:16]}…")
    if await node.store.exists(ctx, keys.seen(message.key)):
        log.info("%s was already processed; dropping the duplicate", message.key)
        node.count("duplicates")
        return
    if message.message_type is MessageType.RESULT:
        await _accept_result(node, ctx, message)
    elif message.message_type is MessageType.JOB:
        await _authorise(node, ctx, message)
        await materialise(node, ctx, message, script_types)
    else:  # chat and mail are stored; nothing runs
        await node.store.hset(ctx, message.key, {"status": MessageStatus.PROCESSED.value})


async def _authorise(node: NodeState, ctx: int, message: Message) -> None:
    actor = await node.store.get_actor(message.caller_id)
    if actor is None:
        raise Rejected("unknown_actor", f"actor {message.caller_id} is not registered here")
    verdict = verify_message(message, actor.pubkey)
    if not verdict.ok:
        raise Rejected("bad_signature", f"{verdict.reason} {verdict.detail}".strip())
    context = await node.store.get_context(ctx)
    if context is None:
        raise Rejected("unknown_context", f"context {ctx} does not exist on this node")
    if not context.may_execute(message.caller_id):
        raise Rejected(
            "permission_denied", f"actor {message.caller_id} is not admin/executor of context {ctx}"
        )
    if any(job.caller_id != message.caller_id or job.context_id != ctx for job in message.job):
        raise Rejected("malformed", "a job names another caller or context than its message")


async def materialise(
    node: NodeState, ctx: int, message: Message, script_types: Collection[str]
) -> None:
    """Create each job hash and queue it, atomically with the message's 'seen' marker."""
    stamp = now()
    unknown = [j for j in message.job if j.script_type not in script_types]
    async with node.store.transaction(ctx) as tx:
        for job in message.job:
            fields = job.to_hash() | {
                "status": JobStatus.DISPATCHED.value,
                "created_at": str(stamp),
                "updated_at": str(stamp),
                "message_key": message.key,
            }
            if job in unknown:
                fields |= {"status": JobStatus.ERROR.value, "reason": "unknown_script_type"}
            tx.hset(job.key, fields)
            if job not in unknown:
                tx.lpush(keys.queue(job.script_type), [job.key])
        tx.hset(message.key, {"status": MessageStatus.ACKNOWLEDGED.value, "updated_at": str(stamp)})
        tx.set(keys.seen(message.key), "1")
    node.count("materialised", len(message.job))
    for job in unknown:
        detail = (
            f"unknown_script_type: no runner for {job.script_type!r} on this node "
            f"(known: {', '.join(sorted(script_types))})"
        )
        log.warning("job %s: %s", job.key, detail)
        await queue_result(
            node, message, ResultBody(message.key, job.key, JobStatus.ERROR, {}, detail)
        )


async def _accept_result(node: NodeState, ctx: int, message: Message) -> None:
    if not node.is_known_node(message.origin):
        raise Rejected("unknown_node", f"result from unknown node {message.origin[:16]}…")
    verdict = verify_message(message, message.origin)
    if not verdict.ok:
        raise Rejected("bad_signature", f"{verdict.reason} {verdict.detail}".strip())
    try:
        body = ResultBody.decode(message.message)
    except ModelError as exc:
        raise Rejected("malformed", str(exc)) from None
    destination = await node.store.call(ctx, lambda r: r.hget(body.in_reply_to, "destination"))
    if destination is None:
        raise Rejected("unknown_request", f"no request {body.in_reply_to} in context {ctx}")
    if message.origin not in (destination, node.node_id):
        raise Rejected("wrong_signer", f"{body.in_reply_to} was not sent to the node that answered")
    await apply_result(node, ctx, body)
    await node.store.hset(ctx, message.key, {"status": MessageStatus.PROCESSED.value})
    await node.store.call(ctx, lambda r: r.set(keys.seen(message.key), "1"))
