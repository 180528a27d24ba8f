"""What a path observer sees of a link between two real nodes: sizes and timing, never content.

A recording relay between two nodes carries a cross-node job whose script, environment value
and output are canaries; encrypted (the default) it finds none of them, with the explicit
cleartext setting it finds all three (so the test can fail). A relay that terminates TLS with a
certificate of its own is refused before any frame, named in both nodes' logs. A node of the
last version (cleartext ws:// only: what ``link_encryption = "none"`` speaks on the wire) and
an encrypted one refuse each other with the reason on both sides; a ``ws://`` peer address in a
home is rewritten at start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import ssl
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage
from wsproto.utilities import RemoteProtocolError

from bus.core import handshake as hs
from bus.core.models import JobStatus
from bus.store import records
from bus.wire.transport import NO_TLS_HINT, PLAINTEXT_REFUSED, Transport
from crypto import KeyPair, read_key_file
from crypto.tls import client_context, make_self_signed, server_context
from node.links.encryption import PLAINTEXT_WHY
from tests.console_http import next_state
from tests.faults_proxy import TcpProxy
from tests.nodes import link_to, until
from tests.observe.test_dlq import hero_node
from tests.observe.test_metrics import SERVED, scrape, value
from tests.wire.test_linkstate import published_link


def port_of(node) -> int:  # noqa: ANN001 - conftest.RunningNode
    port = urlsplit(node.info.ws_url).port
    assert port is not None
    return port


def transport_of(node) -> Transport:  # noqa: ANN001 - conftest.RunningNode
    transport = node.info.state.peers.transport
    assert transport is not None
    return transport


async def wire(origin, dest, address: str) -> KeyPair:  # noqa: ANN001 - conftest.RunningNode
    """As tests/nodes.py ``link_to``, but ``origin`` dials ``dest`` at ``address``."""
    actor = read_key_file(origin.config.actor_key_path)
    await origin.client.add_peer(dest.node_id, address, name=dest.config.name)
    await dest.client.add_peer(origin.node_id, "", name=origin.config.name)
    await dest.client.register_actor(origin.config.actor_id, actor.public_hex)
    await dest.client.register_context(1, admins=[2], executors=[origin.config.actor_id])
    return actor


def observed(relay: TcpProxy) -> bytes:
    """What a path observer reads: the bytes as they crossed, and, where they are a cleartext
    websocket, its messages (a dialler's frames are masked, which hides nothing: the key is in
    each frame; any websocket decoder reads them)."""
    to_target, to_client = bytes(relay.to_target or b""), bytes(relay.to_client or b"")
    seen = bytearray(to_target + to_client)
    head, _, frames = to_target.partition(b"\r\n\r\n")
    listener = WSConnection(ConnectionType.SERVER)
    try:
        listener.receive_data(head + b"\r\n\r\n")
        if any(isinstance(event, Request) for event in listener.events()):
            listener.send(AcceptConnection())
            listener.receive_data(frames)  # (wsproto drops what follows the head it parsed)
            seen += b"".join(
                e.data.encode() for e in listener.events() if isinstance(e, TextMessage)
            )
    except RemoteProtocolError:
        pass  # not a cleartext websocket
    return bytes(seen)


class Canaries:
    def __init__(self) -> None:
        tag = secrets.token_hex(8)
        self.script = f"script-canary-{tag}"
        self.env = f"env-canary-{tag}"
        self.output = f"output-canary-{tag}"

    @property
    def code(self) -> str:
        """Prints the output canary (never written out in the script) and a digest of the
        environment value (which the script does not hold either)."""
        return (
            f"# {self.script}\nimport hashlib, os\n"
            f"print({self.output[::-1]!r}[::-1])\n"
            "print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest())\n"
        )

    def found_in(self, data: bytes) -> set[str]:
        return {c for c in (self.script, self.env, self.output) if c.encode() in data}


@pytest.mark.parametrize("encryption", ["tls", "none"])
async def test_a_recording_relay_reads_no_job_content(node_factory, nursery, encryption):
    alice = await node_factory("alice", link_encryption=encryption)
    bob = await node_factory("bob", link_encryption=encryption)
    relay = TcpProxy(port_of(bob), record=True)
    await nursery.start(relay.run)
    scheme = urlsplit(bob.info.ws_url).scheme  # what bob serves
    actor = await wire(alice, bob, f"{scheme}://127.0.0.1:{relay.port}")
    canaries = Canaries()
    with trio.fail_after(40):
        msg = await alice.client.submit_job(
            actor,
            1,
            to=bob.node_id,
            context_id=1,
            script_type="python",
            script=canaries.code,
            env_vars={"API_TOKEN": canaries.env},
        )
        [result] = await alice.client.wait_results(msg, timeout_s=35)
    assert result.status is JobStatus.FINISHED, result
    digest = hashlib.sha256(canaries.env.encode()).hexdigest()
    assert result.stdout == f"{canaries.output}\n{digest}\n"  # all three crossed the relay
    recorded = observed(relay)
    state = transport_of(alice).states.get(bob.node_id)
    if encryption == "tls":
        assert canaries.found_in(recorded) == set()
        assert b'"t":"msgs"' not in recorded
        assert b'"t":"hello"' not in recorded
        assert len(relay.to_target or b"") > len(canaries.code)  # the job did cross
        assert state.encryption.startswith("TLSv1.3 ")
    else:  # the negative control: the same relay reads everything
        assert canaries.found_in(recorded) == {canaries.script, canaries.env, canaries.output}
        assert state.encryption == ""
        assert state.plaintext == PLAINTEXT_WHY


class TlsRelay:
    """A man in the middle: it terminates the dialler's TLS with a certificate of its own,
    dials the target over TLS, and forwards (and records) the cleartext both ways."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self.target_port = target_port
        self.context = server_context(cert, key)
        self.cleartext = bytearray()
        self.connections = 0

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_listeners, handler_nursery=nursery),
                                self._relay, listeners)  # fmt: skip
            task_status.started(listeners[0].socket.getsockname()[1])

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        dialler = trio.SSLStream(client, self.context, server_side=True)
        try:
            upstream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", self.target_port, ssl_context=client_context()
            )
        except OSError:
            await dialler.aclose()
            return
        async with dialler, upstream, trio.open_nursery() as nursery:
            for src, dst in ((dialler, upstream), (upstream, dialler)):
                nursery.start_soon(self._pump, src, dst, nursery.cancel_scope)

    async def _pump(self, src: trio.SSLStream, dst: trio.SSLStream, both: trio.CancelScope) -> None:
        try:
            async for chunk in src:
                self.cleartext += chunk
                await dst.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


