"""Dead-letter bounds and the on_dead_letter hook (node/observe/dlq.py), on real nodes."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import trio

from bus.core import keys
from bus.store.atomic import queues
from crypto import KeyPair
from node.config import load_config
from node.errors import ConfigError
from node.host.home import init_home
from node.observe.dlq import archive_path, hook_input, run_hook
from tests.scripts import announcing, wait_announced

NEWCOMER = 9


def hook_script(tmp_path, redis_url: str, *, then: str = "") -> str:
    """An on_dead_letter command: appends its stdin to ``hooked.jsonl``, announces its pid on
    the list ``hooked`` (DB 1), then runs ``then``."""
    log = tmp_path / "hooked.jsonl"
    script = tmp_path / "hook.py"
    script.write_text(
        "import pathlib, sys\n"
        f"pathlib.Path({str(log)!r}).open('a').write(sys.stdin.read() + '\\n')\n"
        + announcing(redis_url, "hooked", then)
    )
    return f"{sys.executable} {script}"


async def refused(node, n: int) -> list[str]:
    """``n`` messages of an actor without permission: ``n`` dead letters (permission_denied),
    their keys in order."""
    newcomer = KeyPair.generate()
    await node.client.register_actor(NEWCOMER, newcomer.public_hex)
    out = []
    for _ in range(n):
        msg = await node.client.submit_job(
            newcomer, NEWCOMER, to=node.node_id, context_id=1, script_type="sh", script="true"
        )
        with trio.fail_after(20):
            [result] = await node.client.wait_results(msg, timeout_s=20)
        assert result.reason.startswith("permission_denied")
        out.append(msg.key)
    return out


async def test_dlq_bound_archive_and_hook(node_factory, valkey_factory, tmp_path):
    server = valkey_factory()  # where the hook announces itself
    hook = hook_script(tmp_path, server.url)
    # context 1's own bound (DB 0 keeps the node's dlq_max_len)
    alice = await node_factory("alice", dlq_limits={"1": 3}, on_dead_letter=hook)
    state = alice.info.state
    assert state is not None
    letters = await refused(alice, 6)
    async with _store(server.url) as announced:
        for _ in letters:  # each hook starts once the previous entry was handled
            await wait_announced(announced, "hooked", sandboxed=False)
    # the dlq holds the 3 newest; the 3 oldest are in the archive, oldest first, and counted
    assert [e["key"] for e in await alice.store.dead_letters(1)] == letters[:2:-1]
    archive = archive_path(alice.config.archive_dir, 1).read_text().splitlines()
    assert [json.loads(line)["key"] for line in archive] == letters[:3]
    assert all(json.loads(line)["reason"] == "permission_denied" for line in archive)
    assert state.counters.metrics["dlq_archived"] == 3
    # the hook saw every entry once, in order, as JSON with its db
    seen = [json.loads(line) for line in (tmp_path / "hooked.jsonl").read_text().splitlines()]
    assert [(s["key"], s["reason"], s["db"]) for s in seen] == [
        (key, "permission_denied", 1) for key in letters
    ]
    assert state.counters.metrics["dlq_hook_ok"] >= 5


async def test_a_slow_or_failing_hook_is_bounded_logged_and_the_node_goes_on(
    node_factory, valkey_factory, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="node.observe.dlq")
    server = valkey_factory()
    hook = hook_script(tmp_path, server.url, then="import time; time.sleep(60)")
    alice = await node_factory("alice", on_dead_letter=hook, on_dead_letter_timeout_s=1.0)
    state = alice.info.state
    assert state is not None
    letters = await refused(alice, 2)
    async with _store(server.url) as announced:
        first = await wait_announced(announced, "hooked", sandboxed=False)
        await wait_announced(
            announced, "hooked", sandboxed=False
        )  # runs only once the first one was ended
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
    assert "on_dead_letter hook (db 1): killed after 1 s" in caplog.text
    assert [e["key"] for e in await alice.store.dead_letters(1)] == letters[::-1]
    msg = await alice.client.submit_job(
        KeyPair.generate(), 1, to=alice.node_id, context_id=1, script_type="sh", script="true"
    )
    assert msg.key  # the node still takes work
    assert state.counters.metrics["dlq_hook_failed"] >= 1


async def test_a_failing_hook_is_logged_and_counted(node_factory, valkey_factory, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="node.observe.dlq")
    server = valkey_factory()
    then = "sys.stderr.write('broken pipe dream'); sys.exit(3)"
    alice = await node_factory("alice", on_dead_letter=hook_script(tmp_path, server.url, then=then))
    state = alice.info.state
    assert state is not None
    await refused(alice, 2)
    async with _store(server.url) as announced:
        await wait_announced(announced, "hooked", sandboxed=False)
        await wait_announced(announced, "hooked", sandboxed=False)
    assert "on_dead_letter hook (db 1): exit code 3: broken pipe dream" in caplog.text
    assert state.counters.metrics["dlq_hook_failed"] >= 1


async def test_a_hook_that_cannot_start_is_logged(node_factory, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="node.observe.dlq")
    missing = tmp_path / "no-such-hook"
    alice = await node_factory("alice", on_dead_letter=str(missing))
    state = alice.info.state
    assert state is not None
    assert not await run_hook(state, 1, '{"key": "message:1:2"}')
    assert "on_dead_letter hook (db 1): cannot start: " in caplog.text
    assert str(missing) in caplog.text
    assert state.counters.metrics["dlq_hook_failed"] == 1


async def test_trim_keeps_entries_retried_meanwhile(store):
    for n in range(4):
        await store.dead_letter(1, f"message:1:{n}", "expired")
    oldest = list(reversed(await store.lrange(1, keys.DLQ)))[:3]
    await store.purge_dead_letters(1, "message:1:1")  # gone since it was read
    assert await queues.trim_dead(store, 1, oldest) == 1  # stops at the first mismatch
    assert [e["key"] for e in await store.dead_letters(1)] == ["message:1:3", "message:1:2"]
    assert await store.llen(1, keys.DLQ_EVENTS) == 4  # every dead letter is also an event


async def test_a_hook_with_bad_quoting_is_logged(node_factory, caplog):
    caplog.set_level(logging.WARNING, logger="node.observe.dlq")
    alice = await node_factory("alice", on_dead_letter="notify 'unbalanced")
    state = alice.info.state
    assert state is not None
    assert not await run_hook(state, 1, '{"key": "message:1:2"}')
    assert "cannot start: No closing quotation" in caplog.text


@pytest.mark.parametrize("table", ['"x" = 3', '"2" = -1', '"2" = "3"'])
def test_config_refuses_a_bad_dlq_limit(tmp_path, table):
    config = init_home(tmp_path / "h")
    text = config.config_path.read_text().replace("[dlq_limits]\n", f"[dlq_limits]\n{table}\n")
    config.config_path.write_text(text)
    with pytest.raises(ConfigError, match=r"\[dlq_limits\]"):
        load_config(config.home)


def test_config_bounds_each_context(tmp_path):
    config = init_home(tmp_path / "h")
    text = config.config_path.read_text().replace("[dlq_limits]\n", '[dlq_limits]\n"2" = 5\n')
    config.config_path.write_text(text)
    loaded = load_config(config.home)
    assert (loaded.dlq_limit(2), loaded.dlq_limit(1), loaded.dlq_limit(0)) == (5, 10_000, 10_000)


def test_hook_input_names_the_db_even_for_an_entry_that_is_no_json():
    assert json.loads(hook_input('{"key": "k", "reason": "expired"}', 3)) == {
        "key": "k",
        "reason": "expired",
        "db": 3,
    }
    assert json.loads(hook_input("not json", 0)) == {"entry": "not json", "db": 0}


def _store(url: str):
    from bus.store.connection import open_store

    return open_store(url)


async def test_hostile_dlq_events_cost_the_watcher_nothing(node_factory, valkey_factory, tmp_path):
    server = valkey_factory()
    alice = await node_factory("alice", on_dead_letter=hook_script(tmp_path, server.url))
    huge = "x" * 300_000
    await alice.store.call(
        1, lambda r: r.lpush(keys.DLQ_EVENTS, ["not json", "[1, 2]", huge, b"\xff\xfe"])
    )
    [key] = await refused(alice, 1)
    async with _store(server.url) as announced:
        # three of the four (the one that is no UTF-8 is dead-lettered as not_utf8 instead: that
        # letter is the fourth), and the real one
        for _ in range(5):
            await wait_announced(announced, "hooked", sandboxed=False)
    seen = [json.loads(line) for line in (tmp_path / "hooked.jsonl").read_text().splitlines()]
    assert {"entry": "not json", "db": 1} in seen
    assert {"entry": "[1, 2]", "db": 1} in seen
    assert {"entry": huge, "db": 1} in seen
    assert any(s.get("reason") == "not_utf8" for s in seen)
    assert key in [s.get("key") for s in seen]
