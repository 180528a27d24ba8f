"""Node authentication: pure transcript checks, and real websocket links on loopback."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from bus.core import handshake as hs
from bus.core.frames import Auth, Frame, Hello, Welcome, decode_frame, encode_frame
from bus.errors import HandshakeError
from bus.wire.transport import Link, Transport, TransportConfig
from crypto import KeyPair
from crypto.tls import make_self_signed, server_context

A, B, C = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()


def hello(key: KeyPair, nonce: str | None = None, v: int = hs.PROTOCOL_VERSION) -> Hello:
    return Hello(v, key.public_hex, nonce or hs.new_nonce())


def test_hello_checks():
    assert hs.check_hello(hello(A), known={A.public_hex})[0] == A.public_hex
    with pytest.raises(HandshakeError) as e:
        hs.check_hello(hello(A), known={B.public_hex})
    assert e.value.reason == "unknown_node"
    for old in (0, 1):  # v1 sends single msg frames and cannot read msgs/acks batches
        with pytest.raises(HandshakeError) as e:
            hs.check_hello(hello(A, v=old), known={A.public_hex})
        assert e.value.reason == "version_mismatch"
    with pytest.raises(HandshakeError) as e:
        hs.check_hello(hello(A), known=None, expected=B.public_hex)
    assert e.value.reason == "unexpected_node"
    with pytest.raises(HandshakeError) as e:
        hs.check_hello(
            Hello(hs.PROTOCOL_VERSION, "01" + "00" * 31, hs.new_nonce()),
            known=None,
        )
    assert e.value.reason == "bad_node_id"  # the identity point is no node key
    with pytest.raises(HandshakeError) as e:
        hs.check_hello(hello(A, nonce="ab"), known=None)
    assert e.value.reason == "bad_nonce"


def test_handshake_frames_travel_as_their_dataclasses():
    for sent in (hello(A), Auth("ab" * 32), Welcome("cd" * 32)):
        frame = decode_frame(sent.encode())
        assert frame.type == sent.TYPE
        assert type(sent).of(frame.body) == sent


def test_transcript_binds_role_nonces_ids_and_tls():
    n_i, n_r = hs.new_nonce(), hs.new_nonce()
    session = hs.Session(A.public_hex, B.public_hex, n_i, n_r)
    sig = hs.sign_transcript(A, "initiator", session)
    hs.verify_transcript(sig, A.public_hex, "initiator", session)
    bad = [
        (sig, A.public_hex, "responder", session),  # reflected
        (sig, A.public_hex, "initiator", replace(session, nonce_initiator=hs.new_nonce())),
        (sig, A.public_hex, "initiator", replace(session, nonce_responder=hs.new_nonce())),
        (sig, A.public_hex, "initiator", replace(session, responder=C.public_hex)),
        (sig, A.public_hex, "initiator", replace(session, tls="ab" * 32)),  # other certificate
        (sig, C.public_hex, "initiator", session),  # wrong key
        ("zz", A.public_hex, "initiator", session),
    ]
    for args in bad:
        with pytest.raises(HandshakeError) as e:
            hs.verify_transcript(*args)
        assert e.value.reason == "bad_signature"


class Recorder:
    def __init__(self) -> None:
        self.frames: list[tuple[str, Frame]] = []
        self.bad: list[str] = []
        self.got = trio.Event()

    async def on_frame(self, link: Link, frame: Frame) -> None:
        self.frames.append((link.peer_id, frame))
        self.got.set()

    async def on_bad_frame(self, link: Link, detail: str) -> None:
        self.bad.append(detail)
        self.got.set()


async def serve(nursery, key: KeyPair, known: set[str], rec: Recorder) -> tuple[Transport, str]:
    t = Transport(key, lambda: known, rec.on_frame, rec.on_bad_frame)
    port = await nursery.start(t.serve, "127.0.0.1", 0)
    return t, f"ws://127.0.0.1:{port}"


async def test_link_carries_frames_both_ways(nursery):
    ra, rb = Recorder(), Recorder()
    ta, _ = await serve(nursery, A, {B.public_hex}, ra)
    tb, url_b = await serve(nursery, B, {A.public_hex}, rb)
    nursery.start_soon(ta.dial_forever, B.public_hex, url_b)
    with trio.fail_after(10):
        link_ab = await ta.wait_link(B.public_hex)
        link_ba = await tb.wait_link(A.public_hex)
        await link_ab.send("acks", acks=[{"ctx": 1, "key": "message:1:2"}], nacks=[])
        await rb.got.wait()
        await link_ba.send("acks", acks=[{"ctx": 1, "key": "message:1:3"}], nacks=[])
        await ra.got.wait()
    assert rb.frames[0][0] == A.public_hex
    assert rb.frames[0][1].body["acks"][0]["key"] == "message:1:2"
    assert ra.frames[0][0] == B.public_hex
    assert ra.frames[0][1].body["acks"][0]["key"] == "message:1:3"


async def test_unknown_node_and_wrong_key_are_refused(nursery):
    rb = Recorder()
    tb, url_b = await serve(nursery, B, {A.public_hex}, rb)
    tc = Transport(C, lambda: {B.public_hex}, rb.on_frame, rb.on_bad_frame)
    with trio.fail_after(10), pytest.raises((HandshakeError, ConnectionClosed)):
        await tc._dial_once(B.public_hex, url_b)  # C is not a peer of B
    assert tb.refused == {"unknown_node": 1}
    # A dials B's address believing it is C: A refuses the answer, B never sees an auth
    ta = Transport(A, lambda: {C.public_hex}, rb.on_frame, rb.on_bad_frame)
    with trio.fail_after(10), pytest.raises(HandshakeError) as e:
        await ta._dial_once(C.public_hex, url_b)
    assert e.value.reason == "unexpected_node"
    assert tb.link(A.public_hex) is None
    assert tb.link(C.public_hex) is None
    assert rb.frames == []


async def test_replayed_auth_and_garbage_are_refused_before_any_frame(nursery):
    rb = Recorder()
    tb, url_b = await serve(nursery, B, {A.public_hex}, rb)
    # record a genuine auth from one session...
    n_i = hs.new_nonce()
    async with open_websocket_url(url_b) as ws:
        await ws.send_message(
            encode_frame("hello", v=hs.PROTOCOL_VERSION, node=A.public_hex, nonce=n_i)
        )
        answer = await ws.get_message()
        import json

        n_r = json.loads(answer)["nonce"]
        old_sig = hs.sign_transcript(
            A, "initiator", hs.Session(A.public_hex, B.public_hex, n_i, n_r)
        )
    # ...and replay it in a new one: B's fresh nonce makes it worthless
    with trio.fail_after(10):
        async with open_websocket_url(url_b) as ws:
            await ws.send_message(
                encode_frame("hello", v=hs.PROTOCOL_VERSION, node=A.public_hex, nonce=n_i)
            )
            await ws.get_message()
            await ws.send_message(encode_frame("auth", sig=old_sig))
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        async with open_websocket_url(url_b) as ws:
            await ws.send_message("this is not a frame")
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        async with open_websocket_url(url_b) as ws:  # a data frame before authenticating
            item = {"ctx": 1, "key": "message:1:1", "fields": {}}
            await ws.send_message(encode_frame("msgs", msgs=[item]))
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        async with open_websocket_url(url_b) as ws:  # downgrade attempt
            await ws.send_message(encode_frame("hello", v=0, node=A.public_hex, nonce=n_i))
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
    assert tb.refused.get("bad_signature") == 1
    assert tb.refused.get("malformed_frame") == 1
    assert tb.refused.get("unexpected_frame") == 1
    assert tb.refused.get("version_mismatch") == 1
    assert rb.frames == []
    assert rb.bad == []


async def test_node_refuses_unknown_peer_without_writing_redis(node_factory):
    alice = await node_factory("alice")
    before = {db: sorted(await alice.store.call(db, lambda r: r.keys("*"))) for db in (0, 1)}
    stranger = Transport(C, lambda: {alice.node_id}, Recorder().on_frame, Recorder().on_bad_frame)
    with trio.fail_after(10), pytest.raises((HandshakeError, ConnectionClosed)):
        await stranger._dial_once(alice.node_id, alice.info.ws_url)
    after = {db: sorted(await alice.store.call(db, lambda r: r.keys("*"))) for db in (0, 1)}
    assert after == before


async def test_a_dialler_registered_a_moment_ago_is_let_in_after_one_registry_read(nursery):
    """Both ends learn a new peer from their own registry events; the one dialled may not have
    caught up yet. It re-reads its registry once before refusing an unknown dialler (at most
    once a second, so strangers cannot make it hammer Redis), and still refuses strangers."""
    rb = Recorder()
    known: set[str] = set()
    reloads: list[float] = []

    async def reload_peers() -> None:  # the registry as it is in Redis by now: A was added
        reloads.append(trio.current_time())
        known.add(A.public_hex)

    tb = Transport(B, lambda: known, rb.on_frame, rb.on_bad_frame, reload_peers=reload_peers)
    port = await nursery.start(tb.serve, "127.0.0.1", 0)
    ta = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame)
    nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{port}")
    with trio.fail_after(10):
        await tb.wait_link(A.public_hex)
    assert len(reloads) == 1
    assert tb.refused == {}
    tc = Transport(C, lambda: {B.public_hex}, rb.on_frame, rb.on_bad_frame)
    with trio.fail_after(10), pytest.raises((HandshakeError, ConnectionClosed)):
        await tc._dial_once(B.public_hex, f"ws://127.0.0.1:{port}")
    assert tb.refused == {"unknown_node": 1}  # a stranger right after: no second read
    assert len(reloads) == 1


async def test_node_lets_in_a_peer_registered_before_its_registry_event(node_factory):
    """A peer added to the node's Redis whose registry event the node has not seen yet (here:
    never sent) is accepted when it dials, after one registry read."""
    from bus.core import keys
    from bus.core.ids import now
    from bus.core.models import Peer

    alice = await node_factory("alice")
    peer = Peer(C.public_hex, "", "carol", created_at=now(), updated_at=now())
    async with alice.store.transaction(keys.ACTORS_DB) as tx:  # as add_peer, minus the event
        tx.hset(keys.peer(peer.id), peer.to_hash())
        tx.sadd(keys.PEERS, [peer.id])
    carol = Transport(C, lambda: {alice.node_id}, Recorder().on_frame, Recorder().on_bad_frame)
    with trio.fail_after(10):
        async with trio.open_nursery() as inner:
            inner.start_soon(carol.dial_forever, alice.node_id, alice.info.ws_url)
            await carol.wait_link(alice.node_id)
            inner.cancel_scope.cancel()


async def test_oversize_frame_closes_the_link(nursery):
    ra, rb = Recorder(), Recorder()
    ta, _ = await serve(nursery, A, {B.public_hex}, ra)
    tb = Transport(
        B,
        lambda: {A.public_hex},
        rb.on_frame,
        rb.on_bad_frame,
        TransportConfig(max_frame_bytes=4096),
    )
    port = await nursery.start(tb.serve, "127.0.0.1", 0)
    nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{port}")
    with trio.fail_after(10):
        link = await ta.wait_link(B.public_hex)
        await link.send("acks", acks=[{"ctx": 1, "key": "message:1:" + "9" * 10_000}], nacks=[])
        await link.closed.wait()
    assert tb.refused["oversize_frame"] == 1
    assert rb.frames == []


def tls_config(tmp_path, name: str, **kw) -> TransportConfig:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    fp = make_self_signed(cert, key, name)
    return TransportConfig(ssl_server=server_context(cert, key), tls_fingerprint=fp, **kw)


async def test_tls_link_binds_the_certificate(nursery, tmp_path):
    ra, rb = Recorder(), Recorder()
    ta = Transport(A, lambda: {B.public_hex}, ra.on_frame, ra.on_bad_frame)
    tb = Transport(
        B, lambda: {A.public_hex}, rb.on_frame, rb.on_bad_frame, tls_config(tmp_path, "b")
    )
    port = await nursery.start(tb.serve, "127.0.0.1", 0)
    nursery.start_soon(ta.dial_forever, B.public_hex, f"wss://127.0.0.1:{port}")
    with trio.fail_after(10):
        link = await ta.wait_link(B.public_hex)
        await link.send("acks", acks=[{"ctx": 1, "key": "message:1:2"}], nacks=[])
        await rb.got.wait()
    assert rb.frames[0][1].body["acks"][0]["key"] == "message:1:2"
    # when the certificate the dialler saw is not the one the responder binds (what a TLS
    # man-in-the-middle with its own certificate produces), the transcripts differ: refused
    rc = Recorder()
    mitm_config = replace(tls_config(tmp_path, "c"), tls_fingerprint="00" * 32)
    tc = Transport(C, lambda: {A.public_hex}, rc.on_frame, rc.on_bad_frame, mitm_config)
    port = await nursery.start(tc.serve, "127.0.0.1", 0)
    with trio.fail_after(10), pytest.raises(ConnectionClosed):
        await ta._dial_once(C.public_hex, f"wss://127.0.0.1:{port}")
    assert tc.refused == {"bad_signature": 1}
    assert tc.link(A.public_hex) is None


async def test_a_ping_that_crosses_the_listener_s_close_ends_nothing(nursery):
    """A peer's ping that arrives after the listener sent its Close (here: it refused an
    unknown node) is not answered (RFC 6455: no pong once our Close is sent), and the
    listener serves on. trio-websocket answered it in every state; wsproto refused the pong in
    LOCAL_CLOSING, and that error, out of the connection's reader task, ended the whole
    listener, and with it the node (a partition test's node died of it)."""
    rb = Recorder()
    tb, url_b = await serve(nursery, B, {A.public_hex}, rb)
    port = int(url_b.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    ws = WSConnection(ConnectionType.CLIENT)
    with trio.fail_after(10):
        await stream.send_all(ws.send(Request(host="127.0.0.1", target="/")))
        close: CloseConnection | None = None
        while close is None:
            data = await stream.receive_some(65536)
            assert data, "the listener hung up before its Close"
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):  # C is no peer of B: B closes
                    await stream.send_all(ws.send(TextMessage(hello(C).encode())))
                if isinstance(event, CloseConnection):
                    close = event
        # a masked ping frame with no payload, written raw (our wsproto is closing too), then
        # the reply to B's Close
        await stream.send_all(b"\x89\x80\x00\x00\x00\x00" + ws.send(close.response()))
        while await stream.receive_some(65536):  # B ends the connection ...
            pass
    await stream.aclose()
    assert tb.refused == {"unknown_node": 1}
    ta = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame)
    nursery.start_soon(ta.dial_forever, B.public_hex, url_b)
    with trio.fail_after(10):  # ... and still serves its peers
        await tb.wait_link(A.public_hex)
