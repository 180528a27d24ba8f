"""The lean TLS stream of links (bus/wire/tlsstream.py) against trio's own SSLStream on the
other end, both ways, over real sockets: data of every size arrives whole and in order, a
record cut short or changed on the way is refused, close_notify and a bare EOF are told apart.
Records made on purpose (a cut, a flipped byte) come from a real OpenSSL object."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from bus.wire.tlsstream import TLSStream
from crypto.tls import client_context, make_self_signed, server_context

Maker = Callable[[trio.SocketStream, bool], trio.abc.Stream]
# a 966-byte frame is what one message travels in; 1 MiB spans many 16 KiB records
SIZES = (1, 966, 16 * 1024 + 1, 1024 * 1024)


@pytest.fixture
def contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make_self_signed(cert, key, "test")
    return client_context(), server_context(cert, key)


def lean(ctx: tuple[ssl.SSLContext, ssl.SSLContext]) -> Maker:
    return lambda sock, server: TLSStream(sock, ctx[server], server_side=server)


def trios(ctx: tuple[ssl.SSLContext, ssl.SSLContext]) -> Maker:
    return lambda sock, server: trio.SSLStream(sock, ctx[server], server_side=server)


async def connected(client: Maker, server: Maker) -> tuple[trio.abc.Stream, trio.abc.Stream]:
    """A client and a server stream over a real socket pair, handshake done."""
    a, b = trio.socket.socketpair()
    c, s = client(trio.SocketStream(a), False), server(trio.SocketStream(b), True)
    async with trio.open_nursery() as nursery:
        for stream in (c, s):
            nursery.start_soon(stream.do_handshake)  # type: ignore[attr-defined]
    return c, s


async def receive_exactly(stream: trio.abc.Stream, n: int, chunk: int | None = None) -> bytes:
    got = bytearray()
    while len(got) < n:
        data = await stream.receive_some(chunk)
        assert data, f"EOF after {len(got)} of {n} bytes"
        got += data
    return bytes(got)


PAIRS = ["lean-lean", "lean-trio", "trio-lean"]


def pair_of(name: str, ctx: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[Maker, Maker]:
    kinds = {"lean": lean(ctx), "trio": trios(ctx)}
    client, server = name.split("-")
    return kinds[client], kinds[server]


@pytest.mark.parametrize("pair", PAIRS)
async def test_every_size_arrives_whole_both_ways(contexts, pair):
    with trio.fail_after(20):
        c, s = await connected(*pair_of(pair, contexts))
        for a, b in ((c, s), (s, c)):
            for size in SIZES:
                data = os.urandom(size)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a.send_all, data)
                    # small reads: a record's plaintext is handed out in pieces
                    assert await receive_exactly(b, size, 4096 if size < 100_000 else None) == data
        lean_side = c if isinstance(c, TLSStream) else s
        assert isinstance(lean_side, TLSStream)
        assert lean_side.version() == "TLSv1.3"  # the contexts', unchanged
        await c.aclose()
        await s.aclose()


@pytest.mark.parametrize("pair", PAIRS)
async def test_close_notify_is_a_clean_eof(contexts, pair):
    """aclose sends close_notify: the other end reads b"" (trio's stream, spec-compliant,
    would call a bare EOF broken)."""
    with trio.fail_after(10):
        c, s = await connected(*pair_of(pair, contexts))
        await c.send_all(b"last words")
        await c.aclose()
        assert await receive_exactly(s, 10) == b"last words"
        assert await s.receive_some() == b""
        await s.aclose()


async def test_a_partial_read_keeps_the_rest(contexts):
    with trio.fail_after(10):
        c, s = await connected(lean(contexts), lean(contexts))
        await c.send_all(b"0123456789")
        assert await s.receive_some(3) == b"012"
        assert await receive_exactly(s, 7) == b"3456789"


async def test_records_received_together_come_out_together(contexts):
    """What makes the stream lean on a busy link: every whole record already received is
    decrypted in one call, not one record per call."""
    with trio.fail_after(10):
        c, s = await connected(lean(contexts), lean(contexts))
        for i in range(5):
            await c.send_all(b"%d" % i * 100)  # five records
        await trio.testing.wait_all_tasks_blocked()
        first = await s.receive_some(65536)
        assert first.startswith(b"0" * 100)
        rest = await receive_exactly(s, 500 - len(first)) if len(first) < 500 else b""
        assert first + rest == b"".join(b"%d" % i * 100 for i in range(5))
        assert len(first) > 100  # more than one record in one receive_some


class RawPeer:
    """A TLS 1.3 server that is an ``ssl.SSLObject`` over memory BIOs, driven by hand over a
    real socket: it makes real records, which a test may cut or change before sending."""

    def __init__(self, sock: trio.SocketStream, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    async def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self.outgoing.pending:
                    await self.sock.send_all(self.outgoing.read())
                self.incoming.write(await self.sock.receive_some())
        await self.sock.send_all(self.outgoing.read())

    def record(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()


async def raw_pair(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[TLSStream, RawPeer]:
    a, b = trio.socket.socketpair()
    c = TLSStream(trio.SocketStream(a), contexts[0])
    peer = RawPeer(trio.SocketStream(b), contexts[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.do_handshake)
        nursery.start_soon(peer.handshake)
    return c, peer


async def refused(c: TLSStream) -> BaseException:
    with pytest.raises(trio.BrokenResourceError) as e:
        await c.receive_some()
    # broken for good: the next call says so too, as trio's stream does
    with pytest.raises(trio.BrokenResourceError):
        await c.send_all(b"more")
    return e.value


async def test_a_tampered_record_is_refused(contexts):
    with trio.fail_after(10):
        c, peer = await raw_pair(contexts)
        good = peer.record(b"a good record")
        await peer.sock.send_all(good)
        assert await c.receive_some() == b"a good record"
        bad = bytearray(peer.record(b"pay 10 to alice"))
        bad[10] ^= 0x01  # one ciphertext bit
        await peer.sock.send_all(bytes(bad))
        exc = await refused(c)
    assert isinstance(exc.__cause__, ssl.SSLError)
    assert "BAD_RECORD_MAC" in str(exc.__cause__) or "DECRYPTION_FAILED" in str(exc.__cause__)


@pytest.mark.parametrize("cut", ["mid-record", "between-records"])
async def test_an_eof_without_close_notify_is_broken(contexts, cut):
    """A close in the middle of a record, or between records without close_notify, is a
    truncation, never a clean end of the stream."""
    with trio.fail_after(10):
        c, peer = await raw_pair(contexts)
        record = peer.record(b"x" * 966)
        await peer.sock.send_all(record[: len(record) // 2] if cut == "mid-record" else record)
        await peer.sock.send_eof()
        if cut == "between-records":
            assert await receive_exactly(c, 966) == b"x" * 966
        exc = await refused(c)
    assert isinstance(exc.__cause__, ssl.SSLError)


async def test_a_peer_that_speaks_no_tls_fails_the_handshake(contexts):
    a, b = trio.socket.socketpair()
    c = TLSStream(trio.SocketStream(a), contexts[0])
    plain = trio.SocketStream(b)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(plain.send_all, b"HTTP/1.1 400 Bad Request\r\n\r\n")
            with pytest.raises(trio.BrokenResourceError) as e:
                await c.do_handshake()
    assert isinstance(e.value.__cause__, ssl.SSLError)
    with pytest.raises(trio.BrokenResourceError):
        await c.receive_some()


async def test_closed_stream_raises_closed(contexts):
    with trio.fail_after(10):
        c, s = await connected(lean(contexts), lean(contexts))
        await c.aclose()
        await c.aclose()  # idempotent
        with pytest.raises(trio.ClosedResourceError):
            await c.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await c.receive_some()
        await s.aclose()


async def test_one_receiver_at_a_time(contexts):
    with trio.fail_after(10):
        c, s = await connected(lean(contexts), lean(contexts))

        async def second_receiver(task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            with pytest.raises(trio.BusyResourceError):
                await s.receive_some()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            await nursery.start(second_receiver)
            await c.send_all(b"for the first")
