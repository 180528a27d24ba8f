"""Exceptions raised by the bus package (imported as bus.errors). No coredis or trio-websocket
error leaks out of bus/."""

from __future__ import annotations

from collections.abc import Iterable

from bus.core.reasons import Reason
from bus.core.text import printable


class BusError(Exception):
    """Root of every error raised by bus/."""


class ModelError(BusError):
    """A Redis hash or wire object does not have the shape the data model requires."""


class StoreError(BusError):
    """Talking to Valkey/Redis failed."""


class TransportError(BusError):
    """A link between nodes failed or carried something invalid."""


class HandshakeError(TransportError):
    """A peer failed to authenticate; ``reason`` is a short token for logs and metrics."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class FrameError(TransportError):
    """A websocket frame could not be decoded."""


class ClientError(BusError):
    """A client request could not be carried out (bad arguments, unknown node, timeout)."""


class Refused(BusError):
    """An entry (a message, a queue entry) is refused: ``reason`` is the token recorded in the
    dead-letter list, ``detail`` the printable rest. Carried as the pair, never as a string to
    split again. A queue service's handler raises it; serve_queue dead-letters the entry."""

    def __init__(self, reason: Reason | str, detail: str = "") -> None:
        # the detail often quotes hostile content: made printable here, so that logging it,
        # storing it and signing it into the sender's error result cannot fail
        detail = printable(detail, 2000)
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ContentError(BusError):
    """What Redis holds under a key cannot be used as asked (a key of another type, a field
    that is not an integer, a database that does not exist): a fault of the content that an
    entry named, not of the server. The entry is refused (``reason``: ``wrong_type``,
    ``not_a_number``, ``unknown_context``); no service restarts over it."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class FlowError(BusError):
    """A flow document or flow spec is invalid; ``jobs`` names the offending job ids."""

    def __init__(self, message: str, jobs: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.jobs: list[str] = list(jobs)
