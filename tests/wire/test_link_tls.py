"""Link encryption at the transport: TLS 1.3 only, no cleartext fallback either way, a
certificate the dialler was shown that is not the listener's is named, links say what protects
them. Real listeners and dials on loopback (node-level tests: test_link_privacy.py)."""

from __future__ import annotations

import logging
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected

from bus.core import handshake as hs
from bus.errors import HandshakeError
from bus.wire.dial import tls_hint
from bus.wire.transport import (
    NO_TLS_HINT,
    PLAINTEXT_REFUSED,
    Transport,
    TransportConfig,
)
from crypto import KeyPair
from crypto.tls import client_context, make_self_signed, server_context
from node.config import load_config
from node.errors import ConfigError
from node.host.home import init_home
from node.links.encryption import warn_legacy
from tests.wire.test_handshake import Recorder

A, B = KeyPair.generate(), KeyPair.generate()


def tls(tmp_path: Path, name: str) -> TransportConfig:
    """What the node's default gives its transport (node/links/encryption.py)."""
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    fp = make_self_signed(cert, key, name)
    return TransportConfig(
        ssl_server=server_context(cert, key), tls_fingerprint=fp, require_tls=True
    )


async def listen(nursery: trio.Nursery, key: KeyPair, config: TransportConfig) -> Transport:
    rec = Recorder()
    peer = A if key is B else B
    t = Transport(key, lambda: {peer.public_hex}, rec.on_frame, rec.on_bad_frame, config)
    t.port = await nursery.start(t.serve, "127.0.0.1", 0)  # type: ignore[attr-defined]
    return t


async def test_a_ws_address_is_dialled_over_tls_1_3(nursery, tmp_path):
    tb = await listen(nursery, B, tls(tmp_path, "b"))
    got = Recorder()
    ta = Transport(A, lambda: {B.public_hex}, got.on_frame, got.on_bad_frame,
                   tls(tmp_path, "a"))  # fmt: skip
    # an address from an older home: dialled as wss://, never in cleartext
    nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{tb.port}")
    with trio.fail_after(10):
        link = await ta.wait_link(B.public_hex)
        inbound = await tb.wait_link(A.public_hex)
    assert link.encryption.startswith("TLSv1.3 ")
    assert inbound.encryption == link.encryption
    assert ta.states.get(B.public_hex).encryption == link.encryption
    assert ta.states.get(B.public_hex).plaintext == ""
    # past the handshake, the inbound link's TLS runs on its socket, not through the
    # listener's gate (bus/wire/gate.py), and carries frames
    assert type(inbound.ws._stream.transport_stream) is trio.SocketStream
    await inbound.send("acks", acks=[{"ctx": 1, "key": "message:1:2"}], nacks=[])
    with trio.fail_after(10):
        await got.got.wait()
    assert [f.type for _, f in got.frames] == ["acks"]


async def test_a_cleartext_dialler_is_answered_426_with_the_reason(nursery, tmp_path, caplog):
    """What a node of the last version (cleartext ws:// only) meets at an encrypted node:
    a refusal it logs with the reason, and the listener logs it too; no link."""
    tb = await listen(nursery, B, tls(tmp_path, "b"))
    old = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame)
    with caplog.at_level(logging.INFO), trio.fail_after(10):
        with pytest.raises(ConnectionRejected) as e:
            await old._dial_once(B.public_hex, f"ws://127.0.0.1:{tb.port}")
    assert e.value.status_code == 426
    assert e.value.body == PLAINTEXT_REFUSED.encode()
    assert PLAINTEXT_REFUSED in str(e.value)  # what the old node's log line shows
    assert tb.refused == {"plaintext_dialler": 1}
    assert "refused before any frame: it speaks cleartext ws://" in caplog.text
    assert tb.link(A.public_hex) is None


