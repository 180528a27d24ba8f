"""How a runner process (node/worker/loop.py) logs: to the node's stderr, in the node's level
and format (node/observe/logs.py; ``hero-node run --log-format json`` gives one JSON object per line
whichever process wrote it), its job lines carrying their fields as the node's lines do."""

from __future__ import annotations

import logging
import os
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from node.observe.logs import configure

if TYPE_CHECKING:
    from node.slot.spec import RunnerSpec

log = logging.getLogger("node.worker.loop")


def line_fields(
    spec: RunnerSpec, job_key: str = "", reason: str = "", **more: object
) -> dict[str, object]:
    """The ``extra`` of a runner's log line: its context and slot, the job, and why (the
    job's ``reason`` as it is stored), then ``more`` (attempt, status, duration_ms)."""
    found: dict[str, object] = {"ctx": spec.ctx, "runner": spec.slot_id}
    if job_key:
        found["job"] = job_key
    if reason:
        found["reason"] = reason
    return found | more


def log_to(fd: int, spec: RunnerSpec) -> None:
    """Log to ``fd`` (the node's stderr) in the spec's level and format, uncaught exceptions
    too: a traceback printed as it is would break a stream of JSON lines in pieces."""
    stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    configure(spec.log_level, spec.log_format, stream)
    fields = line_fields(spec)

    def uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        log.critical("runner %s failed", spec.slot_id, exc_info=(kind, exc, tb), extra=fields)

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            uncaught(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread
