"""The listener's gate: what a connection may hold before it has authenticated.

Anyone who can reach the port can open a connection; until the node handshake
(:mod:`bus.core.handshake`) proves it is a known peer, it holds a socket, a file descriptor and a
few tasks. The gate bounds that:

- a cap on such pending connections in total and per source address: a connection past either
  is closed at once (with a reset, so it leaves no TIME-WAIT behind) and counted;
- one deadline from the accept over everything before authentication (TLS, the websocket upgrade,
  the node handshake), and a connection whose client closed before it authenticated is closed at
  once rather than left in CLOSE-WAIT until a timeout.

Addresses the node dials its known peers at are exempt from the total cap (not from the per-address
one): a flood from elsewhere fills the total, and a known peer dialling in still gets through.
The node's own dials are never gated.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

import trio

from bus.core.reasons import Reason

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 5.0  # a flood is logged once per interval, with its count, not per connection


@dataclass(frozen=True)
class GateLimits:
    max_pending: int = 256  # connections not yet authenticated, in total
    max_pending_per_address: int = 16  # ... from one source address
    deadline_s: float = 10.0  # from the accept to the end of the node handshake


def source_address(stream: trio.SocketStream) -> str:
    """The peer's IP address, IPv4-mapped IPv6 written as IPv4 (one source, one count)."""
    try:
        host = str(stream.socket.getpeername()[0])
    except OSError:
        return ""
    return host.removeprefix("::ffff:") if "." in host else host


class Pending(trio.abc.HalfCloseableStream):
    """An accepted connection that holds a slot of the gate until :meth:`authenticated` or its
    close. Reading its end (EOF) before authentication cancels ``scope``, so the connection's
    tasks end and the socket is closed at once."""

    def __init__(self, gate: Gate, stream: trio.SocketStream, address: str) -> None:
        self.gate = gate
        self.stream = stream
        self.address = address
        self.scope = trio.CancelScope(deadline=trio.current_time() + gate.limits.deadline_s)
        self.holds_slot = True
        self.upgraded = False  # the websocket upgrade is done (the transport says so)
        self._head = b""  # what peek() read, handed out again by the next receive_some

    async def peek(self) -> bytes:
        """The connection's first bytes, read without consuming them (b"" at EOF): the
        listener tells a TLS client from a cleartext one by them (bus/wire/transport.py)."""
        if not self._head:
            self._head = bytes(await self.receive_some())
        return self._head

    @property
    def has_unread(self) -> bool:
        """Whether peek() read bytes that no receive_some has handed out yet."""
        return bool(self._head)

    @property
    def timed_out(self) -> bool:
        return trio.current_time() >= self.scope.deadline

    def authenticated(self) -> None:
        """The peer proved itself: give back the slot and lift the deadline."""
        self.scope.deadline = math.inf
        self.gate.release(self)

    @property
    def socket(self) -> trio.socket.SocketType:
        """The connection's socket (trio-websocket reads the peer's address from it)."""
        return self.stream.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._head:
            size = len(self._head) if max_bytes is None else max_bytes
            data, self._head = self._head[:size], self._head[size:]
            return data
        data = await self.stream.receive_some(max_bytes)
        if not data and self.holds_slot:
            self.scope.cancel()  # the client left before authenticating: nothing to wait for
        return data

    async def aclose(self) -> None:
        self.gate.release(self)
        await self.stream.aclose()


class Gate:
    """Counts pending connections per source address; ``exempt(address)`` tells the addresses of
    known peers (exempt from the total cap). ``on_refused(reason)`` is called per refusal."""

    def __init__(
        self,
        limits: GateLimits,
        exempt: Callable[[str], bool],
        on_refused: Callable[[str], None],
    ) -> None:
        self.limits = limits
        self._exempt = exempt
        self._on_refused = on_refused
        self.pending = 0  # connections holding a slot (published as a gauge)
        self._by_address: dict[str, int] = {}
        self._unlogged = 0
        self._logged_at = -math.inf

    def admit(self, stream: trio.SocketStream) -> Pending | None:
        """A slot for this new connection, or None: it was refused and closed."""
        address = source_address(stream)
        reason = self._verdict(address)
        if reason is not None:
            _reset(stream)
            self._refused(reason, address)
            return None
        self.pending += 1
        self._by_address[address] = self._by_address.get(address, 0) + 1
        return Pending(self, stream, address)

    def _verdict(self, address: str) -> str | None:
        if self._by_address.get(address, 0) >= self.limits.max_pending_per_address:
            return Reason.ADDRESS_FULL
        if self.pending >= self.limits.max_pending and not self._exempt(address):
            return Reason.LISTENER_FULL
        return None

    def release(self, pending: Pending) -> None:
        if not pending.holds_slot:
            return
        pending.holds_slot = False
        self.pending -= 1
        left = self._by_address[pending.address] - 1
        if left:
            self._by_address[pending.address] = left
        else:
            del self._by_address[pending.address]

    def _refused(self, reason: str, address: str) -> None:
        self._on_refused(reason)
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at >= LOG_INTERVAL_S:
            log.warning(
                "listener refused %d connection(s) (last from %s): %s; %d pending",
                self._unlogged,
                address,
                reason,
                self.pending,
                extra={"reason": reason, "remote": address},
            )
            self._unlogged, self._logged_at = 0, now


class GatedListener(trio.abc.Listener[Pending]):
    """A TCP listener whose accept() returns only connections the gate admits."""

    def __init__(self, inner: trio.SocketListener, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    async def accept(self) -> Pending:
        while True:
            stream = await self.inner.accept()
            pending = self.gate.admit(stream)
            if pending is not None:
                return pending

    async def aclose(self) -> None:
        await self.inner.aclose()


def _reset(stream: trio.SocketStream) -> None:
    """Close at once with a RST: the refused client learns it now, and no TIME-WAIT stays."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()
