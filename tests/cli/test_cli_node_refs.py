"""Which node ``--to b`` means (bus/core/noderefs.py): an exact name wins over an id prefix,
and a prefix needs 8 hex digits. README's two-node quick start sends ``--to b``; it failed
whenever another node's id began with ``b`` (one node in 16)."""

from __future__ import annotations

import json

import pytest

from bus.core.noderefs import MIN_ID_PREFIX, KnownNode, pick_node
from bus.errors import ClientError
from crypto import KeyPair
from tests.cli.test_cli import cli
from tests.cli.test_cli import running_node as running_node  # the fixture


def key_whose_id(starts: str, *, but_not: str = "") -> KeyPair:
    """A fresh node key whose id begins with ``starts`` (and not with ``but_not``): ids are
    random, so one hex digit takes 16 tries on average."""
    while True:
        key = KeyPair.generate()
        if key.public_hex.startswith(starts) and not (
            but_not and key.public_hex.startswith(but_not)
        ):
            return key


OWN = KnownNode("b" * 8 + "1" * 56, "a")
NAMED_B = KnownNode("c" * 64, "b")
BEGINS_B = KnownNode("b" * 8 + "2" * 56, "other")


@pytest.mark.parametrize(
    ("ref", "meant"),
    [
        ("b", NAMED_B.id),  # the name, though two ids begin with b
        ("B", None),  # names are exact: "B" is a one-digit prefix, too short
        ("self", OWN.id),
        ("local", OWN.id),
        ("a", OWN.id),  # this node's own name
        (BEGINS_B.id, BEGINS_B.id),
        (BEGINS_B.id.upper(), BEGINS_B.id),
        ("bbbbbbbb2", BEGINS_B.id),
        ("BBBBBBBB2", BEGINS_B.id),
        ("cccccccc", NAMED_B.id),
        ("ccccccc", None),  # 7 digits: too short, whatever it would match
    ],
)
def test_a_name_wins_over_a_prefix_and_a_prefix_has_eight_digits(ref, meant):
    if meant is None:
        with pytest.raises(ClientError, match=f"at least {MIN_ID_PREFIX} hex digits"):
            pick_node(ref, OWN, [NAMED_B, BEGINS_B])
    else:
        assert pick_node(ref, OWN, [NAMED_B, BEGINS_B]) == meant


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("bbbbbbbb", r"ambiguous: the id prefix matches 2 nodes \(bbbbbbbb11111111…"),
        ("twin", "ambiguous: 2 nodes are named so"),
        ("nowhere", "unknown node 'nowhere': not this node, nor a peer's name or id"),
        ("dddddddd", "no node's id begins so"),
        ("", "unknown node ''"),
    ],
)
def test_what_names_no_node_or_several_says_so(ref, why):
    peers = [BEGINS_B, KnownNode("e" * 64, "twin"), KnownNode("f" * 64, "twin")]
    with pytest.raises(ClientError, match=why):
        pick_node(ref, OWN, peers)


async def test_resolve_node_on_a_node_whose_peers_ids_collide_with_a_name(node_factory):
    """On a real node: a peer named ``b``, and another whose id begins with ``b`` (as this
    node's own may)."""
    node = await node_factory("a")
    named_b = key_whose_id("", but_not="b")
    begins_b = key_whose_id("b")
    await node.client.add_peer(named_b.public_hex, "ws://127.0.0.1:9", name="b")
    await node.client.add_peer(begins_b.public_hex, "ws://127.0.0.1:9", name="other")
    assert await node.client.resolve_node("b") == named_b.public_hex
    assert await node.client.resolve_node("a") == node.node_id
    assert await node.client.resolve_node(begins_b.public_hex[:8]) == begins_b.public_hex
    with pytest.raises(ClientError, match="at least 8 hex digits"):
        await node.client.resolve_node(begins_b.public_hex[:7])


def test_job_submit_to_b_goes_to_the_peer_named_b(running_node):
    """README's ``job submit --to b``, through the CLI and a running node, with another peer's
    id beginning with ``b``: the message is addressed to the peer named b."""
    home, _ = running_node
    named_b = key_whose_id("", but_not="b")
    begins_b = key_whose_id("b")
    for key, name in ((begins_b, "other"), (named_b, "b")):
        added = cli(home, "peer", "add", key.public_hex, "ws://127.0.0.1:9", "--name", name)
        assert added.returncode == 0, added.stderr
    sent = cli(home, "job", "submit", "--to", "b", "--type", "sh", "--script", "true")
    assert sent.returncode == 0, sent.stderr
    job = cli(home, "job", "show", sent.stdout.strip(), "--json")
    assert job.returncode == 0, job.stderr
    message = cli(home, "job", "show", json.loads(job.stdout)["message_key"], "--json")
    assert message.returncode == 0, message.stderr
    assert json.loads(message.stdout)["destination"] == named_b.public_hex
    short = cli(home, "job", "submit", "--to", begins_b.public_hex[:4], "--script", "true")
    assert short.returncode == 1
    assert "an id prefix needs at least 8 hex digits" in short.stderr
