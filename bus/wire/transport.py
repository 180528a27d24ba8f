"""Websocket links between nodes: mutual authentication, then JSON frames in both directions.

Links are TLS 1.3 (wss://) when the node serves TLS and ``require_tls`` (the node's default,
node/links/encryption.py): the listener answers a cleartext dialler ``426 Upgrade Required``
with the reason, the dialler names a cleartext listener, and neither falls back to cleartext.

:class:`Transport` owns the links. It listens (``serve``), dials each peer with backoff
(``dial_forever``), runs the handshake of :mod:`bus.core.handshake` on every new connection and
hands each authenticated data frame to the ``on_frame`` callback. Nothing touches Redis before
a peer has authenticated: the set of known peers is held in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NoReturn
from urllib.parse import urlsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    WebSocketServer,
)
from trio_websocket import (
    HandshakeError as WsHandshakeError,
)
from wsproto.connection import ConnectionState
from wsproto.events import Ping

from bus.core import handshake as hs
from bus.core.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_BATCH,
    Auth,
    Frame,
    Handshake,
    Hello,
    Welcome,
    decode_frame,
    encode_frame,
)
from bus.core.ids import now
from bus.core.reasons import Reason
from bus.errors import FrameError, HandshakeError, TransportError
from bus.wire.dial import NO_TLS_HINT, open_link
from bus.wire.gate import Gate, GatedListener, GateLimits, Pending
from bus.wire.linkstate import LinkStates
from bus.wire.tlsstream import TLSListener, TLSStream
from bus.wire.wsframe import FrameWriter
from crypto import KeyPair
from crypto.tls import client_context

log = logging.getLogger(__name__)

# What a link's reader asks its stream for at once. trio-websocket's 4 KiB default hands a busy
# link's frames over four at a time; 64 KiB lets the TLS stream decrypt every record already
# received in one call (case 4 single frames, per CPU-second: 60 % of the raw echo, not 50 %)
RECEIVE_BUFFER_BYTES = 64 * 1024
# Answers (acks) posted while the reader handles frames read at once wait for the others' and
# leave in one acks frame, up to this many: a quarter of a sender's default window, so that it
# keeps sending meanwhile
HELD_ANSWERS = 64
WINDOW = 256  # messages a link carries unacknowledged, by default (TransportConfig.window)
CONNECT_TIMEOUT_S = 5.0  # TCP + websocket upgrade; a dead peer must not hold the dialler long
# A ping per link this often measures its round trip; a peer that stopped answering shows as
# a last_seen that falls behind, and its link is closed once a ping has waited ping_timeout_s.
PING_INTERVAL_S = 5.0
FrameHandler = Callable[["Link", Frame], Awaitable[None]]
BadFrameHandler = Callable[["Link", str], Awaitable[None]]
# the acks of a link written to it (True), or never (False: the link ended first)
AcksHandler = Callable[[Sequence[dict[str, object]], bool], None]


def _no_acks_handler(_acks: Sequence[dict[str, object]], _written: bool) -> None:
    pass


_ANSWER_PING = WebSocketConnection._handle_ping_event


async def _pong_while_open(self: WebSocketConnection, event: Ping) -> None:
    """A peer's ping is answered only while the connection is open: RFC 6455 asks no pong once
    this side sent its Close. trio-websocket 0.12 answers in every state, and wsproto refuses a
    pong after our Close (LOCAL_CLOSING) with an error that escaped the connection's reader
    task and ended the whole listener with it: a ping crossing a close we sent (a refused
    handshake, a link we ended) stopped the node (python-trio/trio-websocket#184)."""
    if self._wsproto.state is ConnectionState.OPEN:
        await _ANSWER_PING(self, event)


# every connection's reader task looks the handler up when it starts: patched once, here, for
# the listener's connections and the dialled ones alike
WebSocketConnection._handle_ping_event = _pong_while_open  # type: ignore[method-assign]


@dataclass(frozen=True)
class TransportConfig:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    handshake_timeout_s: float = 10.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    ssl_server: ssl.SSLContext | None = None  # listen on wss:// with this context
    ssl_client: ssl.SSLContext | None = None  # for dialling wss:// addresses
    tls_fingerprint: str = ""  # SHA-256 hex of our own TLS certificate (DER), if we serve TLS
    # dial every peer over TLS, a ws:// address as wss://: no link is cleartext unless the
    # node says so out loud (node/links/encryption.py)
    require_tls: bool = False
    plaintext_why: str = "TLS not configured"  # shown beside a cleartext link (status, /metrics)
    # connections not yet authenticated, in total and per source address (bus/wire/gate.py)
    max_pending: int = 256
    max_pending_per_address: int = 16
    # A link whose ping is not answered this long is closed. After a silent partition heals,
    # TCP may wait minutes (its retransmission timer backed off to 120 s) before an old
    # connection moves again, while the outbox keeps sending on it; closed, the outbox moves
    # to a fresh link (the peer's dial, or ours). A stalled peer is dialled again.
    ping_timeout_s: float = 20.0
    # messages sent on a link and not yet acknowledged, at most (the outbox's flow control)
    window: int = WINDOW


@dataclass
class Traffic:
    """What the links to one peer carried after their handshakes, since the node started
    (node/observe/metrics.py): frames and their bytes, in and out."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class Window:
    """At most ``size`` unacknowledged messages on a link; each ack opens a place again."""

    def __init__(self, size: int = WINDOW) -> None:
        self.size = size
        self.unacked = 0
        self._opened = trio.Event()

    async def acquire(self, count: int, ack_timeout_s: float) -> None:
        """Wait for ``count`` places (at most ``size``); TransportError if the peer acks
        nothing for ``ack_timeout_s`` while the window is too full."""
        while self.unacked > self.size - min(count, self.size):
            with trio.move_on_after(ack_timeout_s) as waited:
                await self._opened.wait()
            if waited.cancelled_caught:
                raise TransportError(f"no ack for {ack_timeout_s:g} s with a full window")
        self.unacked += count

    def release(self, count: int = 1) -> None:
        self.unacked = max(0, self.unacked - count)
        self._opened.set()
        self._opened = trio.Event()


@dataclass(eq=False)
class Link:
    """One authenticated websocket connection to a peer node."""

    peer_id: str
    ws: WebSocketConnection
    initiator: bool
    encryption: str = ""  # "TLSv1.3 <cipher>", "" on a cleartext link (see :func:`channel`)
    closed: trio.Event = field(default_factory=trio.Event)
    _posted: list[str] = field(default_factory=list)
    _post_ready: trio.Event = field(default_factory=trio.Event)
    # answers to msgs frames not yet written: whatever waits here leaves in one acks frame
    _acks: list[dict[str, object]] = field(default_factory=list)
    _nacks: list[dict[str, object]] = field(default_factory=list)
    # the reader is handling a frame read together with others that wait: answers wait for
    # theirs (see :meth:`reading`)
    _more: bool = False
    traffic: Traffic = field(default_factory=Traffic)  # the peer's, once registered
    # what the outbox sent on this link and the peer has not acked yet (bus/wire/outbox.py)
    window: Window = field(default_factory=Window)
    # told which acks were written and which never will be (the node runs no job message
    # before its ack has left: node/state.py OwedAcks)
    acks_out: AcksHandler = _no_acks_handler
    _writer: FrameWriter = field(init=False)

    def __post_init__(self) -> None:
        self._writer = FrameWriter(self.ws)

    def post(self, frame_type: str, **body: object) -> None:
        """Queue a frame for the link's writer without waiting. The frame handler answers this
        way, so the reader never blocks on a send: two nodes whose readers both waited for
        the other to read would deadlock."""
        self._posted.append(encode_frame(frame_type, **body))
        self._post_ready.set()

    def post_answers(
        self, acks: Sequence[dict[str, object]], nacks: Sequence[dict[str, object]]
    ) -> None:
        """Queue the answers to a ``msgs`` frame (as :meth:`post`). Answers posted before the
        writer takes them (a burst read at once, or frames handled while it was writing)
        leave together, in as few ``acks`` frames as MAX_BATCH allows: the answers of n
        frames cost one websocket frame, one TLS record and one application at the sender
        (its store round trips), not n."""
        self._acks += acks
        self._nacks += nacks
        if not self._more or len(self._acks) + len(self._nacks) >= HELD_ANSWERS:
            self._post_ready.set()

    def reading(self, more: bool) -> None:
        """The reader took a frame; ``more``: others were read with it and wait. The answers
        posted meanwhile wait for theirs (up to HELD_ANSWERS), never for a frame not yet
        received: a lone message is answered at once."""
        self._more = more

    def handled(self) -> None:
        """The reader is done with its frame: unless more wait, the answers go."""
        if not self._more and (self._acks or self._nacks):
            self._post_ready.set()

    def answer_now(self) -> None:
        """Send the answers posted so far without waiting for the frames read with them
        (the reader is about to wait for something other than the peer)."""
        self._more = False
        self.handled()

    async def write_posted(self) -> None:
        """Send posted frames in order, then the answers posted meanwhile, until the link
        closes (runs beside the reader)."""
        while True:
            await self._post_ready.wait()
            # the tasks already runnable first (the reader with a frame received meanwhile):
            # what they answer leaves in the same acks frame
            await trio.lowlevel.checkpoint()
            self._post_ready = trio.Event()
            batch, self._posted = self._posted, []
            acks: list[dict[str, object]] = []
            if not self._more or len(self._acks) + len(self._nacks) >= HELD_ANSWERS:
                batch += answer_frames(self._acks, self._nacks)
                acks, self._acks, self._nacks = self._acks, [], []
            if batch:  # in one write: one TLS record and one socket call for them all
                try:
                    await self._send([frame.encode() for frame in batch])
                except BaseException:
                    if acks:
                        self.acks_out(acks, False)
                    raise
                if acks:
                    self.acks_out(acks, True)

    def unwritten(self) -> None:
        """The link ended: the acks still posted never leave on it."""
        acks, self._acks = self._acks, []
        if acks:
            self.acks_out(acks, False)

    async def send(self, frame_type: str, **body: object) -> None:
        """Send one frame; TransportError if the link is gone."""
        await self.send_raw(encode_frame(frame_type, **body))

    async def send_raw(self, frame: str) -> None:
        """Send one encoded frame; TransportError if the link is gone."""
        await self._send([frame.encode()])

    async def _send(self, frames: list[bytes]) -> None:
        try:
            await self._writer.send(frames)
        except ConnectionClosed as exc:
            self.closed.set()
            raise TransportError(f"link to {self.peer_id[:16]}… closed") from exc
        self.traffic.frames_out += len(frames)
        self.traffic.bytes_out += sum(map(len, frames))

    async def close(self) -> None:
        self.closed.set()
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await self.ws.aclose()


def answer_frames(
    acks: Sequence[dict[str, object]], nacks: Sequence[dict[str, object]]
) -> list[str]:
    """The ``acks`` frames that carry ``acks`` and ``nacks``, MAX_BATCH entries each (what a
    peer accepts in one), in order: acks first."""
    frames = []
    while acks or nacks:
        these, acks = acks[:MAX_BATCH], acks[MAX_BATCH:]
        room = MAX_BATCH - len(these)
        those, nacks = nacks[:room], nacks[room:]
        frames.append(encode_frame("acks", acks=list(these), nacks=list(those)))
    return frames


def channel(ws: WebSocketConnection) -> str:
    """What protects a connection: its TLS version and cipher, or "" when it is cleartext."""
    stream = getattr(ws, "_stream", None)  # trio-websocket keeps the transport stream here
    if not isinstance(stream, TLSStream):
        return ""
    cipher = stream.cipher()
    return f"{stream.version()} {cipher[0]}" if cipher else str(stream.version())


TLS_RECORD_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello
PLAINTEXT_REFUSED = (
    "this hero-node encrypts its links (TLS 1.3) and refuses cleartext: dial it at wss://, "
    "from a hero-node with link encryption (an older one dials ws:// only)"
)
# what a dialler of cleartext meets at a TLS listener (the old node's log shows the body)
PLAINTEXT_ANSWER = (
    "HTTP/1.1 426 Upgrade Required\r\nUpgrade: TLS/1.3\r\nConnection: close\r\n"
    f"Content-Type: text/plain\r\nContent-Length: {len(PLAINTEXT_REFUSED)}\r\n\r\n"
    f"{PLAINTEXT_REFUSED}"
).encode()
MAX_REQUEST_HEAD = 16 * 1024


def peer_certificate_fingerprint(ws: WebSocketConnection) -> str:
    """SHA-256 hex of the TLS certificate the peer showed, or "" on a plain connection."""
    stream = getattr(ws, "_stream", None)  # trio-websocket keeps the transport stream here
    if not isinstance(stream, TLSStream):
        return ""
    der = stream.getpeercert(binary_form=True)
    return hashlib.sha256(der).hexdigest() if isinstance(der, bytes) else ""


def describe(exc: BaseException) -> str:
    """Why a link failed, in words, never empty: trio-websocket raises an empty HandshakeError
    whose cause holds the socket's error, and a close by the peer says why in its reason."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = _text(cur)
        if text and text not in parts:
            parts.append(text)
        cur = cur.__cause__ or cur.__context__
    return ": ".join(parts) or type(exc).__name__


def _token(exc: BaseException) -> str:
    """A link failure's reason token: a handshake's, else the exception's type."""
    return str(exc.reason) if isinstance(exc, HandshakeError) else type(exc).__name__


def _text(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        why = exc.reason
        if why is None:
            return "the connection closed"
        said = f": {why.reason}" if why.reason else ""
        return f"closed by the peer ({why.code} {why.name}{said})"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(filter(None, (_text(e) for e in exc.exceptions)))
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    return str(exc)


RELOAD_INTERVAL_S = 1.0

# the links' own randomness (redial jitter, ping payloads): the random module's shared state is
# the application's (a program or a test that seeds it, Hypothesis drawing in another thread)
_RANDOM = random.Random()


def jittered(delay: float) -> float:
    """A redial's wait: ``delay`` times a factor in [0.5, 1.5)."""
    return delay * (0.5 + _RANDOM.random())


def ping_payload() -> bytes:
    """A keep-alive ping's payload, 32 random bits as trio-websocket would draw them, but from
    this module's generator: trio-websocket draws its own from the random module's."""
    return _RANDOM.getrandbits(32).to_bytes(4, "big")


class Transport:
    """Links to peers. ``known_peers`` is consulted on every handshake (live registry)."""

    def __init__(
        self,
        key: KeyPair,
        known_peers: Callable[[], set[str]],
        on_frame: FrameHandler,
        on_bad_frame: BadFrameHandler,
        config: TransportConfig | None = None,
        reload_peers: Callable[[], Awaitable[None]] | None = None,
        *,
        on_refused: Callable[[str], None] | None = None,
        on_link: Callable[[str, bool], None] | None = None,
        before_dial: Callable[[str], Awaitable[None]] | None = None,
        acks_out: AcksHandler | None = None,
    ) -> None:
        self.key = key
        self.node_id = key.public_hex
        self.config = config or TransportConfig()
        self._known_peers = known_peers
        # A dialler unknown here may have been registered a moment ago (both ends learn a new
        # peer from their own registry events): re-read the registry once before refusing it,
        # at most every RELOAD_INTERVAL_S whoever dials.
        self._reload_peers = reload_peers
        self._reloaded_at = -RELOAD_INTERVAL_S
        self._on_frame = on_frame
        self._on_bad_frame = on_bad_frame
        self._links: dict[str, Link] = {}
        self._link_added = trio.Event()
        # refusal reasons (handshakes, oversize frames) -> count; ``on_refused(reason)`` is
        # called after each, so that the node publishes the counts (node/observe/tallies.py)
        self.refused: dict[str, int] = {}
        self.traffic: dict[str, Traffic] = {}  # by peer id
        self._on_refused = on_refused
        self.states = LinkStates()  # per peer: up/down, last seen, round trip (published)
        # a peer's circuit breaker (node/links/peer_breakers.py): ``on_link(peer, up)`` after
        # each link that came up (True) and each dial or link that failed (False);
        # ``before_dial(peer)`` returns when the next dial may start
        self._on_link = on_link or (lambda _peer, _up: None)
        self._before_dial = before_dial
        # told by every link of the acks it wrote and of those it never will
        self._acks_out = acks_out or _no_acks_handler
        # the hosts we dial peers at: a connection from one skips the listener's total cap
        self._peer_hosts: dict[str, str] = {}
        limits = GateLimits(
            self.config.max_pending,
            self.config.max_pending_per_address,
            self.config.handshake_timeout_s,
        )
        self.gate = Gate(limits, self._is_peer_host, self._count_refused)

    # -- links -----------------------------------------------------------------------------------

    def link(self, peer_id: str) -> Link | None:
        link = self._links.get(peer_id)
        return link if link is not None and not link.closed.is_set() else None

    async def wait_link(self, peer_id: str) -> Link:
        """Wait until an authenticated link to ``peer_id`` is up and return it."""
        while (link := self.link(peer_id)) is None:
            await self._link_added.wait()
        return link

    def _link(self, peer_id: str, ws: WebSocketConnection, *, initiator: bool) -> Link:
        """An authenticated connection as a link (its window of this transport's size)."""
        window = Window(self.config.window)
        return Link(peer_id, ws, initiator=initiator, encryption=channel(ws), window=window)

    def _register(self, link: Link) -> None:
        link.traffic = self.traffic.setdefault(link.peer_id, Traffic())
        self._links[link.peer_id] = link
        self._link_added.set()
        self._link_added = trio.Event()

    def _unregister(self, link: Link) -> None:
        link.closed.set()
        if self._links.get(link.peer_id) is link:
            del self._links[link.peer_id]

    # -- serving ---------------------------------------------------------------------------------

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Accept links on host:port until cancelled; reports the bound port when listening.
        Every connection passes the gate (bus/wire/gate.py) before the websocket sees it."""
        sockets = await trio.open_tcp_listeners(port, host=host)
        listeners: list[trio.abc.Listener[trio.abc.Stream]] = [
            GatedListener(listener, self.gate) for listener in sockets
        ]
        if self.config.ssl_server is not None:
            listeners = [TLSListener(gated, self.config.ssl_server) for gated in listeners]
        server = _GatedServer(
            self._accept,
            listeners,  # type: ignore[arg-type]  # any trio Listener serves
            max_message_size=self.config.max_frame_bytes,
            receive_buffer_size=RECEIVE_BUFFER_BYTES,
            # the gate's deadline bounds the upgrade; this one the closing handshake of a link
            connect_timeout=self.config.handshake_timeout_s,
            disconnect_timeout=self.config.handshake_timeout_s,
        )
        server.on_timeout = partial(self._count_refused, "TooSlowError")
        server.screen = partial(self._screen, self.config.ssl_server is not None)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            task_status.started(sockets[0].socket.getsockname()[1])
            await trio.sleep_forever()
        raise AssertionError("unreachable")

    def _is_peer_host(self, address: str) -> bool:
        return address in self._peer_hosts.values()

    async def _screen(self, tls: bool, pending: Pending) -> bool:
        """Whether a new connection speaks what this listener serves (TLS, or cleartext when
        the node's links are unencrypted), told by its first byte. A cleartext dialler of a
        TLS listener is answered 426 with the reason (an older node logs it); a TLS dialler
        of a cleartext listener is closed. Either is logged and counted here, never served."""
        head = await pending.peek()
        if not head or (head[0] == TLS_RECORD_HANDSHAKE) == tls:
            return bool(head)
        if tls:
            await _answer_plaintext(pending, head)
            reason, what = (
                "plaintext_dialler",
                (
                    "it speaks cleartext ws:// (an older hero-node, or one with "
                    'link_encryption = "none"); answered 426 Upgrade Required'
                ),
            )
        else:
            reason, what = (
                "tls_dialler",
                "it speaks TLS, and this node's links are not encrypted "
                f"({self.config.plaintext_why})",
            )
        self._count_refused(reason)
        log.warning(
            "connection from %s refused before any frame: %s",
            pending.address,
            what,
            extra={"reason": reason, "remote": pending.address},
        )
        return False

    async def _accept(self, request: WebSocketRequest) -> None:
        """Handle one inbound connection; nothing it does may take the listener down."""
        try:
            await self._accept_one(request)
        except Exception:
            log.exception("inbound link failed")

    async def _accept_one(self, request: WebSocketRequest) -> None:
        try:
            ws = await request.accept()
        except (ConnectionClosed, WsHandshakeError):
            return
        pending = _pending(ws)
        if pending is not None:
            pending.upgraded = True
        try:
            # the gate's deadline, counted from the accept, bounds the upgrade and this
            with trio.fail_at(pending.scope.deadline if pending else math.inf):
                peer_id = await self._respond(ws)
        except (HandshakeError, TransportError, trio.TooSlowError, ConnectionClosed) as exc:
            reason = self._refuse(ws, "inbound", exc)
            # the token only (no detail), but for a relay: the dialler's log then says why
            said = f": {hs.CHANNEL_MISMATCH}" if hs.CHANNEL_MISMATCH in str(exc) else ""
            await ws.aclose(code=1008, reason=f"handshake refused: {reason}{said}")
            return
        if pending is not None:
            _past_the_gate(ws, pending)
        await self._run_link(self._link(peer_id, ws, initiator=False))

    async def _respond(self, ws: WebSocketConnection) -> str:
        hello = await self._receive(ws, Hello)
        try:
            peer_id, n_i = hs.check_hello(hello, known=self._known_peers())
        except HandshakeError as exc:
            if exc.reason != Reason.UNKNOWN_NODE or not await self._reload():
                raise
            peer_id, n_i = hs.check_hello(hello, known=self._known_peers())
        n_r = hs.new_nonce()
        await ws.send_message(Hello(hs.PROTOCOL_VERSION, self.node_id, n_r).encode())
        session = hs.Session(peer_id, self.node_id, n_i, n_r, self.config.tls_fingerprint)
        auth = await self._receive(ws, Auth)
        if auth.tls:  # an older dialler sends none: its signature alone then decides
            hs.check_channel(auth.tls, self.config.tls_fingerprint)
        hs.verify_transcript(auth.sig, peer_id, "initiator", session)
        sig = hs.sign_transcript(self.key, "responder", session)
        await ws.send_message(Welcome(sig).encode())
        return peer_id

    async def _reload(self) -> bool:
        """Re-read the peer registry, unless that was done within RELOAD_INTERVAL_S."""
        now = trio.current_time()
        if self._reload_peers is None or now - self._reloaded_at < RELOAD_INTERVAL_S:
            return False
        self._reloaded_at = now
        await self._reload_peers()
        return True

    # -- dialling --------------------------------------------------------------------------------

    async def dial_forever(self, peer_id: str, address: str) -> NoReturn:
        """Keep a link to ``peer_id`` at ``address`` up, reconnecting with backoff and jitter."""
        delay = self.config.backoff_initial_s
        host = urlsplit(address).hostname
        if host:
            self._peer_hosts[peer_id] = host
        while True:
            if self._before_dial is not None:
                await self._before_dial(peer_id)
            try:
                await self._dial_once(peer_id, address)
                delay = self.config.backoff_initial_s
            except (
                OSError,
                WsHandshakeError,
                ConnectionClosed,
                TransportError,
                trio.TooSlowError,
            ) as exc:
                said = describe(exc)
                log.log(
                    # a peer that cannot speak to us until one side is upgraded or set: loud
                    logging.WARNING if NO_TLS_HINT in said or "426" in said else logging.INFO,
                    "link to %s… (%s) failed: %s",
                    peer_id[:16],
                    self.dial_url(address),
                    said,
                    extra={
                        "peer": peer_id,
                        "address": address,
                        "reason": _token(exc.__cause__ or exc),
                    },
                )
                self._link_failed(peer_id, exc)
            except Exception as exc:
                log.exception("link to %s… (%s) failed", peer_id[:16], address)
                self._link_failed(peer_id, exc)
            await trio.sleep(jittered(delay))
            delay = min(delay * 2, self.config.backoff_max_s)

    def _link_failed(self, peer_id: str, exc: BaseException) -> None:
        self._on_link(peer_id, False)
        if self.link(peer_id) is None:  # a link the peer dialled may be up meanwhile
            self.states.down(peer_id, describe(exc))

    def dial_url(self, address: str) -> str:
        """What a peer's address is dialled as: with ``require_tls``, a ws:// address as
        wss:// (its listener serves TLS, or the dial fails with the reason: never cleartext)."""
        if self.config.require_tls and address.startswith("ws://"):
            return "wss://" + address.removeprefix("ws://")
        return address

    async def _dial_once(self, peer_id: str, address: str) -> None:
        """One link to ``peer_id``, over TLS 1.3 unless ``address`` is ws:// (and TLS not
        required); TransportError says why when the TLS handshake fails."""
        async with open_link(
            self.dial_url(address),
            self.config.ssl_client or client_context(),
            max_message_size=self.config.max_frame_bytes,
            receive_buffer_size=RECEIVE_BUFFER_BYTES,
            connect_timeout_s=min(self.config.handshake_timeout_s, CONNECT_TIMEOUT_S),
            disconnect_timeout_s=self.config.handshake_timeout_s,
        ) as ws:
            try:
                with trio.fail_after(self.config.handshake_timeout_s):
                    await self._initiate(ws, peer_id)
            except HandshakeError as exc:
                self._refuse(ws, "outbound", exc)
                raise
            await self._run_link(self._link(peer_id, ws, initiator=True))

    async def _initiate(self, ws: WebSocketConnection, peer_id: str) -> None:
        n_i = hs.new_nonce()
        await ws.send_message(Hello(hs.PROTOCOL_VERSION, self.node_id, n_i).encode())
        hello = await self._receive(ws, Hello)
        _, n_r = hs.check_hello(hello, known=None, expected=peer_id)
        shown = peer_certificate_fingerprint(ws)
        session = hs.Session(self.node_id, peer_id, n_i, n_r, shown)
        sig = hs.sign_transcript(self.key, "initiator", session)
        await ws.send_message(Auth(sig, tls=shown).encode())
        welcome = await self._receive(ws, Welcome)
        hs.verify_transcript(welcome.sig, peer_id, "responder", session)

    # -- both sides ------------------------------------------------------------------------------

    async def _receive(self, ws: WebSocketConnection, kind: type[Handshake]) -> Handshake:
        """The next frame, which must be a handshake frame of ``kind``; else HandshakeError
        (``malformed_frame`` or ``unexpected_frame``)."""
        try:
            frame = decode_frame(await ws.get_message(), self.config.max_frame_bytes)
        except FrameError as exc:
            raise HandshakeError(Reason.MALFORMED_FRAME, str(exc)) from None
        if frame.type != kind.TYPE:
            raise HandshakeError(Reason.UNEXPECTED_FRAME, f"wanted {kind.TYPE}, got {frame.type}")
        return kind.of(frame.body)

    def _refuse(self, ws: WebSocketConnection, direction: str, exc: BaseException) -> str:
        """Count and log a refused handshake; returns the reason token."""
        reason = _token(exc)
        self._count_refused(reason)
        try:
            remote = _remote(ws)
        except OSError:  # the socket is already gone
            remote = "a closed connection"
        log.warning(
            "%s handshake with %s refused: %s",
            direction,
            remote,
            describe(exc),
            extra={"reason": reason, "remote": str(remote)},
        )
        return reason

    def _count_refused(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if self._on_refused is not None:
            self._on_refused(reason)

    async def _read(self, link: Link) -> None:
        state = self.states.of(link.peer_id)
        while True:
            try:
                data = await link.ws.get_message()
            except ConnectionClosed as exc:
                self._closed(link, exc)
                return
            link.reading(_frames_waiting(link.ws))
            link.traffic.frames_in += 1
            link.traffic.bytes_in += len(data.encode() if isinstance(data, str) else data)
            try:
                frame = decode_frame(data, self.config.max_frame_bytes)
            except FrameError as exc:
                await self._on_bad_frame(link, str(exc))
            else:
                state.last_seen = now()
                await self._on_frame(link, frame)
            link.handled()

    async def _write_posted(self, link: Link) -> None:
        try:
            await link.write_posted()
        except TransportError as exc:  # the reader sees the close too, and ends the link
            log.info("link %s… closed while writing: %s", link.peer_id[:16], exc)

    async def _keep_alive(self, link: Link, scope: trio.CancelScope) -> None:
        """Ping the peer every PING_INTERVAL_S and record the round trip; end the link
        (``scope``) when a ping waits ``ping_timeout_s`` for its answer."""
        while True:
            started = trio.current_time()
            with trio.move_on_after(self.config.ping_timeout_s) as waiting:
                try:
                    await link.ws.ping(ping_payload())
                except ConnectionClosed:
                    return  # the reader sees the close too, and ends the link
            if waiting.cancelled_caught:
                log.info(
                    "link %s…: no answer to a ping for %g s; closed",
                    link.peer_id[:16],
                    self.config.ping_timeout_s,
                )
                await link.close()  # bounded: the close handshake may not get through either
                scope.cancel()
                return
            self.states.rtt(link.peer_id, trio.current_time() - started)
            await trio.sleep(PING_INTERVAL_S)

    def _closed(self, link: Link, exc: ConnectionClosed) -> None:
        code = getattr(exc.reason, "code", None)
        if code == 1009:  # MESSAGE_TOO_BIG: trio-websocket enforced max_frame_bytes
            self._count_refused("oversize_frame")
            log.warning(
                "link %s…: frame above %d bytes; link closed",
                link.peer_id[:16],
                self.config.max_frame_bytes,
            )

    async def _run_link(self, link: Link) -> None:
        log.info("link up: %s %s…", "to" if link.initiator else "from", link.peer_id[:16])
        link.acks_out = self._acks_out
        self._register(link)
        self.states.up(
            link.peer_id, link.encryption, "" if link.encryption else self.config.plaintext_why
        )
        if not link.encryption:
            log.warning(
                "link %s %s… is NOT encrypted (%s)",
                "to" if link.initiator else "from",
                link.peer_id[:16],
                self.config.plaintext_why,
            )
        self._on_link(link.peer_id, True)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_posted, link)
                nursery.start_soon(self._keep_alive, link, nursery.cancel_scope)
                await self._read(link)
                nursery.cancel_scope.cancel()
        finally:
            link.unwritten()
            self._unregister(link)
            if self.link(link.peer_id) is None:  # no link the other way either
                self.states.down(link.peer_id, "link closed")
            self._on_link(link.peer_id, False)
            log.info("link down: %s…", link.peer_id[:16])


def _frames_waiting(ws: WebSocketConnection) -> bool:
    """Whether frames already received wait behind the one just taken: trio-websocket's
    reader queues each message it parsed on this channel (one, and one more blocked)."""
    channel = getattr(ws, "_recv_channel", None)
    if channel is None:
        return False
    stats = channel.statistics()
    return bool(stats.current_buffer_used or stats.tasks_waiting_send)


def _remote(ws: WebSocketConnection) -> object:
    """The peer's address (trio-websocket reads it from a socket stream only); OSError if the
    socket is gone."""
    stream = getattr(ws, "_stream", None)  # trio-websocket keeps the transport stream here
    if isinstance(stream, TLSStream):
        inner = stream.transport_stream
        if isinstance(inner, trio.SocketStream | Pending):
            return inner.socket.getpeername()[0]
    return getattr(ws.remote, "address", ws.remote)


def _pending(ws: WebSocketConnection) -> Pending | None:
    """The gate's slot of an inbound connection (under TLS, beneath the TLS stream)."""
    stream = getattr(ws, "_stream", None)  # trio-websocket keeps the transport stream here
    if isinstance(stream, TLSStream):
        stream = stream.transport_stream
    return stream if isinstance(stream, Pending) else None


def _past_the_gate(ws: WebSocketConnection, pending: Pending) -> None:
    """The peer proved itself: the gate gives back its slot, and the link's frames go to the
    socket from now on, not through the gate's wrapper, which would only pass each one on."""
    pending.authenticated()
    if pending.has_unread:  # bytes peeked but not yet handed out stay with the wrapper
        return
    stream = ws._stream  # trio-websocket keeps the transport stream here
    if isinstance(stream, TLSStream):
        stream.transport_stream = pending.stream
    else:
        ws._stream = pending.stream


class _GatedServer(WebSocketServer):
    """trio-websocket's server, each connection run inside its gate slot's cancel scope: the
    deadline then covers TLS and the upgrade too, and a client's EOF before authentication ends
    the connection at once (trio-websocket would wait for its connect timeout in CLOSE-WAIT)."""

    on_timeout: Callable[[], None] = staticmethod(lambda: None)
    screen: Callable[[Pending], Awaitable[bool]] | None = None  # Transport._screen

    @property
    def listeners(self) -> list[str]:  # type: ignore[override]  # only for its debug log
        return [repr(listener) for listener in self._listeners]

    async def _handle_connection(self, stream: trio.abc.Stream) -> None:
        inner = stream.transport_stream if isinstance(stream, TLSStream) else stream
        if not isinstance(inner, Pending):  # not from a gated listener: as trio-websocket does
            await super()._handle_connection(stream)
            return
        try:
            with inner.scope:
                if self.screen is None or await self.screen(inner):
                    await super()._handle_connection(stream)
            # past the upgrade, the handshake counts its own timeout (as a refusal)
            if inner.scope.cancelled_caught and not inner.upgraded and inner.timed_out:
                self.on_timeout()
        finally:
            inner.gate.release(inner)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1):
                await stream.aclose()


async def _answer_plaintext(pending: Pending, head: bytes) -> None:
    """Answer a cleartext request ``426 Upgrade Required`` with the reason, after reading its
    head: a close with the request unread would reset the connection, and the answer with it."""
    request = bytearray(head)
    while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_HEAD:
        more = await pending.receive_some()
        if not more:
            return
        request += more
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await pending.send_all(PLAINTEXT_ANSWER)
        await pending.send_eof()
