"""Exceptions raised by the node package, all under :class:`NodeError`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bus.core.reasons import Reason
from bus.errors import Refused

if TYPE_CHECKING:
    from bus.core.verify import MessageVerdict


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


class ListenError(NodeError):
    """A port the node must listen on cannot be bound (in use, say): the message names the
    port, the setting and what to do. Exit 2, as for a home in use: the operator's to fix."""

    exit_code = 2


class ValkeyError(NodeError):
    """The embedded Valkey could not be found, started or reached."""


class Rejected(NodeError, Refused):
    """A message is refused; ``reason`` is the token recorded in the dead-letter list."""

    @classmethod
    def by_peer(cls, token: str, detail: str) -> Rejected:
        """The peer refused the message for ``token``, a reason of its own that this node
        records as ``peer_refused_<token>`` without judging it."""
        return cls(f"{Reason.PEER_REFUSED}_{token}", detail)

    @classmethod
    def by_verdict(cls, verdict: MessageVerdict, about: str = "") -> Rejected:
        """The refusal a failing verdict of bus/core/verify.py (``judge``, the permission
        rule, freshness) stands for: its reason, its detail after ``about`` (who was judged)
        when given. Made only for a verdict that failed, so an accepted message never enters
        here."""
        return cls(
            Reason(verdict.reason), f"{about}: {verdict.detail}" if about else verdict.detail
        )
