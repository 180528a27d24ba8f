"""The supervisor of one context: pops ``msg_out``, checks the sender, routes the message.

Routing: to this node's own ``msg_in`` when the destination is this node, else to the durable
outbox of the destination peer. A message that fails a check goes to ``dlq`` with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import NoReturn

import trio

from bus import keys, outbox
from bus.errors import StoreError
from bus.ids import now
from bus.models import Message, MessageType
from bus.verify import judge
from node.authz import authorise_caller
from node.consumer import check_replay, materialise
from node.messages import Rejected, load_message, reject
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "supervisor"
POP_TIMEOUT_S = 5.0


async def run_supervisor(
    node: NodeState,
    ctx: int,
    script_types: Collection[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Route context ``ctx``'s outgoing messages until cancelled; reports started after recovery."""
    inflight = keys.inflight(SERVICE)
    await node.store.recover(ctx, inflight, keys.MSG_OUT)
    task_status.started()
    while True:
        key = await node.store.pop_reliable(ctx, keys.MSG_OUT, inflight, POP_TIMEOUT_S)
        if key is None:
            continue
        if not await _handle_guarded(node, ctx, key, script_types, inflight):
            await node.store.ack(ctx, inflight, key)


async def _handle_guarded(
    node: NodeState, ctx: int, key: str, script_types: Collection[str], inflight: str
) -> bool:
    """Handle one message; True if it was already acknowledged (the local fast path)."""
    message: Message | None = None
    try:
        message = await load_message(node, ctx, key)
        await check_outgoing(node, ctx, message)
        if message.destination == node.node_id and message.message_type is MessageType.JOB:
            # Runs here: the caller was just verified, so materialise now instead of a second
            # hop through msg_in and a second verification by the consumer.
            await check_replay(node, ctx, message)
            await materialise(node, ctx, message, script_types, inflight)
            node.count("routed")
            return True
        await route(node, ctx, message)
    except Rejected as exc:
        await reject(node, ctx, key, exc, message, SERVICE, queue=keys.MSG_OUT)
    except StoreError:
        raise
    except Exception as exc:  # a bug must not stop the queue: record it and go on
        log.exception("supervisor failed on %s (context %d)", key, ctx)
        await reject(
            node,
            ctx,
            key,
            Rejected("internal_error", repr(exc)),
            message,
            SERVICE,
            queue=keys.MSG_OUT,
        )
    return False


async def check_outgoing(node: NodeState, ctx: int, message: Message) -> None:
    """Job messages: signed by the caller's registered key, fresh, and the caller may execute
    in ``ctx``. Result messages: created and signed by this node."""
    if message.message_type in (MessageType.RESULT, MessageType.FLOW_JOB):  # flows hook
        if message.origin != node.node_id:
            raise Rejected("forged_result", "result messages in msg_out must come from this node")
        verdict = judge(message, node.node_id, now=now(), freshness=node.freshness)
        if not verdict.ok:
            raise Rejected(verdict.reason, verdict.detail)
    else:
        await authorise_caller(node, ctx, message)
    if message.origin != node.node_id:
        raise Rejected("wrong_origin", "messages in msg_out must name this node as origin")


async def route(node: NodeState, ctx: int, message: Message) -> None:
    if message.destination == node.node_id:
        await node.store.lpush(ctx, keys.MSG_IN, message.key)
    elif message.destination in node.peers:
        await outbox.enqueue(node.store, message.destination, ctx, message.key)
    else:
        raise Rejected("unknown_destination", f"node {message.destination[:16]}… is not a peer")
    node.count("routed")
