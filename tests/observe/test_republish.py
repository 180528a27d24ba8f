"""What the node publishes only on change is current again after a failover, with nothing
changed since (Store.waking_on_failover). A write the old primary took and lost in the
failover is stood in for by older values written on the primary and confirmed by both
replicas; the failover is a real one (``SENTINEL FAILOVER`` on the ``replicated`` fixture's
primary, two replicas and three Sentinels), heard of as the node hears of it
(node/host/store_tuning.py relays the Sentinels' +switch-master to the store)."""

from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path

import redis
import trio

from bus.core import keys
from bus.store.connection import Store, open_store
from bus.wire.breakers import PeerBreakers
from bus.wire.transport import Transport
from crypto import KeyPair
from node.config import NodeConfig
from node.host.acl import NODE
from node.host.replicated import ReplicatedSet
from node.host.store_tuning import run_store_tuning
from node.intake.pressure import BOUNDS_FIELD, HELD_FIELD, run_pressure_watch
from node.links.peer_breakers import BREAKERS_FIELD, run_breaker_publisher
from node.observe.linkinfo import LINKS_FIELD, run_link_info
from node.observe.nodeinfo import run_node_info
from node.observe.tallies import (
    COUNTERS_FIELD,
    WRITE_INTERVAL_S,
    JobStatsWriter,
    read,
    run_counters,
)
from node.runners.presence import Slot, run_presence, runner_id
from node.state import JobStats, NodeState
from tests.nodes import until

CTX = 1
# what the new primary holds: the values before the writes the failover lost
STALE = {
    COUNTERS_FIELD: '{"routed":1}',
    LINKS_FIELD: '{"gone":{}}',
    BREAKERS_FIELD: '{"gone":{}}',
    HELD_FIELD: "disk: full",
    BOUNDS_FIELD: "{}",
    "pid": "1",
}
STATS = "stats"  # the node's job statistics field, as _published names it
STALE_STATS = '{"submitted|p":1}'
RUNNER = "runner"  # where its slot's registration says the runner is, as _published names it


async def _ignore(*_: object) -> None:
    return None


def _client(servers: ReplicatedSet, port: int, db: int = 0) -> redis.Redis:
    return redis.Redis(
        port=port, db=db, username=NODE, password=servers.passwords[NODE], decode_responses=True
    )


def _primary_port(servers: ReplicatedSet) -> int:
    with _client(servers, servers.sentinel_ports[0]) as sentinel:
        _, port = sentinel.sentinel_get_master_addr_by_name(servers.service)
    return int(port)


def _published(servers: ReplicatedSet, old: int, stats_field: str, slot: Slot) -> dict[str, str]:
    """``node:info``, the node's job statistics (``STATS``) and its slot's registered address
    (``RUNNER``) as the server the Sentinels name primary has them ({} while that is still
    ``old``)."""
    port = _primary_port(servers)
    if port == old:
        return {}
    with _client(servers, port) as primary, _client(servers, port, CTX) as context:
        info = dict(primary.hgetall(keys.NODE_INFO))
        stats = context.hget(keys.STATS_JOBS, stats_field) or ""
        return info | {STATS: stats, RUNNER: context.hget(keys.runner(slot.runner_id), "address")}


async def _lose_writes(store: Store, stats_field: str, slot: Slot) -> None:
    """The primary and both replicas hold the stale values, as if the writes after them had
    been lost."""
    await store.hset(keys.ACTORS_DB, keys.NODE_INFO, STALE)
    await store.hset(CTX, keys.STATS_JOBS, {stats_field: STALE_STATS})
    await store.hset(CTX, keys.runner(slot.runner_id), {"address": "ws://gone"})
    with warnings.catch_warnings():  # coredis would have WAIT as a context manager
        warnings.simplefilter("ignore")
        assert await store.call(keys.ACTORS_DB, lambda r: r.wait(2, 10_000)) == 2


async def test_what_is_published_on_change_is_current_again_after_a_failover(
    replicated: ReplicatedSet, tmp_path: Path
) -> None:
    url = replicated.url(NODE)
    async with open_store(url) as store, trio.open_nursery() as nursery:
        config = NodeConfig(home=tmp_path, pressure_check_s=0.2)
        node = NodeState(config, KeyPair.generate(), store)
        node.counters.count("routed", 2)
        transport = Transport(node.identity.key, set, _ignore, _ignore)
        stats = JobStats()
        stats.add(CTX, ["submitted|p", "2"])
        writer = JobStatsWriter(stats, store, node.identity.node_id)
        rid = runner_id(node.identity.node_id, CTX, "python", 0)
        slot = Slot(rid, "python", (keys.queue("python"),), keys.runner_inflight(rid))
        with trio.fail_after(30):
            await nursery.start(run_store_tuning, store, url)
            await nursery.start(run_counters, node.counters, store, transport)
            await nursery.start(run_link_info, store, transport)
            await nursery.start(run_breaker_publisher, PeerBreakers(), store)
            await nursery.start(run_node_info, store, {"pid": "1234"})
            await nursery.start(writer.run)
            await nursery.start(
                partial(run_pressure_watch, node, measure_disk=lambda ps: dict.fromkeys(ps, 2**40))
            )
            await nursery.start(run_presence, node.identity, store, CTX, [slot], "ws://here")
            await writer.write()  # what the service writes at once, done before reading it
            old = _primary_port(replicated)
            current = _published(replicated, 0, writer.field, slot)
            assert read(current) == {"routed": 2}
            assert current[LINKS_FIELD] == current[BREAKERS_FIELD] == "{}"
            assert (current["pid"], current[STATS]) == ("1234", '{"submitted|p":2}')
            assert (current[HELD_FIELD], current[RUNNER]) == ("", "ws://here")
            await _lose_writes(store, writer.field, slot)
        with _client(replicated, replicated.sentinel_ports[0]) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", replicated.service)
        # nothing changed since: only the failover can make what was published current again
        now = lambda: _published(replicated, old, writer.field, slot)  # noqa: E731
        assert await until(lambda: now() == current, 30), {
            k: v for k, v in now().items() if v != current.get(k)
        }
        assert node.counters.metrics == {"routed": 2}
        assert not stats.pending
        nursery.cancel_scope.cancel()


async def test_a_restarted_job_statistics_writer_writes_every_total_again(
    store: Store, mock_clock: trio.testing.MockClock
) -> None:
    """The writer is restarted after a store error, which a failover may explain: the totals
    it wrote before may be gone from the new primary, so it writes them all again, with
    nothing counted since."""
    mock_clock.autojump_threshold = 0.1  # real I/O is not a timer: jump only when idle
    stats = JobStats()
    stats.add(CTX, ["submitted|p", "2"])
    writer = JobStatsWriter(stats, store, KeyPair.generate().public_hex)
    await writer.write()
    await store.hset(CTX, keys.STATS_JOBS, {writer.field: STALE_STATS})
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)  # as ``resilient`` starts it again
        await trio.sleep(WRITE_INTERVAL_S / 4)  # a write is a few ms: the clock jumps after it
        written = await store.hgetall(CTX, keys.STATS_JOBS)
        nursery.cancel_scope.cancel()
    assert written[writer.field] == '{"submitted|p":2}'
