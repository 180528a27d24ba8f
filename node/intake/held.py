"""Job messages this node stored but may not have acknowledged: held until it has.

A link stores a job message durably on ``msg_in``, then acknowledges it (node/links/frames.py).
Its origin tells its client ``timeout_ack`` once the signed ack deadline plus the allowed clock
skew has passed without an ack (node/intake/deadlines.py), and this node refuses the message
after that deadline (node/intake/admission.py). So a message told failed never runs, as long as
the ack of a message that runs leaves before its deadline. A node killed between the write and
the ack breaks that: restarted, its consumer would take the message before the deadline and run
it, while the origin hears of it only when it sends it again over the next link, which may come
after it told its client the message failed.

So each delivery records the boot of this node that acknowledges it (``acked_in``) and the peer
it came from (``received_from``). The consumer sets aside a job message stored in another boot
(``unacknowledged``, bus/core/deadlines.py; :func:`hold`: ``msg_held``) instead of admitting
it, and :func:`run_held`, one per context, gives back what ``msg_held`` holds:

- to a peer whose link is up: it acknowledges the messages on that link (an ack the origin had
  already changes nothing there: bus/store/atomic/lua/routing_ack.lua), then queues them on
  ``msg_in`` again as acknowledged in this boot, where the consumer admits them under the usual
  ack deadline once the link has written their acks (held again if it never does);
- past its ack deadline: queued again unacknowledged, the consumer refuses it as ``expired``
  (its origin tells its client it failed, and it never ran).

The service sleeps until a link comes up, a message is held, or the next held deadline passes.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import trio

from bus.core.deadlines import ack_deadline
from bus.core.ids import now
from bus.core.models import Message
from bus.store.atomic import routing
from node.state import NodeState

log = logging.getLogger(__name__)


async def hold(node: NodeState, ctx: int, message: Message, peer: str, inflight: str) -> None:
    """Move ``message`` from the consumer's ``inflight`` list to ``msg_held`` until this boot has
    acknowledged it to ``peer`` (:func:`run_held`)."""
    await routing.hold(node.store, ctx, inflight, message.key, peer, ack_deadline(message))
    log.info(
        "%s held: stored from %s…, maybe never acknowledged (a restart, or its link ended "
        "before its ack was written); runs once acknowledged on a link",
        message.key,
        peer[:16],
        extra={"message_key": message.key, "ctx": ctx, "peer": peer},
    )
    node.counters.count("deliveries_held")
    node.wakeups.wake_held()


async def run_held(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Give back context ``ctx``'s held messages when their peer's link is up or their deadline
    passed; sleeps until a link comes up, a message is held or the next deadline (no polling)."""
    task_status.started()
    while True:
        wake = node.wakeups.held.setdefault(ctx, trio.Event())
        after = await release_due(node, ctx)
        # a deadline is whole seconds, refused once passed: look again a second after it
        wait_s = 3600.0 if after is None else max(0.0, after + 1 - now())
        with trio.move_on_after(wait_s):
            await wake.wait()
        node.wakeups.held[ctx] = trio.Event()


async def release_due(node: NodeState, ctx: int) -> int | None:
    """Give back what may go now (see the module doc); the soonest deadline of what stays held
    (Unix s), None if nothing does."""
    held = await routing.held(node.store, ctx)
    if not held:
        return None
    stamp, transport = now(), node.peers.transport
    acked: dict[str, list[str]] = {}
    expired: list[tuple[str, str]] = []
    waiting: list[int] = []
    for peer, key, deadline in held:
        link = transport.link(peer) if transport is not None else None
        if stamp > deadline:
            expired.append((peer, key))
        elif link is not None:
            acked.setdefault(peer, []).append(key)
        else:
            waiting.append(deadline)
    for peer, message_keys in acked.items():
        link = transport.link(peer) if transport is not None else None
        if link is None:
            continue
        # acknowledged first, queued after, and owed until the link wrote the acks: none of
        # them runs before (node/state.py OwedAcks); the link writes them in frames of at
        # most MAX_BATCH keys, as a peer accepts them (bus/core/frames.py)
        node.pressure.inbound.owed.owe(ctx, message_keys)
        link.post_answers([{"ctx": ctx, "key": k} for k in message_keys], [])
        link.answer_now()
        node.counters.count("acks_sent", len(message_keys))
        given = await routing.release(
            node.store, ctx, [(peer, k) for k in message_keys], node.identity.boot
        )
        node.counters.count("deliveries_released", given)
        log.info("acknowledged %d held message(s) to %s…; queued again", given, peer[:16])
    if expired:
        given = await routing.release(node.store, ctx, expired, "")
        node.counters.count("deliveries_held_expired", given)
        log.warning(
            "%d held message(s) past their ack deadline before their peer's link came up; "
            "queued again to be refused as expired",
            given,
        )
    return min(waiting) if waiting else None