async def test_a_relay_terminating_tls_is_refused_before_any_frame(
    node_factory, nursery, tmp_path, caplog
):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    cert, key = tmp_path / "mitm.crt", tmp_path / "mitm.key"
    make_self_signed(cert, key, "mitm")
    relay = TlsRelay(port_of(bob), cert, key)
    port = await nursery.start(relay.run)
    canaries = Canaries()
    with caplog.at_level(logging.INFO):
        actor = await wire(alice, bob, f"wss://127.0.0.1:{port}")
        await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script=canaries.code
        )
        refused = f"refused: bad_signature: {hs.CHANNEL_MISMATCH}"
        dial_failed = f"link to {bob.node_id[:16]}… (wss://127.0.0.1:{port}) failed"

        def both_logged() -> bool:
            lines = caplog.text.splitlines()
            return any("inbound handshake" in s and refused in s for s in lines) and any(
                dial_failed in s and hs.CHANNEL_MISMATCH in s for s in lines
            )

        assert await until(both_logged, 20), caplog.text[-3000:]
    # the relay relayed the handshake in cleartext, and never a data frame nor the job
    assert b'"t":"hello"' in relay.cleartext
    assert b'"t":"msgs"' not in relay.cleartext
    assert canaries.found_in(bytes(relay.cleartext)) == set()
    assert transport_of(alice).link(bob.node_id) is None
    assert transport_of(bob).link(alice.node_id) is None
    assert "link up" not in caplog.text


