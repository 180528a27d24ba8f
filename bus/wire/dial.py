"""Dialling a peer: TCP, TLS 1.3 over :class:`bus.wire.tlsstream.TLSStream`, the websocket.

trio-websocket's ``open_websocket_url`` makes its own ``trio.SSLStream``; a link dials with
the lean stream instead (its cost: docs/security/links.md, "Cost"), and runs the TLS handshake
before the websocket's, so that a failed one says why at once (trio-websocket would turn it
into a closed connection and wait for its connect timeout).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from bus.errors import TransportError
from bus.wire.tlsstream import TLSStream

# said by the dialler when a wss:// dial meets no TLS: what it names as the likely cause
NO_TLS_HINT = (
    "the peer does not speak TLS: an older hero-node (cleartext ws:// only) or one with "
    'link_encryption = "none"; this node never falls back to cleartext'
)


def tls_hint(exc: BaseException) -> str:
    """The cause of a failed wss:// dial, when it says the peer answered without TLS (a
    cleartext HTTP answer read as a TLS record, or a close in the middle of the TLS
    handshake); "" otherwise."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError) and cur.reason in (
            "WRONG_VERSION_NUMBER",
            "RECORD_LAYER_FAILURE",
            "UNEXPECTED_EOF_WHILE_READING",
            "HTTP_REQUEST",
        ):
            return NO_TLS_HINT
        if isinstance(cur, ssl.SSLEOFError):
            return NO_TLS_HINT
        cur = cur.__cause__ or cur.__context__
    return ""


@asynccontextmanager
async def open_link(
    address: str,
    ssl_context: ssl.SSLContext | None,
    *,
    max_message_size: int,
    receive_buffer_size: int,
    connect_timeout_s: float,
    disconnect_timeout_s: float,
) -> AsyncIterator[WebSocketConnection]:
    """A websocket to ``address`` (``wss://`` over TLS with ``ssl_context``, ``ws://`` in
    cleartext), closed on exit within ``disconnect_timeout_s``.

    Raises OSError (TCP), trio.TooSlowError (TCP, TLS and the upgrade past
    ``connect_timeout_s``), TransportError (the TLS handshake failed: the message says why,
    and whether the peer seems to speak no TLS), trio-websocket's HandshakeError (the upgrade
    was refused) and whatever the body raises, each alone (never in an exception group)."""
    parts = urlsplit(address)
    host = parts.hostname or ""
    tls = parts.scheme == "wss"
    port = parts.port or (443 if tls else 80)
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(connect_timeout_s):
                ws = await _connect(
                    nursery,
                    address,
                    (host, port),
                    ssl_context if tls else None,
                    (max_message_size, receive_buffer_size),
                )
            try:
                yield ws
            finally:
                # as trio-websocket closes: the close handshake, bounded; a cancel ends it at
                # once (the websocket closes its stream whatever happens)
                with trio.move_on_after(disconnect_timeout_s):
                    await ws.aclose()
    except BaseExceptionGroup as group:
        _raise_alone(group)


async def _connect(
    nursery: trio.Nursery,
    address: str,
    at: tuple[str, int],
    context: ssl.SSLContext | None,
    sizes: tuple[int, int],
) -> WebSocketConnection:
    host, port = at
    max_message_size, receive_buffer_size = sizes
    tcp = await trio.open_tcp_stream(host, port)
    stream: trio.abc.Stream = tcp
    if context is not None:
        stream = TLSStream(tcp, context)
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(stream)
            failed = exc.__cause__ or exc
            hint = tls_hint(failed)
            raise TransportError(
                f"TLS handshake with {address} failed: {failed}" + (f" ({hint})" if hint else "")
            ) from None
    resource = (parts := urlsplit(address)).path or "/"
    if parts.query:
        resource += "?" + parts.query
    # trio-websocket's Host header, for the listener's sake: the port unless it is the default
    host_header = host if port in (80, 443) else f"{host}:{port}"
    try:
        return await wrap_client_stream(
            nursery,
            stream,  # type: ignore[arg-type]  # any trio Stream serves
            host_header,
            resource,
            max_message_size=max_message_size,
            receive_buffer_size=receive_buffer_size,
        )
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


def _raise_alone(group: BaseExceptionGroup[BaseException]) -> None:
    """Raise the one exception that is not a Cancelled in ``group`` (a refused upgrade raised by
    the websocket's reader task, or the body's), without the group as its context; the group
    itself when there are several or none."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    real = [exc for exc in leaves if not isinstance(exc, trio.Cancelled)]
    if len(real) != 1:
        raise group
    alone = real[0]
    context = alone.__context__
    try:
        raise alone
    finally:
        alone.__context__ = context
