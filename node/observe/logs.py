"""How ``hero-node`` logs: plain text lines for people, or one JSON object per line for log
shippers (``hero-node run --log-format json``).

A JSON line holds ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``msg``
(the formatted message), then the fields the node attaches to its lines (``job``, ``ctx``,
``reason``, ``message_key``, ``peer``, ...: whatever a call passes as ``extra``) and, for an
exception, ``exc`` (its traceback).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, TextIO

from bus.store import CLIENT_LOGGER

FORMATS: Final = ("text", "json")
LEVELS: Final = ("debug", "info", "warning", "error")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are their own business: the store's client announces each retry,
# trio-websocket every connection.
# Shown at --log-level debug, where someone is looking for exactly that.
CHATTY: Final = (CLIENT_LOGGER, "trio-websocket")
# what every LogRecord carries: anything else on a record came from ``extra``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in line:
                line[name] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class CutConnectionAttempts(logging.Filter):
    """The store's client logs a connection attempt that a cancellation cut (the node stopping,
    or failing to start, while a connection was being made) as an ERROR with its traceback:
    no error of the store, and a traceback a user must not see. Shown at debug only."""

    def filter(self, record: logging.LogRecord) -> bool:
        # trio as imported by whoever raised: a runner process (node/worker/) never imports
        # it, which saves each one a tenth of a second of start-up
        trio = sys.modules.get("trio")
        exc = record.exc_info[1] if record.exc_info else None
        cut = trio is not None and isinstance(exc, trio.Cancelled)
        return not cut or logging.getLogger().isEnabledFor(logging.DEBUG)


_CUT = CutConnectionAttempts()


def configure(level: str | int = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send the root logger's records of ``level`` (a name of LEVELS or a number) and above
    to ``stream`` (stderr) as ``fmt``; the CHATTY libraries only from WARNING, and the store
    client's cut connection attempts (CutConnectionAttempts) not at all, unless ``level`` is
    debug."""
    # neither format prints where a call was made nor which thread or process made it: a
    # record that skips looking them up costs 34 us instead of 41 here, and the node and each
    # runner process write a line per job at info (the logging HOWTO's "Optimization")
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    number = level if isinstance(level, int) else getattr(logging, level.upper())
    root.setLevel(number)
    for name in CHATTY:
        quiet = number > logging.DEBUG
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
    logging.getLogger(CLIENT_LOGGER).addFilter(_CUT)  # once: a filter is added only once


def current_format() -> str:
    """The format the root logger writes in ("json" if a handler of it writes JSON lines), so
    that the node's runner processes (node/worker/loop.py) write theirs alike."""
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
    return "json" if json_lines else "text"
