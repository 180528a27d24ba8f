"""The listener's gate (bus/wire/gate.py) on a real in-process transport and real sockets, and
the end of an authenticated link that stops answering pings.

Connections come from other loopback addresses (127.0.0.2 and up) so that the per-address count
is seen. Time runs on trio's MockClock: it jumps only after the run has been idle for 0.3 s
of real time, so a reaction to a socket event costs no virtual time and a timeout costs its full
length: "closed at once" and "closed at the deadline" are told apart without timing anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from bus.core.frames import Frame
from bus.wire.gate import Gate, GateLimits
from bus.wire.transport import (
    PING_INTERVAL_S,
    Link,
    Transport,
    TransportConfig,
    _past_the_gate,
)
from crypto import KeyPair
from tests.faults_proxy import TcpProxy

DEADLINE_S = 10.0
CONFIG = TransportConfig(max_pending=4, max_pending_per_address=2, handshake_timeout_s=DEADLINE_S)
UPGRADE_START = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"


async def _ignore(_link: Link, _what: Frame | str) -> None:
    return None


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    mock_clock.autojump_threshold = 0.3  # real seconds of idleness before time jumps
    return mock_clock


@asynccontextmanager
async def serving(transport: Transport) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(transport.serve, "127.0.0.1", 0)
        yield port
        nursery.cancel_scope.cancel()


async def connect(port: int, source: str) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return sock


async def refused(port: int, source: str) -> bool:
    """Connect, and see the server close at once (the reset may come during the connect)."""
    try:
        sock = await connect(port, source)
    except ConnectionResetError:
        return True
    with sock:
        return await closed_by_server(sock)


async def closed_by_server(sock: trio.socket.SocketType) -> bool:
    """Read until the server closes (True), whether by FIN or reset."""
    try:
        while await sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


async def test_connections_past_the_caps_are_closed_at_once_and_counted(clock):
    transport = Transport(KeyPair.generate(), set, _ignore, _ignore, CONFIG)
    transport._peer_hosts["a-peer"] = "127.0.0.9"  # as dial_forever records it
    held: list[trio.socket.SocketType] = []
    async with serving(transport) as port:
        t0 = trio.current_time()
        held += [await connect(port, "127.0.0.2") for _ in range(2)]
        assert await refused(port, "127.0.0.2")  # accepted after the two (FIFO)
        assert transport.refused == {"address_full": 1}
        held += [await connect(port, "127.0.0.3") for _ in range(2)]  # 4: the total cap
        assert await refused(port, "127.0.0.4")
        assert transport.refused == {"address_full": 1, "listener_full": 1}
        assert transport.gate.pending == 4
        # a known peer's address is exempt from the total cap (not from its own)
        held += [await connect(port, "127.0.0.9")]
        assert await refused(port, "127.0.0.4")  # so the one before it was accepted
        assert transport.gate.pending == 5
        assert trio.current_time() == t0  # every refusal came at once
        for sock in held:
            sock.close()


async def test_a_client_gone_before_authenticating_is_closed_at_once(clock):
    """It half-closes after the start of an upgrade: the server closes too, at once, instead
    of keeping the socket in CLOSE-WAIT until a timeout."""
    transport = Transport(KeyPair.generate(), set, _ignore, _ignore, CONFIG)
    async with serving(transport) as port:
        with await connect(port, "127.0.0.2") as sock:
            await sock.send(UPGRADE_START)
            t0 = trio.current_time()
            sock.shutdown(trio.socket.SHUT_WR)
            assert await closed_by_server(sock)
            assert trio.current_time() == t0
        assert transport.gate.pending == 0  # given back before the close


@pytest.mark.parametrize("upgrade", [False, True], ids=["idle", "slowloris"])
async def test_an_unfinished_upgrade_is_closed_at_the_handshake_deadline(clock, upgrade):
    """Idle, or sending one header line a second: closed at the deadline, not trio-websocket's
    60 s connect timeout; counted as a timed-out handshake."""
    transport = Transport(KeyPair.generate(), set, _ignore, _ignore, CONFIG)
    async with serving(transport) as port, trio.open_nursery() as nursery:
        with await connect(port, "127.0.0.2") as sock:
            t0 = trio.current_time()

            async def trickle() -> None:
                await sock.send(UPGRADE_START)
                for n in range(100):
                    await trio.sleep(1)
                    await sock.send(b"X-%d: y\r\n" % n)

            if upgrade:
                nursery.start_soon(trickle)
            assert await closed_by_server(sock)
            assert DEADLINE_S <= trio.current_time() - t0 < DEADLINE_S + 1
            nursery.cancel_scope.cancel()
    assert transport.refused == {"TooSlowError": 1}
    assert transport.gate.pending == 0


async def test_an_authenticated_link_outlives_the_deadline(clock):
    """The deadline bounds the time before authentication only; the link then holds no slot."""
    a, b = KeyPair.generate(), KeyPair.generate()
    bob = Transport(b, lambda: {a.public_hex}, _ignore, _ignore, CONFIG)
    alice = Transport(a, lambda: {b.public_hex}, _ignore, _ignore, CONFIG)
    async with serving(bob) as port, trio.open_nursery() as nursery:
        nursery.start_soon(alice.dial_forever, b.public_hex, f"ws://127.0.0.1:{port}")
        link = await bob.wait_link(a.public_hex)
        assert bob.gate.pending == 0
        # and its frames go to the socket, no longer through the gate's wrapper
        assert type(link.ws._stream) is trio.SocketStream
        await trio.sleep(6 * DEADLINE_S)
        assert bob.link(a.public_hex) is link
        nursery.cancel_scope.cancel()


async def test_a_link_whose_pings_go_unanswered_is_closed(clock):
    """A silent network (a proxy that forwards nothing and closes nothing) ends the link once a
    ping has waited ping_timeout_s; until then answered pings keep it up."""
    a, b = KeyPair.generate(), KeyPair.generate()
    bob = Transport(b, lambda: {a.public_hex}, _ignore, _ignore, CONFIG)
    alice = Transport(a, lambda: {b.public_hex}, _ignore, _ignore, CONFIG)
    async with serving(bob) as port, trio.open_nursery() as nursery:
        proxy = TcpProxy(port)
        await nursery.start(proxy.run)
        nursery.start_soon(alice.dial_forever, b.public_hex, proxy.url)
        link = await alice.wait_link(b.public_hex)
        await trio.sleep(3 * CONFIG.ping_timeout_s)
        assert alice.link(b.public_hex) is link
        proxy.freeze()
        frozen_at = trio.current_time()
        with trio.fail_after(PING_INTERVAL_S + CONFIG.ping_timeout_s + 1):
            await link.closed.wait()
        assert trio.current_time() - frozen_at >= CONFIG.ping_timeout_s
        nursery.cancel_scope.cancel()


async def test_a_wrapper_holding_peeked_bytes_stays_beneath_the_link() -> None:
    """An authenticated link's stream goes past the gate's wrapper only once the wrapper holds
    no byte it peeked and has not handed out: those live nowhere else."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with listener, await trio.open_tcp_stream("127.0.0.1", port) as theirs:
        gate = Gate(GateLimits(), lambda _: False, lambda _: None)
        pending = gate.admit(await listener.accept())
        assert pending is not None
        await theirs.send_all(b"hello")
        assert await pending.peek() == b"hello"
        ws = SimpleNamespace(_stream=pending)
        _past_the_gate(ws, pending)  # type: ignore[arg-type]
        assert ws._stream is pending  # the peeked bytes are still to be read through it
        assert gate.pending == 0  # the slot is given back all the same
        assert await ws._stream.receive_some() == b"hello"
        _past_the_gate(ws, pending)  # type: ignore[arg-type]
        assert ws._stream is pending.stream  # nothing unread: the socket itself
