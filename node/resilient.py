"""Keep a service running across Redis outages: restart it with backoff after a StoreError."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bus.errors import StoreError

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
HEALTHY_S = 30.0  # a service that ran this long starts its backoff afresh


class _FirstStart:
    """Relays only the first ``started()`` of a service that may be restarted."""

    def __init__(self, status: trio.TaskStatus[Any]) -> None:
        self._status = status
        self.done = False

    def started(self, value: Any = None) -> None:  # noqa: ANN401
        if not self.done:
            self.done = True
            self._status.started(value)


async def resilient(
    name: str,
    service: Callable[..., Awaitable[Any]],
    *args: Any,  # noqa: ANN401
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``service(*args, task_status=...)``; after a StoreError, wait and run it again.

    Reports started when the service first does. Returns when the service returns.
    Other exceptions propagate (a bug should be seen, not looped over).
    """
    first = _FirstStart(task_status)
    delay = BACKOFF_MIN_S
    while True:
        began = trio.current_time()
        failed: StoreError | None = None
        try:
            await service(*args, task_status=first)
            return
        except* StoreError as group:
            failed = group.exceptions[0]  # type: ignore[assignment]
        if trio.current_time() - began > HEALTHY_S:
            delay = BACKOFF_MIN_S
        log.warning("%s: redis unavailable (%s); restarting in %.1f s", name, failed, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)