async def test_a_tls_dialler_names_a_cleartext_listener(nursery, tmp_path, caplog):
    """An encrypted node dialling a cleartext one (the last version, or link_encryption =
    "none") says why in its log, and the cleartext listener logs it too; no fallback."""
    plain = replace(TransportConfig(), plaintext_why='link_encryption = "none" in config.toml')
    tb = await listen(nursery, B, plain)
    ta = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame,
                   tls(tmp_path, "a"))  # fmt: skip
    with caplog.at_level(logging.INFO):
        nursery.start_soon(ta.dial_forever, B.public_hex, f"ws://127.0.0.1:{tb.port}")
        with trio.fail_after(10):
            while NO_TLS_HINT not in caplog.text or not tb.refused:
                await ta.states.changed.wait()
                ta.states.snapshot()  # re-arms ``changed``
    assert tb.refused == {"tls_dialler": 1}
    assert 'it speaks TLS, and this node\'s links are not encrypted (link_encryption = "none"' in (
        caplog.text
    )
    [failed] = [
        line
        for line in caplog.text.splitlines()
        if f"link to {B.public_hex[:16]}… (wss://127.0.0.1:{tb.port}) failed" in line
    ][:1]
    assert "TLS handshake with" in failed
    assert "timed out" not in failed  # the TLS error, not trio-websocket's wait after it
    assert ta.link(B.public_hex) is None
    assert tb.link(A.public_hex) is None


async def test_tls_below_1_3_is_refused(nursery, tmp_path):
    """Forward secrecy: TLS 1.2 could agree a static key exchange; the listener will not."""
    # the refused handshake's connection is closed at the listener's deadline
    tb = await listen(nursery, B, replace(tls(tmp_path, "b"), handshake_timeout_s=2.0))

    async def handshake(context: ssl.SSLContext) -> trio.SSLStream:
        stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", tb.port, ssl_context=context)
        await stream.do_handshake()
        return stream

    with trio.fail_after(10):
        ok = await handshake(client_context())
        assert ok.version() == "TLSv1.3"
        await ok.aclose()
        old_tls = client_context()
        old_tls.minimum_version = ssl.TLSVersion.TLSv1_2
        old_tls.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(trio.BrokenResourceError) as e:
            await handshake(old_tls)
    assert isinstance(e.value.__cause__, ssl.SSLError)  # no TLS 1.2 session came up
    assert tb.link(A.public_hex) is None


async def test_a_relay_s_certificate_is_named_on_both_sides(nursery, tmp_path, caplog):
    """The dialler says which certificate it was shown; a listener that presents another
    refuses before any frame with the relay named, and tells the dialler so."""
    tb = await listen(nursery, B, tls(tmp_path, "b"))
    # what a relay terminating TLS produces: the dialler is shown another certificate than
    # the listener's (here the listener is told it presents another one)
    tb.config = replace(tb.config, tls_fingerprint="00" * 32)
    ta = Transport(A, lambda: {B.public_hex}, Recorder().on_frame, Recorder().on_bad_frame,
                   tls(tmp_path, "a"))  # fmt: skip
    with caplog.at_level(logging.INFO), trio.fail_after(10):
        with pytest.raises(ConnectionClosed) as e:
            await ta._dial_once(B.public_hex, f"wss://127.0.0.1:{tb.port}")
    assert hs.CHANNEL_MISMATCH in str(e.value.reason)
    assert tb.refused == {"bad_signature": 1}
    assert f"refused: bad_signature: {hs.CHANNEL_MISMATCH}" in caplog.text


def test_channel_check():
    hs.check_channel("ab" * 32, "ab" * 32)
    with pytest.raises(HandshakeError) as e:
        hs.check_channel("ab" * 32, "cd" * 32)
    assert e.value.reason == "bad_signature"
    assert hs.CHANNEL_MISMATCH in str(e.value)


def test_the_hint_names_a_cleartext_answer():
    err = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    err.reason = "WRONG_VERSION_NUMBER"  # type: ignore[misc]
    wrapped = trio.BrokenResourceError()
    wrapped.__cause__ = err
    assert tls_hint(wrapped) == NO_TLS_HINT
    assert tls_hint(OSError("connection refused")) == ""


def test_the_setting_and_the_legacy_tls_line(tmp_path, caplog):
    """``tls = false``, which every older init wrote, asks for nothing: it is named at start,
    not read; ``link_encryption`` takes "tls" or "none" only."""
    home = tmp_path / "h"
    init_home(home, name="h")
    text = (home / "config.toml").read_text()
    assert "link_encryption" in text
    assert "\ntls =" not in text
    (home / "config.toml").write_text(text.replace("[node]\n", "[node]\ntls = false\n", 1))
    config = load_config(home)
    assert config.link_encryption == "tls"
    assert config.legacy_settings == ("tls = false",)
    with caplog.at_level(logging.WARNING):
        warn_legacy(config)
    assert "[node] tls = false is no longer read: links are encrypted" in caplog.text
    (home / "config.toml").write_text(
        text.replace('link_encryption = "tls"', 'link_encryption = "plain"')
    )
    with pytest.raises(ConfigError, match='link_encryption is "tls"'):
        load_config(home)
