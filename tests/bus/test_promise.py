"""How many replicas' fsyncs a promise waits for (bus/store/promise.py): the one decision the
node's barrier and the runner processes share, on trio's clock (no servers: the failover
suite, tests/host/test_failover.py, runs it against real ones)."""

from __future__ import annotations

import trio

from bus.store.promise import EVERY_REPLICA, ONE_REPLICA, REFRESH_S, ReplicasWanted


async def test_every_replica_counts_the_set_and_a_dead_replica_does_not_lower_it(autojump_clock):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    assert counted.stale()
    assert counted.unknown() is not None  # never asked: no promise can be given
    counted.learn(2)
    assert counted.wanted == 2
    assert not counted.stale()
    assert counted.unknown() is None
    await trio.sleep(REFRESH_S)
    assert counted.stale()  # asked again every REFRESH_S
    counted.learn(1)  # a replica the Sentinels forgot: the set is still two
    assert counted.wanted == 2
    counted.learn(0)
    assert counted.wanted == 2


async def test_every_replica_waits_for_at_least_the_urls_count(autojump_clock):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    counted.learn(0)  # Sentinels that have not found the replicas yet
    assert counted.wanted == 1


async def test_one_replica_never_asks_and_waits_for_the_urls_count(autojump_clock):
    counted = ReplicasWanted(ONE_REPLICA, 1, trio.current_time)
    assert not counted.stale()
    assert counted.unknown() is None
    assert counted.wanted == 1
    await trio.sleep(REFRESH_S * 3)
    assert not counted.stale()
