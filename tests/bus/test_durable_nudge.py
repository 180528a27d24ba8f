"""A ``WAITAOF`` still unanswered is nudged (bus/store/durable.py): another connection sends a
``WAITAOF`` that blocks, so that the primary asks the replicas for their fsynced offsets again.
A nudge confirms nothing, and one that fails changes nothing: the node's (and a client's)
:class:`Barrier` and a runner's :meth:`SyncStore.confirm`, on real servers (a primary, two
replicas, three Sentinels), the replicas stopped (SIGSTOP) while a confirmation waits."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice

import hiredis
import pytest
import redis

from bench.replicated import primary_calls
from bus.store.connection import Store, open_store
from bus.store.durable import NotDurable, Nudges
from bus.store.sentinel import NUDGE, NUDGE_AFTER_S, NUDGE_GAP_MAX_S, durability, nudge_gaps
from bus.store.sync import SyncStore, Unconfirmed, connect
from node.host.acl import NODE, RUNNER
from node.host.replicated import ReplicatedSet
from tests.bus.test_durable_submit import _replicas_ready

# what a refused nudge sends: WAITAOF's numlocal is 0 or 1, so the server answers an error
REFUSED = ("WAITAOF", 2, 1, 1)


@contextmanager
def _replicas_stopped(servers: ReplicatedSet) -> Iterator[None]:
    stopped = [servers.child(port) for port in servers.data_ports[1:]]
    for child in stopped:
        child.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for child in stopped:
            child.signal(signal.SIGCONT)


def _nudges(store: Store) -> Nudges:
    assert store.barrier is not None  # a store behind Sentinels asking WAITAOF has one ...
    assert store.barrier.nudges is not None  # ... and a lane to nudge on
    return store.barrier.nudges


def test_nudges_come_soon_then_ever_further_apart():
    gaps = list(islice(nudge_gaps(), 8))
    assert gaps[0] == NUDGE_AFTER_S
    assert gaps == sorted(gaps)
    assert gaps[-1] == NUDGE_GAP_MAX_S  # a replica stopped for long is not asked ever faster


async def test_a_nudge_asks_the_primary_and_confirms_nothing(replicated):
    """The replicas stopped: the barrier's WAITAOF waits, nudges are sent and answered (the
    primary counts them as WAITAOFs besides the barrier's two), and still no promise is
    given; the same store confirms again once the replicas are back."""
    async with open_store(replicated.url(NODE, waitaof_timeout_ms="300")) as store:
        await _replicas_ready(store)
        nudges = _nudges(store)
        assert nudges.command == NUDGE
        before = (await primary_calls(replicated)).get("waitaof", 0)
        with _replicas_stopped(replicated), pytest.raises(NotDurable, match="0 replica fsync"):
            await store.durable()
        assert nudges.sent >= 1
        assert nudges.failed == 0
        # the barrier's two WAITAOFs (a short one, then the rest), and a nudge: each blocks
        # 1 ms, and is answered by the server's clock tick (100 ms) at the latest
        assert (await primary_calls(replicated)).get("waitaof", 0) - before >= 3
        await store.durable()  # the replicas back: confirmed


async def test_a_store_s_nudges_settle_before_the_primary_is_counted(replicated):
    """A nudge blocks on the primary after the wait it nudged has ended, and the primary counts
    a command when it ends: once :meth:`Nudges.settled` returns, every nudge sent is counted
    there. Here each nudge blocks 600 ms and the barrier gives up after 300 ms, so without the
    settling none of them would be counted yet."""
    async with open_store(replicated.url(NODE, waitaof_timeout_ms="300")) as store:
        await _replicas_ready(store)
        nudges = _nudges(store)
        nudges.command = ("WAITAOF", 0, 1_000_000, 600)
        await nudges.settled()
        before, sent = (await primary_calls(replicated)).get("waitaof", 0), nudges.sent
        with _replicas_stopped(replicated), pytest.raises(NotDurable, match="0 replica fsync"):
            await store.durable()
        sent = nudges.sent - sent
        assert sent >= 1
        await nudges.settled()
        assert nudges.failed == 0
        barrier = (await primary_calls(replicated)).get("waitaof", 0) - before - sent
        assert barrier in (1, 2)  # the barrier's own: one, or a short one then the rest


async def test_a_failed_nudge_changes_nothing(replicated):
    """Every nudge refused by the server: the wait still ends with its own reason, and the
    store confirms as before once the replicas are back."""
    async with open_store(replicated.url(NODE, waitaof_timeout_ms="300")) as store:
        await _replicas_ready(store)
        nudges = _nudges(store)
        nudges.command = REFUSED
        with _replicas_stopped(replicated), pytest.raises(NotDurable, match="0 replica fsync"):
            await store.durable()
        assert nudges.failed >= 1
        await store.durable()


def _runner_store(servers: ReplicatedSet) -> SyncStore:
    url = servers.url(RUNNER, waitaof_timeout_ms="300")
    store = SyncStore(connect(url, 1), durability(url))
    admin = {"username": NODE, "password": servers.passwords[NODE]}
    with redis.Redis("127.0.0.1", servers.data_ports[0], db=1, **admin) as primary:
        primary.rpush("queue:x", "job:1:0")
        assert primary.wait(2, 10_000) == 2  # both replicas attached and in sync
    return store


def test_a_runner_nudges_and_confirms_nothing_by_it(replicated):
    """A runner's confirmation, the replicas stopped: nudged, not confirmed; then confirmed."""
    store = _runner_store(replicated)
    nudges = store._nudges()  # this thread's
    with _replicas_stopped(replicated):
        store.command("RPUSH", "queue:x", "job:1:1", writes=True)
        with pytest.raises(Unconfirmed, match="0 replica fsync"):
            store.confirm()
    assert nudges.sent >= 1
    assert nudges.failed == 0
    store.confirm()  # the replicas caught up: the same write is confirmed now
    store.close()


def test_a_runner_s_failed_nudge_changes_nothing(replicated):
    store = _runner_store(replicated)
    nudges = store._nudges()
    nudges.command = hiredis.pack_command(REFUSED)
    with _replicas_stopped(replicated):
        store.command("RPUSH", "queue:x", "job:1:1", writes=True)
        with pytest.raises(Unconfirmed, match="0 replica fsync"):
            store.confirm()
    assert nudges.failed >= 1
    store.command("RPUSH", "queue:x", "job:1:2", writes=True)
    store.confirm()
    assert store.command("LLEN", "queue:x") == 3
    store.close()