async def test_an_old_cleartext_node_and_an_encrypted_one_refuse_each_other(node_factory, caplog):
    """A node of the last version listens and dials cleartext ws:// only, as a node with
    ``link_encryption = "none"`` does on the wire (same protocol version, same frames). Each
    dials the other at the ws:// address an old home holds; both sides log why, no link."""
    new = await node_factory("new")
    old = await node_factory("old", link_encryption="none")
    with caplog.at_level(logging.INFO):
        await new.client.add_peer(old.node_id, f"ws://127.0.0.1:{port_of(old)}", name="old")
        await old.client.add_peer(new.node_id, f"ws://127.0.0.1:{port_of(new)}", name="new")

        def all_four() -> bool:
            text = caplog.text
            return all(
                said in text
                for said in (
                    NO_TLS_HINT,  # the new dialler names the cleartext listener
                    "it speaks TLS, and this node's links are not encrypted",  # old listener
                    PLAINTEXT_REFUSED,  # the old dialler logs the 426's body
                    "it speaks cleartext ws://",  # the new listener
                )
            )

        assert await until(all_four, 20), caplog.text[-3000:]
    assert transport_of(new).refused.get("plaintext_dialler", 0) >= 1
    assert transport_of(old).refused.get("tls_dialler", 0) >= 1
    assert transport_of(new).link(old.node_id) is None
    assert transport_of(old).link(new.node_id) is None


async def test_a_ws_peer_address_is_rewritten_at_start(node_factory, caplog):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    old_address = f"ws://127.0.0.1:{port_of(bob)}"
    await wire(alice, bob, old_address)  # as a home of the last version holds it
    with trio.fail_after(20):
        link = await transport_of(alice).wait_link(bob.node_id)  # dialled as wss:// already
    assert link.encryption.startswith("TLSv1.3 ")
    await alice.stopped()
    with caplog.at_level(logging.WARNING):
        alice = await node_factory("alice", again=alice)
    assert f"address {old_address} rewritten to wss://127.0.0.1:{port_of(bob)}" in caplog.text
    stored = await records.read_peer(alice.store, bob.node_id)
    assert stored["address"] == f"wss://127.0.0.1:{port_of(bob)}"
    with trio.fail_after(20):
        link = await transport_of(alice).wait_link(bob.node_id)
    assert link.encryption.startswith("TLSv1.3 ")


def test_client_context_is_tls_1_3_only():
    assert client_context().minimum_version is ssl.TLSVersion.TLSv1_3


@pytest.mark.parametrize("encryption", ["tls", "none"])
async def test_status_metrics_and_console_say_what_protects_each_link(node_factory, encryption):
    alice = await node_factory("alice", link_encryption=encryption, console=SERVED)
    bob = await node_factory("bob", link_encryption=encryption)
    with trio.fail_after(30):
        await link_to(alice, bob)
        await published_link(alice.store, bob.node_id, lambda s: s["state"] == "up")
    code, out, err = await hero_node(alice, "status")
    assert code == 0, err
    code, raw, _ = await hero_node(alice, "status", "--json")
    facts = json.loads(raw)
    [peer] = facts["peers"]
    samples, _ = await scrape(alice)
    with trio.fail_after(30):
        state = await next_state(
            alice.info.console_url + "/api/events",
            lambda s: [p["link"] for p in s["peers"]] == ["up"],
        )
    [shown] = state["peers"]
    if encryption == "tls":
        assert "NOT ENCRYPTED" not in out
        assert ", TLSv1.3 " in out
        assert peer["encryption"].startswith("TLSv1.3 ")
        assert peer["plaintext"] == ""
        assert facts["node"]["link_encryption"] == "tls"
        assert value(samples, "hero_link_encrypted", peer=bob.node_id, name="bob", why="") == 1
        assert shown["encryption"] == peer["encryption"]
    else:
        assert f"links NOT ENCRYPTED ({PLAINTEXT_WHY})" in out
        assert f"NOT ENCRYPTED ({PLAINTEXT_WHY})" in out.split("peer bob", 1)[1]
        assert (peer["encryption"], peer["plaintext"]) == ("", PLAINTEXT_WHY)
        assert facts["node"]["link_encryption_why"] == PLAINTEXT_WHY
        labels = {"peer": bob.node_id, "name": "bob", "why": PLAINTEXT_WHY}
        assert tuple(sorted(labels.items())) in samples["hero_link_encrypted"]
        assert value(samples, "hero_link_encrypted", **labels) == 0
        assert (shown["encryption"], shown["plaintext"]) == ("", PLAINTEXT_WHY)
