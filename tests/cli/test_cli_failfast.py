"""Fail fast: what the node would refuse, or cannot deliver soon, is said at once; a refusal
reaches the waiting client at once, and ``msg status`` shows it with its reason."""

from __future__ import annotations

import json
import socket

import trio

from crypto import KeyPair, read_key_file
from tests.cli.test_cli import cli, running_node  # noqa: F401 (fixture)
from tests.observe.test_dlq import hero_node

# the node_factory nodes below run no job (each is refused): one slot, where every slot is a
# process each start waits for
ONE_SLOT = {"python": 1}


async def test_a_message_the_node_cannot_parse_is_answered_at_once(node_factory):
    alice = await node_factory("alice", runners=ONE_SLOT)
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit_job(
        actor,
        1,
        to=alice.node_id,
        context_id=1,
        script_type="python",
        script="print(1)",
        timeout_s=-1,
    )
    with trio.fail_after(15):  # no result message can answer it: the refusal path does
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.job_key == msg.job[0].key
    assert not result.ok
    assert result.reason.startswith("malformed: ")
    assert "negative" in result.reason
    code, out, err = await hero_node(alice, "msg", "status", msg.key, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["key"] == msg.key
    assert report["state"] == "failed"
    assert report["reason"] == "malformed"
    assert "negative" in report["detail"]
    assert isinstance(report["created_at"], int)


async def test_a_refused_signer_reaches_the_waiting_client(node_factory):
    alice = await node_factory("alice", runners=ONE_SLOT)
    stranger = KeyPair.generate()
    msg = await alice.client.submit_job(
        stranger, 77, to=alice.node_id, context_id=1, script_type="python", script="print(1)"
    )
    with trio.fail_after(15):
        [result] = await alice.client.wait_results(msg, timeout_s=15)
    assert result.reason.startswith("unknown_signer")
    code, out, _ = await hero_node(alice, "msg", "status", msg.key)
    assert code == 0
    assert f"{msg.key}: failed" in out
    assert "unknown_signer" in out


def test_a_context_this_node_does_not_serve_is_refused_before_sending(running_node):  # noqa: F811
    home, _node = running_node
    result = cli(home, "job", "submit", "--context", "5", "--script", "print(1)", "--wait")
    assert result.returncode == 1
    assert "this node serves no context 5 (it serves: 1)" in result.stderr
    assert "hero-node context add 5" in result.stderr
    assert "waiting for" not in result.stderr  # nothing was sent, nothing is waited for
    assert "Traceback" not in result.stderr


def test_a_timeout_the_node_would_refuse_is_a_usage_error(tmp_path):
    for value in ("-1", "0"):
        result = cli(tmp_path / "none", "job", "submit", "--timeout", value, "--script", "1")
        assert result.returncode == 2
        assert "--timeout: must be above 0" in result.stderr


def test_a_job_for_a_peer_that_is_down_says_where_it_waits(running_node):  # noqa: F811
    home, _node = running_node
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ghost = KeyPair.generate().public_hex
    added = cli(home, "peer", "add", ghost, f"ws://127.0.0.1:{port}", "--name", "ghost")
    assert added.returncode == 0, added.stderr
    result = cli(home, "job", "submit", "--to", "ghost", "--script", "print(1)")
    assert result.returncode == 0, result.stderr
    job_key = result.stdout.strip()
    assert job_key.startswith("job:1:")
    assert f"{job_key}: queued for peer ghost: " in result.stderr
    assert "hero-node msg status message:1:" in result.stderr


def test_a_type_without_runners_or_an_oversize_script_is_refused_before_sending(
    running_node,  # noqa: F811
    tmp_path,
):
    home, _node = running_node
    result = cli(home, "job", "submit", "--type", "rust", "--script", "fn main() {}", "--wait")
    assert result.returncode == 1
    assert "this node runs no 'rust' jobs (its types: python, sh; --type)" in result.stderr
    big = tmp_path / "big.py"
    big.write_text("#" * (1024 * 1024 + 1))
    result = cli(home, "job", "submit", "--file", str(big), "--wait")
    assert result.returncode == 1
    assert "the script has 1048577 bytes; this node accepts at most 1048576" in result.stderr
    assert "waiting for" not in result.stderr
