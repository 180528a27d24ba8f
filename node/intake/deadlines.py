"""A message's ``timeout_ack`` and ``timeout_result`` at its origin (dispatcher protocol).

When the supervisor sends a job message to a peer, it schedules two deadlines in the context's
``deadlines`` zset. If the peer has not acknowledged the message by the first, or no result has
come back by the second, the origin's copy ends in ``error`` (reason ``timeout_ack`` or
``timeout_result``) and the waiting client is answered. A result that arrives after that is
refused as ``late_result``.

The ack deadline is the signed one, ``created_at + timeout_ack`` (bus/core/deadlines.py, where
the supervisor takes the times it arms): the destination refuses the message after it
(``expired``), on arrival and when its consumer takes it. The origin fails the message only once
that deadline plus the allowed clock skew (``max_skew_s``) has passed, so by then the destination
refuses it too, and withdraws it from the peer's outbox and its in-flight list in one
transaction: a message its client was told failed is never sent again, and one already on the
wire is refused where it lands.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import trio

from bus.core import keys
from bus.core.envelope import ResultBody
from bus.core.ids import now_ms
from bus.core.models import JobStatus, Message, MessageStatus
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError
from bus.store import records
from bus.store.atomic.routing import fail_request, pop_due
from bus.store.atomic.routing import withdraw as atomic_withdraw
from node.intake.consumer import result_write
from node.state import NodeState, WakeUps

log = logging.getLogger(__name__)

UNANSWERED = (MessageStatus.DISPATCHED.value, MessageStatus.ACKNOWLEDGED.value)
IDLE_S = 3600.0  # a look with no deadline armed, against anything missed


async def run_deadlines(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Fail what is overdue; sleeps until the next deadline (no polling), or an earlier one
    armed meanwhile (WakeUps.deadline_armed): a later one wakes nothing, as the look at the
    time already due finds it."""
    task_status.started()
    wakeups = node.wakeups
    while True:
        # armed from here on: in the store before the look reads it, or said by deadline_armed
        wakeups.deadline_due[ctx] = -1
        after = await fail_due(node, ctx)
        if after >= 0:
            wakeups.deadline_armed(ctx, after)
        await _sleep(wakeups, ctx)


async def _sleep(wakeups: WakeUps, ctx: int) -> None:
    """Until the time the deadline service looks next (an hour when none is armed)."""
    while True:
        woken = wakeups.deadline_scheduled[ctx] = trio.Event()
        due = wakeups.deadline_due[ctx]
        with trio.move_on_after(IDLE_S if due < 0 else max(0.0, (due - now_ms()) / 1000)):
            await woken.wait()
        if not woken.is_set():
            return


async def fail_due(node: NodeState, ctx: int) -> int:
    """Fail every message whose deadline is due by the wall clock (bus.core.ids); returns when the
    next one is due (Unix ms), -1 if none is armed."""
    after, due = await pop_due(node.store, ctx, now_ms())
    for member in due:
        kind, _, key = member.partition("|")
        await expire(node, ctx, kind, key)
    return after


async def expire(node: NodeState, ctx: int, kind: str, key: str) -> None:
    """Fail message ``key`` if its ``kind`` deadline (ack or result) passed unmet. A member
    naming a key of another type (written by some other Redis client) is dead-lettered alone:
    the due members were popped together, so one that raised would cost the others theirs."""
    try:
        await _expire(node, ctx, kind, key)
    except ContentError as exc:
        await node.store.dead_letter(ctx, key, exc.reason, f"{kind} deadline: {exc}")


async def _expire(node: NodeState, ctx: int, kind: str, key: str) -> None:
    try:
        message = Message.from_hash(await records.read_message(node.store, ctx, key))
    except ModelError:
        return
    status = message.status.value
    if status not in UNANSWERED or (kind == "ack" and status != "dispatched"):
        return
    limit = message.timeout_ack if kind == "ack" else message.timeout_result
    token = Reason.TIMEOUT_ACK if kind == "ack" else Reason.TIMEOUT_RESULT
    reason = (
        f"{token}: no {'acknowledgement' if kind == 'ack' else 'result'} from "
        f"{message.destination[:16]}… within {limit} s"
    )
    log.warning("%s: %s", key, reason)
    await withdraw(node, message.destination, keys.outbox_entry(ctx, key))
    failed = [
        result_write(node, ResultBody(key, j.key, JobStatus.ERROR, {}, reason), message.reply_to)
        for j in message.job
    ]
    await fail_request(node.store, ctx, key, failed, reason)


async def withdraw(node: NodeState, peer: str, entry: str) -> None:
    """Take ``entry`` out of every outbox list of ``peer`` in one transaction (waiting, or
    sent and unacknowledged: the pump moves it atomically from one to the other, so it is
    in neither afterwards). A message its client is told failed must not be sent again;
    the in-flight place it held in the link's window opens, since no ack will count it."""
    unacked = await atomic_withdraw(node.store, peer, entry)
    box = node.peers.outboxes.get(peer)
    if unacked and box is not None:
        box.window.release(unacked)
