"""Keep a service running across Redis outages: restart it with backoff after a StoreError."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bus.errors import BusError, ContentError, StoreError

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
    on_restart: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``service(*args, task_status=...)``; after a StoreError, wait and run it again.

    A ContentError that reached this far (content no guard of the service judged) restarts
    it too, logged as the flaw it is: content must not stop a node. Each restart calls
    ``on_restart(name)`` (the node counts them). Reports started when the service first does.
    Returns when the service returns. Other exceptions propagate (a bug should be seen, not
    looped over).
    """
    first = _FirstStart(task_status)
    delay = BACKOFF_MIN_S
    while True:
        began = trio.current_time()
        failed: BusError | None = None
        try:
            await service(*args, task_status=first)
            return
        except* StoreError as group:
            failed = group.exceptions[0]  # type: ignore[assignment]
            log.warning("%s: redis unavailable (%s); restarting in %.1f s", name, failed, delay)
        except* ContentError as group:
            failed = group.exceptions[0]  # type: ignore[assignment]
            log.error("%s: unjudged content (%s); restarting in %.1f s", name, failed, delay)
        if on_restart is not None:
            on_restart(name)
        if trio.current_time() - began > HEALTHY_S:
            delay = BACKOFF_MIN_S
        await trio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)
