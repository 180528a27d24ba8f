"""The websocket frames a link sends, built here and written straight to its stream.

trio-websocket sends a message through wsproto: an event object, a state check, the payload
copied half a dozen times (the masking among them), then trio-websocket's send lock, whose
uncontended ``acquire`` is a schedule point of its own, beside the one the socket's send makes.
For a link's frames (whole text messages, no extension) the bytes are fixed by RFC 6455: FIN and
the text opcode, the length, and on a dialled link (a client) a fresh random masking key and
the payload XORed with it (section 5.3). :func:`text_frame` builds exactly what wsproto would
send (tests/wire/test_wsframe.py compares them and has a real peer read them); :class:`FrameWriter`
writes them under the connection's own send lock, so they never interleave with the pings,
pongs and close frames trio-websocket still sends, and writes the frames it is given at once in
one write (one TLS record, one socket call). A 966-byte frame sent and read by a trio-websocket
peer costs 47 to 53 us of CPU this way, 67 to 74 us through ``send_message``
(bench/HISTORY.md#link-cost3).

Only sending is done here. What a link receives is parsed by wsproto, with all its checks.
Anything other than the plain case (an extension negotiated, a wsproto without the state read
here) goes through trio-websocket as before; a connection no longer open is refused.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection
from wsproto.connection import Connection, ConnectionState

FIN_TEXT = 0x81  # FIN set, RSV bits clear, opcode 1 (text)
MASKED = 0x80
_TWO_BYTE = struct.Struct("!BBH")
_EIGHT_BYTE = struct.Struct("!BBQ")
# the connection's parts a writer uses, beside wsproto's connection state
_READS = ("_stream", "_stream_lock", "_close_reason", "_abort_web_socket")


def mask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XORed with the 4-byte ``key`` repeated (RFC 6455 section 5.3)."""
    n = len(payload)
    if not n:
        return b""
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(keys, "little")).to_bytes(
        n, "little"
    )


def text_frame(payload: bytes, key: bytes | None = None) -> bytes:
    """One unfragmented text frame of ``payload`` (UTF-8), masked with ``key`` if given (a
    client's frame must be, a server's must not be)."""
    n = len(payload)
    bit = MASKED if key is not None else 0
    if n <= 125:
        head = bytes((FIN_TEXT, n | bit))
    elif n <= 0xFFFF:
        head = _TWO_BYTE.pack(FIN_TEXT, 126 | bit, n)
    else:
        head = _EIGHT_BYTE.pack(FIN_TEXT, 127 | bit, n)
    if key is None:
        return head + payload
    return head + key + mask(payload, key)


class FrameWriter:
    """Sends whole text messages on ``ws``, an open trio-websocket connection, as
    ``ws.send_message`` would: same bytes, same lock, same errors (ConnectionClosed once the
    connection is closed or its stream broke, which closes it as trio-websocket does)."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws
        self._client = ws.is_client
        # set once the opening handshake is done
        connection = getattr(getattr(ws, "_wsproto", None), "connection", None)
        proto = getattr(connection, "_proto", None)
        # what this reads of trio-websocket and wsproto (versions pinned in pyproject.toml), and
        # no negotiated extension (compression rewrites frames); else frames go through wsproto
        known = all(hasattr(ws, name) for name in _READS)
        plain = getattr(proto, "extensions", None) == []
        self._connection: Connection | None = connection if known and plain else None

    async def send(self, payloads: Sequence[bytes]) -> None:
        """Send each payload (UTF-8 text) as one message, all in one write to the stream."""
        # a cancelled caller stops here, before anything is encrypted: a TLS record made and
        # not sent breaks the stream (trio-websocket's lock acquire checked this)
        await trio.lowlevel.checkpoint_if_cancelled()
        ws = self._ws
        connection = self._connection
        if connection is None:
            for payload in payloads:
                await ws.send_message(payload.decode())
            return
        if ws._close_reason is not None or connection.state is not ConnectionState.OPEN:
            raise ConnectionClosed(ws._close_reason)
        if self._client:
            data = b"".join(text_frame(p, os.urandom(4)) for p in payloads)
        else:
            data = b"".join(text_frame(p) for p in payloads)
        lock = ws._stream_lock
        # uncontended (the usual case) without a schedule point: the stream's send has one
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            # a close may have been sent while this task waited for the lock
            if ws._close_reason is not None or connection.state is not ConnectionState.OPEN:
                raise ConnectionClosed(ws._close_reason)
            try:
                await ws._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await ws._abort_web_socket()
                raise ConnectionClosed(ws._close_reason) from None
        finally:
            lock.release()
