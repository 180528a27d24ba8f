"""The websocket frames a link builds itself (bus/wire/wsframe.py): byte for byte what wsproto
would have sent, read by a real trio-websocket peer (wsproto's checks on its side) in both
directions, each of a client's frames under a fresh masking key, a closed connection
refused as trio-websocket refuses it, and a cancelled send that leaves a TLS link whole."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    open_websocket_url,
    serve_websocket,
)
from wsproto.frame_protocol import FrameProtocol

from bus.errors import TransportError
from bus.wire.transport import Link, Transport
from bus.wire.wsframe import FrameWriter, mask, text_frame
from tests.wire.test_handshake import A, B, Recorder
from tests.wire.test_link_tls import tls

# the length encodings' edges (7 bits, 16 bits, 64 bits), and a link's usual 966-byte frame
SIZES = (0, 1, 125, 126, 966, 0xFFFF, 0x10000, 200_000)


def text(size: int) -> str:
    """``size`` bytes of UTF-8 text, with multi-byte characters when there is room."""
    head = "é€😀" if size >= 9 else ""
    return head + "x" * (size - len(head.encode()))


def key_of(frame: bytes) -> bytes:
    """The masking key of a masked frame, found from its length field."""
    at = {126: 4, 127: 10}.get(frame[1] & 0x7F, 2)
    return frame[at : at + 4]


@pytest.mark.parametrize("size", SIZES)
def test_the_bytes_are_wsprotos(size):
    payload = text(size)
    data = payload.encode()
    # a server's frame is unmasked: the same bytes as wsproto's
    assert text_frame(data) == bytes(FrameProtocol(client=False, extensions=[]).send_data(payload))
    # a client's is masked with a key wsproto draws: under that key, the same bytes
    theirs = bytes(FrameProtocol(client=True, extensions=[]).send_data(payload))
    assert text_frame(data, key_of(theirs)) == theirs


def test_masking_is_an_involution_with_the_key_repeated():
    data = bytes(range(256)) * 3 + b"abc"
    key = b"\x01\x80\xff\x10"
    masked = mask(data, key)
    assert masked != data
    assert mask(masked, key) == data
    assert all(m ^ d == key[i % 4] for i, (m, d) in enumerate(zip(masked, data, strict=True)))


@pytest.fixture
async def pair(nursery: trio.Nursery) -> AsyncIterator[tuple[WebSocketConnection, ...]]:
    """A client and a server trio-websocket connection over a real TCP connection."""
    accepted: trio.MemorySendChannel[WebSocketConnection]
    accepted, server_side = trio.open_memory_channel(1)

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await accepted.send(ws)
        await trio.sleep_forever()  # the connection lives as long as the handler

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    async with open_websocket_url(f"ws://127.0.0.1:{server.port}") as client:
        with trio.fail_after(10):
            served = await server_side.receive()
        yield client, served


async def test_a_real_peer_reads_them_both_ways(pair):
    client, server = pair
    messages = [text(size) for size in SIZES]
    with trio.fail_after(20):
        for sender, receiver in ((client, server), (server, client)):
            # one at a time, then all in one write
            for message in messages:
                await FrameWriter(sender).send([message.encode()])
                assert await receiver.get_message() == message
            async with trio.open_nursery() as nursery:  # more than the sockets buffer
                nursery.start_soon(FrameWriter(sender).send, [m.encode() for m in messages])
                assert [await receiver.get_message() for _ in messages] == messages


async def test_a_clients_frames_each_have_a_fresh_key(pair):
    client, server = pair
    writer = FrameWriter(client)
    sent: list[bytes] = []
    real_stream = client._stream

    class Recording(trio.abc.Stream):
        """What the writer hands the connection's stream, passed on to it."""

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            sent.append(bytes(data))
            await real_stream.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await real_stream.wait_send_all_might_not_block()

        async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
            return await real_stream.receive_some(max_bytes)

        async def aclose(self) -> None:
            await real_stream.aclose()

    client._stream = Recording()
    payload = b'{"t":"acks","acks":[],"nacks":[]}'
    with trio.fail_after(10):
        for _ in range(8):
            await writer.send([payload])
            assert await server.get_message() == payload.decode()
    keys = {key_of(frame) for frame in sent}
    assert len(sent) == 8
    assert len(keys) == 8  # 8 draws of 32 random bits: no repeat
    for frame in sent:
        assert frame[:2] == struct.pack("!BB", 0x81, 0x80 | len(payload))
        assert mask(frame[6:], key_of(frame)) == payload


async def test_a_closed_connection_is_refused(pair):
    client, server = pair
    link = Link("peer", client, initiator=True)
    await server.aclose()
    with trio.fail_after(10), pytest.raises(ConnectionClosed):
        await client.get_message()  # the peer's close has been read
    with pytest.raises(TransportError):
        await link.send_raw('{"t":"acks","acks":[],"nacks":[]}')
    assert link.closed.is_set()


async def test_a_cancelled_send_leaves_a_tls_link_whole(nursery, tmp_path):
    """A send whose scope is already cancelled raises before anything is encrypted: a TLS
    record made and not sent would break the stream, and the link with it."""
    rec = Recorder()
    tb = Transport(B, lambda: {A.public_hex}, rec.on_frame, rec.on_bad_frame, tls(tmp_path, "b"))
    port = await nursery.start(tb.serve, "127.0.0.1", 0)
    ta = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame,
                   tls(tmp_path, "a"))  # fmt: skip
    nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{port}")
    with trio.fail_after(10):
        link = await ta.wait_link(B.public_hex)
    assert link.encryption.startswith("TLSv1.3 ")
    await trio.testing.wait_all_tasks_blocked()  # the first ping sent: the send lock is free
    assert not link.ws._stream_lock.locked()
    with trio.CancelScope() as scope:
        scope.cancel()
        await link.send("acks", acks=[{"ctx": 1, "key": "message:1:1"}], nacks=[])
    assert scope.cancelled_caught
    with trio.fail_after(10):
        await link.send("acks", acks=[{"ctx": 1, "key": "message:1:2"}], nacks=[])
        await rec.got.wait()
    assert [f.body["acks"] for _, f in rec.frames] == [[{"ctx": 1, "key": "message:1:2"}]]
    assert not link.closed.is_set()
