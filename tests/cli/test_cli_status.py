"""``status`` as a health check: exit 0 with every link up, 3 with a peer link down, 1 with
the node down; and per peer its link state, last seen and round-trip time."""

from __future__ import annotations

import json

import trio

from tests.cli.test_cli import cli
from tests.nodes import link_to
from tests.observe.test_dlq import hero_node
from tests.wire.test_linkstate import published_link


async def test_status_exits_3_while_a_peer_link_is_down(node_factory):
    # no job runs here: one slot each, where every slot is a process each start waits for
    alice = await node_factory("alice", runners={"python": 1})
    bob = await node_factory("bob", runners={"python": 1})
    with trio.fail_after(30):
        await link_to(alice, bob)
        await published_link(alice.store, bob.node_id, lambda s: s["rtt_ms"] >= 0)
    code, out, err = await hero_node(alice, "status")
    assert code == 0, err
    assert "link up, seen " in out
    assert " ms" in out  # the round trip
    code, out, _ = await hero_node(alice, "status", "--json")
    facts = json.loads(out)
    assert facts["health"] == {"ok": True, "problems": []}
    [peer] = facts["peers"]
    assert (peer["id"], peer["link"]) == (bob.node_id, "up")
    assert peer["rtt_ms"] >= 0
    assert peer["last_seen"] >= peer["since"] > 0

    bob.stop()
    with trio.fail_after(30):
        await published_link(alice.store, bob.node_id, lambda s: s["state"] == "down")
    code, out, _ = await hero_node(alice, "status")
    assert code == 3
    assert "link down since " in out
    assert "unhealthy: link to bob is down" in out
    code, out, _ = await hero_node(alice, "status", "--json")
    assert code == 3
    assert json.loads(out)["health"] == {"ok": False, "problems": ["link to bob is down"]}


def test_status_exits_1_when_the_node_is_down(tmp_path):
    home = tmp_path / "h"
    assert cli(home, "init").returncode == 0
    result = cli(home, "status")
    assert result.returncode == 1
    assert "the node is not running" in result.stderr
