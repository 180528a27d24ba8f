"""The node keeps room for itself (issue 46): with the free space of its home's file system
under its headroom it takes no new jobs (they wait, nothing is lost), says so in status,
/metrics and the log, and takes them again once space is back. The file system is a 64 MiB
tmpfs mounted for the test (root only) as the node's home."""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from bus.core import keys
from bus.core.deadlines import RECEIVED_FROM
from bus.store import records
from bus.store.serve import pop_entries
from crypto import KeyPair, read_key_file
from node.cli.status import status, status_facts
from node.config import NodeConfig, load_config
from node.errors import ConfigError
from node.intake import supervisor
from node.intake.consumer import msg_in_queue
from node.intake.pressure import DISK, HELD_FIELD, STORE_MEMORY, run_pressure_watch
from node.observe.metrics import exposition
from node.state import Inbound, IntakeHold, NodeState
from tests.nodes import until_read

MB = 1024 * 1024
HEADROOM_MB = 16


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs where node_factory puts node "alice"'s home; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmp_path / "alice"
    home.mkdir()
    size = ["-o", "size=64m,mode=0755"]
    subprocess.run(["mount", "-t", "tmpfs", *size, "tmpfs", str(home)], check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


async def held_for(hold: IntakeHold, cause: str, held: bool) -> None:
    while (cause in hold.held) != held:
        await hold.wait_changed()


def fill(home: Path, leave_mb: int) -> Path:
    """A file that leaves ``leave_mb`` MiB free on ``home``'s file system."""
    st = os.statvfs(home)
    filler = home / "filler"
    with filler.open("wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - leave_mb * MB))
    return filler


async def test_jobs_wait_while_the_disk_lacks_headroom_and_run_once_space_is_back(
    node_factory, small_home, capsys
):
    alice = await node_factory(
        "alice", disk_headroom_mb=HEADROOM_MB, pressure_check_s=0.2, runners={"python": 1}
    )
    state = alice.info.state
    assert state is not None
    hold = state.pressure.hold
    actor = read_key_file(alice.config.actor_key_path)
    filler = fill(small_home, HEADROOM_MB // 2)
    with trio.fail_after(20):
        await held_for(hold, DISK, True)
    messages = [
        await alice.client.submit_job(
            actor, 1, to=alice.node_id, context_id=1, script_type="python", script=f"print({i})"
        )
        for i in range(3)
    ]

    async def waiting_in_flight() -> bool:  # the supervisor took a batch, and holds it there
        inflight = keys.inflight(supervisor.SERVICE)
        out, taken = await records.depths(alice.store, 1, [keys.MSG_OUT, inflight])
        return taken > 0 and out + taken == len(messages)

    assert await until_read(waiting_in_flight, 20)
    assert [await alice.store.hgetall(1, m.job[0].key) for m in messages] == [{}] * 3
    facts = await status_facts(alice.client)
    assert "MiB free" in facts["node"][HELD_FIELD]
    await status(alice.client, argparse.Namespace(json=False, home=alice.config.home))
    assert "intake HELD, new jobs wait" in capsys.readouterr().out
    metrics, _ = await exposition(state)
    assert b'hero_intake_held{cause="disk"} 1.0' in metrics

    filler.unlink()
    with trio.fail_after(30):
        await held_for(hold, DISK, False)
        results = [(await alice.client.wait_results(m, timeout_s=30))[0] for m in messages]
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    metrics, _ = await exposition(state)
    assert b'hero_intake_held{cause="disk"} 0.0' in metrics


async def test_jobs_wait_while_the_store_is_near_its_maxmemory(node_factory):
    """The embedded Valkey runs with a maxmemory (noeviction); with its use past the mark
    (here: a headroom of 99% of 64 MiB, which a fresh Valkey is past already) the node takes
    no new jobs; with room again (the operator raised maxmemory) they run, nothing lost."""
    alice = await node_factory(
        "alice",
        embedded=True,
        runners={"python": 1},
        store_max_memory_mb=64,
        store_headroom_pct=99,
        pressure_check_s=0.2,
    )
    state = alice.info.state
    assert state is not None
    config = await alice.store.call(0, lambda r: r.config_get(["maxmemory*"]))
    assert config["maxmemory"] == str(64 * MB)
    assert config["maxmemory-policy"] == "noeviction"
    with trio.fail_after(20):
        await held_for(state.pressure.hold, STORE_MEMORY, True)
    actor = read_key_file(alice.config.actor_key_path)
    message = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script="print('late')"
    )

    async def waiting_in_flight() -> bool:
        return await alice.store.llen(1, keys.inflight(supervisor.SERVICE)) == 1

    assert await until_read(waiting_in_flight, 20)
    assert await alice.store.hgetall(1, message.job[0].key) == {}
    await alice.store.call(0, lambda r: r.config_set({"maxmemory": str(1024 * MB)}))
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(message, timeout_s=30)
    assert result.stdout == "late\n"


async def test_the_watcher_holds_at_its_first_look_and_resumes_within_one_check(
    store, tmp_path, mock_clock
):
    """The watcher's timing on trio's clock (autojumping once real Valkey I/O is idle): it
    reports started after its first look, already holding; space back, intake resumes at its
    next look, no later than ``pressure_check_s``; node:info says so each time."""
    mock_clock.autojump_threshold = 0.1
    config = NodeConfig(home=tmp_path, disk_headroom_mb=HEADROOM_MB, pressure_check_s=30.0)
    node = NodeState(config, KeyPair.generate(), store)
    free = {"mb": HEADROOM_MB - 1}

    def measure_disk(paths: list[Path]) -> dict[Path, int]:
        return {p: free["mb"] * MB for p in paths}

    async def no_bound() -> tuple[int, int]:
        return 0, 0

    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(run_pressure_watch, node, measure_disk=measure_disk, measure_memory=no_bound)
        )
        assert DISK in node.pressure.hold.held
        assert "under the headroom of 16 MiB" in (await records.node_info(store))[HELD_FIELD]
        free["mb"] = HEADROOM_MB
        since = trio.current_time()
        with trio.fail_after(2 * config.pressure_check_s):
            await node.pressure.hold.wait_open()
        assert 0 < trio.current_time() - since <= config.pressure_check_s
        assert (await records.node_info(store))[HELD_FIELD] == ""
        assert node.counters.metrics["intake_held_disk"] == 1
        nursery.cancel_scope.cancel()


async def test_a_peer_link_waits_for_room_until_the_consumer_takes_its_messages():
    """The per-peer bound of msg_in (node.state.Inbound): a link waits while its peer has
    ``limit`` messages waiting, and goes on when the consumer takes one; other peers do not
    wait for it."""
    inbound = Inbound()
    inbound.delivered("bob", 3)
    done: list[str] = []

    async def link(peer: str) -> None:
        await inbound.wait_room(peer, 3)
        done.append(peer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link, "bob")
        nursery.start_soon(link, "carol")
        await trio.testing.wait_all_tasks_blocked()
        assert done == ["carol"]
        inbound.taken(["", "carol"])  # not bob's: bob still waits
        await trio.testing.wait_all_tasks_blocked()
        assert done == ["carol"]
        inbound.taken(["bob"])
    assert done == ["carol", "bob"]


async def test_the_consumers_pop_counts_what_it_takes_off_msg_in_at_once(store, tmp_path):
    """A peer's messages stop waiting in ``msg_in`` when the consumer's pop moves them off it,
    all of the pop's at once, before the consumer judges any: its link may deliver more."""
    node = NodeState(NodeConfig(home=tmp_path), KeyPair.generate(), store)
    inbound = node.pressure.inbound
    inbound.delivered("bob", 2)
    for key, peer in [("message:1", "bob"), ("message:2", ""), ("message:3", "bob")]:
        await store.hset(1, key, {RECEIVED_FROM: peer} if peer else {"n": "1"})
        await store.lpush(1, keys.MSG_IN, key)
    with trio.fail_after(10):
        popped, _ = await pop_entries(store, msg_in_queue(node, 1))
    assert [p.value for p in popped] == ["message:1", "message:2", "message:3"]
    assert inbound.waiting == {"bob": 0}


def test_a_headroom_of_the_whole_store_is_refused_at_load(tmp_path):
    (tmp_path / "config.toml").write_text("[node]\nstore_headroom_pct = 100\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="store_headroom_pct"):
        load_config(tmp_path)
    (tmp_path / "config.toml").write_text("[node]\nstore_headroom_pct = 20\n", encoding="utf-8")
    assert load_config(tmp_path).store_headroom_pct == 20
