"""Moved to bus/core/queues.py (pure: it names lists). Kept for node/worker/loop.py, which the
runner-process rewrite changes; remove once nothing imports it from here."""

from bus.core.queues import (
    AGING_EVERY,
    consume_order,
    queue_for,
    queue_of,
    slot_bases,
    target_queue,
)

__all__ = ["AGING_EVERY", "consume_order", "queue_for", "queue_of", "slot_bases", "target_queue"]
