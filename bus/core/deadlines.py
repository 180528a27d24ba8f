"""A job message's deadlines (PROTOCOL.md section 7), pure: no I/O.

The ack deadline is ``created_at + timeout_ack``. Both are signed fields, so the deadline
travels under the caller's signature and no node on the way can move it: the destination
refuses the message after it (``expired``, node/intake/admission.py), on arrival and when its
consumer takes it. The origin arms its own two deadlines when it sends the message
(:func:`deadline_times`) and fails the message at the first one it misses
(node/intake/deadlines.py): the ack one only once the signed deadline plus the allowed clock
skew has passed, when the destination refuses it too.

A job message a link stored carries who delivered it and the boot of this node that
acknowledges it (:data:`RECEIVED_FROM`, :data:`ACKED_IN`; written by node/links/frames.py): one
stored by another boot may never have been acknowledged, so its consumer holds it until it is
(:func:`unacknowledged`, node/intake/held.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from bus.core.ids import now_ms
from bus.core.models import Message, MessageType

ACKED_IN = "acked_in"  # the boot of this node that acknowledges the delivery
RECEIVED_FROM = "received_from"  # the peer that delivered it (and waits for its ack)


def ack_deadline(message: Message) -> int:
    """Unix second after which a job message must no longer be accepted (signed fields)."""
    return message.created_at + message.timeout_ack


def deadline_times(message: Message, skew_s: int) -> tuple[int, int]:
    """The ack and result deadlines (Unix ms) of a job message sent to a peer (armed with
    bus.store.atomic.routing.route; the caller then wakes the deadline service:
    WakeUps.deadline_scheduled): the ack one at the signed deadline plus ``skew_s``, the
    allowed clock skew, the result one ``timeout_result`` from now."""
    ack_ms = (ack_deadline(message) + skew_s) * 1000
    return ack_ms, now_ms() + message.timeout_result * 1000


def unacknowledged(boot: str, message: Message, stored: Mapping[str, str]) -> str:
    """The peer to acknowledge job message ``message`` to before it may run, if a boot other
    than ``boot`` stored it from that peer; "" if it may run (acknowledged in this boot, or not
    delivered by a peer). Only job messages: their origin fails them at the ack deadline."""
    if message.message_type is not MessageType.JOB:
        return ""
    peer = stored.get(RECEIVED_FROM, "")
    if not peer or stored.get(ACKED_IN) == boot:
        return ""
    return peer
