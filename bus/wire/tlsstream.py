"""A lean TLS stream for node links: OpenSSL's TLS 1.3 over a trio stream, with less Python.

trio's ``SSLStream`` is general: any number of tasks, renegotiation, TLS 1.2 close rules,
one SSL call per ``receive_some``. Each of its calls runs a retry loop, conflict detectors
and locks, and moves bytes between memory BIOs more than once: about 25 us more than plain
TCP per 966-byte record, where OpenSSL's own share is about 4 us (docs/security/links.md,
"Cost"). A link uses a stream one way only: trio-websocket reads it from one task (its
reader) and writes it under its own lock. So here:

- ``send_all`` is ``SSLObject.write``, the records it made (``outgoing.read()``) and one
  ``send_all`` on the transport;
- ``receive_some`` decrypts every whole record already received (up to ``max_bytes``) before
  it reads the transport again, so a burst of small records costs one call, not one each.

Security is OpenSSL's, unchanged: the same ``ssl.SSLContext`` (TLS 1.3 only, crypto/tls.py)
and the same certificate the node handshake binds. What the records carry besides data (a
TLS 1.3 session ticket, a KeyUpdate answer) is written by the reader too: every call flushes
``outgoing`` under the one send lock, which keeps the records on the wire in the order
OpenSSL made them. Errors are trio's: ``BrokenResourceError`` (from the ``ssl.SSLError``,
which a tampered record is), ``ClosedResourceError`` after ``aclose``, and ``b""`` only at
the peer's close_notify; an EOF without one (a truncation) is a ``BrokenResourceError``.
"""

from __future__ import annotations

import enum
import ssl

import trio

# what one read of the transport asks for: a few full TLS records (16 KiB each at most)
RECEIVE_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 64 * 1024


class _State(enum.Enum):
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


