"""Node links over IPv6 (what a Mycelium overlay address needs): listening on ``::1``,
dialling ``ws://[::1]:port``, and link URLs checked where a peer is added."""

from __future__ import annotations

import socket

import pytest
import trio

from bus.core.urls import bare_host, check_link_url, link_url
from bus.errors import ClientError
from tests.nodes import link_to


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(
    not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1) to bind to"
)


def test_link_urls_put_ipv6_hosts_in_brackets():
    assert link_url("ws", "::1", 7700) == "ws://[::1]:7700"
    assert link_url("wss", "[2001:db8::7]", 9651) == "wss://[2001:db8::7]:9651"
    assert link_url("ws", "127.0.0.1", 7700) == "ws://127.0.0.1:7700"
    assert bare_host("[::1]") == "::1"
    assert bare_host("::") == "::"


@pytest.mark.parametrize(
    "address", ["", "ws://[::1]:7700", "wss://[2001:db8::1]:9651", "ws://10.0.0.2:7700"]
)
def test_dialable_link_urls_pass(address):
    assert check_link_url(address) == address


@pytest.mark.parametrize(
    ("address", "hint"),
    [
        ("ws://::1:7700", "brackets"),
        ("http://[::1]:7700", "ws://host:port"),
        ("ws://", "ws://host:port"),
        ("[::1]:7700", "ws://host:port"),
    ],
)
def test_undialable_link_urls_are_refused_with_the_form_to_use(address, hint):
    with pytest.raises(ValueError, match=hint):
        check_link_url(address)


@needs_ipv6
async def test_two_nodes_link_and_run_a_job_over_ipv6(node_factory):
    alice = await node_factory("alice", listen_host="::1")
    bob = await node_factory("bob", listen_host="[::1]")
    assert bob.info.ws_url.startswith("wss://[::1]:")
    with pytest.raises(ClientError, match="brackets"):
        await alice.client.add_peer(bob.node_id, bob.info.ws_url.replace("[::1]", "::1"))
    actor = await link_to(alice, bob)
    with trio.fail_after(30):
        message = await alice.client.submit_job(
            actor, 1, to="bob", context_id=1, script_type="sh", script="echo over v6"
        )
        [result] = await alice.client.wait_results(message, timeout_s=25)
    assert result.ok, result
    assert result.stdout == "over v6\n"
    assert (await bob.store.hgetall(1, result.job_key))["status"] == "finished"
