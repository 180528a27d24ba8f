"""Exceptions raised by the node package, all under :class:`NodeError`."""

from __future__ import annotations

from pathlib import Path

from bus.core.reasons import Reason


class NodeError(Exception):
    """Root of every error raised by node/."""


class ConfigError(NodeError):
    """The node's configuration or data directory is missing or invalid."""


class HomeInUse(NodeError):
    """Another node holds this home's lock."""

    exit_code = 2

    def __init__(self, home: Path, pid: int) -> None:
        super().__init__(f"a node is already running on {home} (pid {pid or '?'})")
        self.pid = pid


class ValkeyError(NodeError):
    """The embedded Valkey could not be found, started or reached."""


class WorkerLost(NodeError):
    """The worker process exited (or was killed) before it answered."""


class Rejected(NodeError):
    """A message is refused; ``reason`` is the token recorded in the dead-letter list."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        self._set(reason, detail)

    @classmethod
    def by_peer(cls, token: str, detail: str) -> Rejected:
        """The peer refused the message for ``token``, a reason of its own that this node
        records as ``peer_refused_<token>`` without judging it."""
        refused = cls.__new__(cls)
        refused._set(f"{Reason.PEER_REFUSED}_{token}", detail)
        return refused

    def _set(self, reason: str, detail: str) -> None:
        # the detail often quotes hostile content: made printable here, so that logging it,
        # storing it and signing it into the sender's error result cannot fail
        from bus.store.connection import (
            printable,  # not above: runner processes import this without coredis
        )

        detail = printable(detail, 2000)
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
