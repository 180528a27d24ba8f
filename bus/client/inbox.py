"""A client's reply inbox: one list for the answers to all its messages, popped in batches.

A message that names an inbox in its signed ``reply_to`` has every answer to its jobs pushed
on ``inbox:<name>`` (bus/core/keys.py ``reply_list``) in its context's DB, instead of its own
``reply:<message key>``. So a client with many messages in flight needs one blocking pop per
batch of answers, not one per job: whichever waiting task finds nobody popping becomes the
popper, takes up to :data:`BATCH` answers with one BLMPOP, hands each to the waiter of its
message, and keeps popping until its own message is answered; then it wakes one of the
others, which takes over. Nothing runs in the background, so a client needs no nursery.

The blocking pop is shielded from cancellation and bounded to :data:`POP_S`: a popper cancelled
in the middle of a pop (its caller gave up) must not drop the answers the server already took
off the list for the other waiters; it files them, then leaves.

Answers for a message nobody waits for yet are kept until :meth:`ReplyInbox.wait` claims them
(at most :data:`UNCLAIMED_MAX` messages' worth: a client that never waits must not grow
without bound).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import trio

from bus.core import keys
from bus.core.envelope import JobResult, parse_reply
from bus.core.models import Message
from bus.errors import ClientError
from bus.store import records
from bus.store.connection import Store

log = logging.getLogger(__name__)

BATCH = 256  # answers taken per blocking pop
POP_S = 1.0  # longest blocking pop: how long a cancelled popper may take to leave
UNCLAIMED_MAX = 65_536  # messages whose answers may wait for a waiter


def new_inbox_name() -> str:
    """A fresh inbox name, unique to one client (a valid ``reply_to``)."""
    return f"c{secrets.token_hex(10)}"


@dataclass(eq=False)
class _Lane:
    """The state of one inbox list (one name in one context DB)."""

    inbox: str  # its list's key
    arrived: dict[str, list[JobResult]] = field(default_factory=dict)
    wakers: dict[str, trio.Event] = field(default_factory=dict)
    popping: bool = False


class ReplyInbox:
    """The waiting side of the inboxes a :class:`~bus.client.api.Client`'s messages name."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lanes: dict[tuple[int, str], _Lane] = {}

    async def wait(self, message: Message, timeout_s: float) -> list[JobResult]:
        """One result per job of ``message`` (which names an inbox), popped in batches with
        the other waiters' answers; ClientError after ``timeout_s``, StoreError if Redis fails."""
        where = (message.context_id, message.reply_to)
        lane = self._lanes.get(where) or self._lanes.setdefault(
            where, _Lane(keys.inbox(message.reply_to))
        )
        deadline = trio.current_time() + timeout_s
        popper = False
        key = message.key  # a property that formats it: read once per wait, not per turn
        try:
            while len(lane.arrived.get(key, ())) < len(message.job):
                await trio.lowlevel.checkpoint_if_cancelled()  # the pop itself is shielded
                left = deadline - trio.current_time()
                if left <= 0:
                    raise ClientError(f"no result for {key} within {timeout_s:g} s")
                if lane.popping and not popper:  # it wakes us with ours, or hands over
                    waker = lane.wakers.setdefault(key, trio.Event())
                    with trio.move_on_at(deadline):
                        await waker.wait()
                    continue
                lane.popping = popper = True
                await self._pop(lane, message, left)
            return lane.arrived.pop(key)
        except BaseException:
            lane.arrived.pop(key, None)  # a waiter that gave up claims nothing later
            raise
        finally:
            lane.wakers.pop(key, None)
            if popper:
                lane.popping = False
                _hand_over(lane)

    async def _pop(self, lane: _Lane, message: Message, timeout_s: float) -> None:
        """Take up to BATCH answers off the inbox (blocking until one comes, or ``timeout_s``)
        and file each under its request, waking its waiter."""
        inbox = lane.inbox
        wait_s = min(max(timeout_s, 0.01), POP_S)
        with trio.CancelScope(shield=True):
            popped = await records.pop_inbox(self.store, message.context_id, inbox, wait_s, BATCH)
        for raw in popped:
            try:
                request, result = parse_reply(raw)
            except ValueError as exc:
                log.warning("%s: %s", inbox, exc)
                continue
            lane.arrived.setdefault(request, []).append(result)
            waker = lane.wakers.pop(request, None)
            if waker is not None:
                waker.set()
        if len(lane.arrived) > UNCLAIMED_MAX:
            _drop_unclaimed(lane, inbox, keep=message.key)


def _drop_unclaimed(lane: _Lane, inbox: str, keep: str) -> None:
    """Forget the oldest answers nobody waits for, down to UNCLAIMED_MAX messages."""
    excess = len(lane.arrived) - UNCLAIMED_MAX
    stale = [k for k in lane.arrived if k != keep and k not in lane.wakers][:excess]
    for request in stale:
        del lane.arrived[request]
    log.warning("%s: dropped the unclaimed answers of %d messages", inbox, len(stale))


def _hand_over(lane: _Lane) -> None:
    """Wake one waiter of ``lane`` (the popper leaves), so that someone pops while answers
    are awaited."""
    if lane.wakers:
        request = next(iter(lane.wakers))
        lane.wakers.pop(request).set()