class TLSStream(trio.abc.Stream):
    """TLS over ``transport_stream`` with ``context`` (client, or ``server_side``).

    The handshake runs on the first call, or ahead with :meth:`do_handshake`. At most one task
    receives at a time (``trio.BusyResourceError`` otherwise); sends are serialised."""

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        context: ssl.SSLContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
    ) -> None:
        self.transport_stream = transport_stream
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._state = _State.OPEN
        self._handshook = trio.Event()
        self._handshaking = False
        self._handshake_error: BaseException | None = None
        # held while records go out: the writer's and those the reader's calls made
        self._send_lock = trio.StrictFIFOLock()
        self._receiving = False
        self._eof = False  # the peer's close_notify was read

    # -- what the connection is ----------------------------------------------------------------

    def version(self) -> str | None:
        return self._ssl.version()

    def cipher(self) -> tuple[str, str, int] | None:
        return self._ssl.cipher()

    def getpeercert(self, binary_form: bool = False) -> object:
        """The peer's certificate (DER with ``binary_form``), as ``ssl.SSLObject`` gives it."""
        return self._ssl.getpeercert(binary_form)

    # -- handshake -------------------------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Run the TLS handshake once; later calls return at once (or wait for the one under
        way). BrokenResourceError if it fails (its cause is the ``ssl.SSLError`` or the
        transport's error), ClosedResourceError after ``aclose``."""
        if self._handshook.is_set() or self._handshaking:
            await self._handshook.wait()
            if self._handshake_error is not None:
                raise trio.BrokenResourceError("the TLS handshake failed") from (
                    self._handshake_error
                )
            self._check_open()
            return
        self._check_open()
        self._handshaking = True
        try:
            await self._handshake()
        except BaseException as exc:
            self._handshake_error = exc
            self._broken()
            if isinstance(exc, ssl.SSLError):
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            raise
        finally:
            self._handshaking = False
            self._handshook.set()

    async def _handshake(self) -> None:
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._refill()
        await self._flush()  # the last flight (and a server's session tickets)

    # -- sending ---------------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt ``data`` and send its records. BrokenResourceError if the stream is broken
        (a send cancelled midway breaks it: a record may be half sent), ClosedResourceError
        after ``aclose``."""
        if not self._handshook.is_set():
            await self.do_handshake()
        self._check_open()
        if not data:
            await trio.lowlevel.checkpoint()
            return
        await self._acquire_send()
        try:
            self._check_open()
            try:
                self._ssl.write(data)
            except ssl.SSLError as exc:
                self._broken()
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            await self._send_out()
        finally:
            self._send_lock.release()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def _acquire_send(self) -> None:
        # uncontended (the usual case) without a schedule point: the transport's send has one
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()

    async def _send_out(self) -> None:
        """Send what OpenSSL wrote, the send lock held."""
        out = self._outgoing.read()
        if not out:
            return
        try:
            await self.transport_stream.send_all(out)
        except BaseException as exc:
            closed = self._state is _State.CLOSED
            self._broken()
            if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                raise (trio.ClosedResourceError if closed else trio.BrokenResourceError)(
                    str(exc)
                ) from exc
            raise

    async def _flush(self) -> None:
        """Send what a handshake or a read made OpenSSL write, if anything."""
        if self._outgoing.pending:
            await self._acquire_send()
            try:
                await self._send_out()
            finally:
                self._send_lock.release()

    # -- receiving -------------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` of plaintext: every whole record already received, else the
        next. ``b""`` once the peer sent close_notify. BrokenResourceError on a TLS error (a
        tampered record) or an EOF without close_notify; BusyResourceError if another task is
        receiving; ClosedResourceError after ``aclose``."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this TLS stream")
        self._receiving = True
        try:
            if not self._handshook.is_set():
                await self.do_handshake()
            self._check_open()
            return await self._receive(max_bytes or DEFAULT_MAX_BYTES)
        finally:
            self._receiving = False

    async def _receive(self, max_bytes: int) -> bytes:
        if self._eof:
            await trio.lowlevel.checkpoint()
            return b""
        waited = False
        while True:
            chunks = self._decrypt(max_bytes)
            await self._flush()  # a KeyUpdate answer, written by the read
            if chunks or self._eof:
                if not waited:
                    await trio.lowlevel.checkpoint()
                return b"".join(chunks)
            await self._refill()
            waited = True

    def _decrypt(self, max_bytes: int) -> list[bytes]:
        """The plaintext of the records in ``incoming``, up to ``max_bytes``."""
        chunks: list[bytes] = []
        left = max_bytes
        # read only while something is there: an SSLWantReadError costs as much as a record
        while left > 0 and (self._incoming.pending or self._ssl.pending() or self._incoming.eof):
            try:
                data = self._ssl.read(left)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as exc:
                self._broken()
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            if not data:
                self._eof = True
                break
            chunks.append(data)
            left -= len(data)
        return chunks

    async def _refill(self) -> None:
        """Read the transport into ``incoming``; at its EOF, OpenSSL's next read says whether
        a close_notify came first (clean) or not (SSLEOFError: broken)."""
        if self._incoming.eof:  # OpenSSL took the EOF as no verdict: never wait for more
            self._broken()
            raise trio.BrokenResourceError("the TLS peer closed the connection mid-record")
        try:
            data = await self.transport_stream.receive_some(RECEIVE_BYTES)
        except trio.BrokenResourceError:
            self._broken()
            raise
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    # -- closing ---------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Send close_notify when the stream is sound and nobody is sending (without waiting
        for the peer's), then close the transport."""
        if self._state is _State.CLOSED:
            await trio.lowlevel.checkpoint()
            return
        sound = (
            self._state is _State.OPEN
            and self._handshook.is_set()
            and self._handshake_error is None
            and not self._send_lock.locked()
        )
        self._state = _State.CLOSED
        try:
            if sound:
                try:
                    self._ssl.unwrap()
                except (ssl.SSLWantReadError, ssl.SSLError):
                    pass  # close_notify is written; the peer's is not awaited
                out = self._outgoing.read()
                if out:
                    try:
                        await self.transport_stream.send_all(out)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
        except BaseException:
            await trio.aclose_forcefully(self.transport_stream)
            raise
        await self.transport_stream.aclose()

    # -- state -----------------------------------------------------------------------------------

    def _broken(self) -> None:
        if self._state is _State.OPEN:
            self._state = _State.BROKEN

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise trio.ClosedResourceError("this TLS stream is closed")
        if self._state is _State.BROKEN:
            raise trio.BrokenResourceError("this TLS stream is broken")


class TLSListener(trio.abc.Listener[TLSStream]):
    """Wraps each stream ``inner`` accepts in a server-side :class:`TLSStream`; the
    handshake runs on its first use (as ``trio.SSLListener`` does)."""

    def __init__(self, inner: trio.abc.Listener[trio.abc.Stream], context: ssl.SSLContext) -> None:
        self.transport_listener = inner
        self._context = context

    async def accept(self) -> TLSStream:
        stream = await self.transport_listener.accept()
        return TLSStream(stream, self._context, server_side=True)

    async def aclose(self) -> None:
        await self.transport_listener.aclose()
