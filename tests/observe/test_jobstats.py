"""The job statistics a node's own scripts count (node/observe/tallies.py): handed back to
the node, added up in its memory and written as one field, at most once a beat."""

from __future__ import annotations

import json

import redis
import trio
import trio.testing

from bus.core import keys
from bus.store import records
from node.observe.tallies import WRITE_INTERVAL_S, JobStatsWriter
from node.state import JobStats

NODE_ID = "ab" * 32
FIELD = "node|" + NODE_ID[:16]


def _hsets(redis_url: str) -> int:
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return int(stats.get("cmdstat_hset", {}).get("calls", 0))


async def _field(store, ctx: int) -> dict[str, float]:  # noqa: ANN001
    raw = await store.call(ctx, lambda r: r.hget(keys.STATS_JOBS, FIELD))
    return json.loads(raw) if raw else {}


async def test_the_node_writes_what_its_scripts_counted_at_most_once_a_beat(
    store, redis_url, mock_clock: trio.testing.MockClock
):
    mock_clock.autojump_threshold = 0.1  # real I/O is not a timer: jump only when idle
    stats = JobStats()
    writer = JobStatsWriter(stats, store, NODE_ID)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        assert stats.write is not None  # what a scrape calls before it reads
        before = _hsets(redis_url)
        stats.add(1, ["submitted|p", "1"])
        await trio.sleep(WRITE_INTERVAL_S / 4)
        assert await _field(store, 1) == {"submitted|p": 1}  # the first count: at once
        stats.add(1, ["submitted|p", "1", "roundtrip_sum|p", "0.25", "bad|p", "x"])
        stats.add(1, ["submitted|p", "1"])
        await trio.sleep(WRITE_INTERVAL_S / 4)
        assert await _field(store, 1) == {"submitted|p": 1}  # within the beat: not yet
        await trio.sleep(WRITE_INTERVAL_S)
        assert await _field(store, 1) == {"submitted|p": 3, "roundtrip_sum|p": 0.25}
        assert _hsets(redis_url) - before == 2  # three counts, two writes
        stats.add(2, ["received|p", "1"])
        nursery.cancel_scope.cancel()  # the node stops: what it counted is written
    assert await _field(store, 2) == {"received|p": 1}
    # the node's next run goes on from its field; a reader adds it to the other fields
    await store.hset(1, keys.STATS_JOBS, {"submitted|p": "10"})
    again = JobStats()
    again.add(1, ["submitted|p", "2"])
    await JobStatsWriter(again, store, NODE_ID).write()
    assert await _field(store, 1) == {"submitted|p": 5, "roundtrip_sum|p": 0.25}
    assert (await records.job_stats(store, 1))["submitted|p"] == "15"


async def test_a_failed_write_keeps_its_counts_for_the_next(store, valkey_factory):
    """Valkey gone mid-write: the counts stay in memory and are in the next write."""
    from bus.errors import StoreError
    from bus.store.connection import open_store

    server = valkey_factory()
    stats = JobStats()
    async with open_store(server.url) as lost:
        stats.add(1, ["submitted|p", "4"])
        server.stop()
        writer = JobStatsWriter(stats, lost, NODE_ID)
        try:
            with trio.fail_after(30):
                await writer.write()
        except StoreError:
            pass
        else:
            raise AssertionError("a write to a stopped Valkey succeeded")
    assert stats.counted.is_set()
    await JobStatsWriter(stats, store, NODE_ID).write()
    assert await _field(store, 1) == {"submitted|p": 4}
