"""bus.store.connection pieces that the services rely on, against a real Valkey."""

from __future__ import annotations

from coredis.commands.script import Script

from bus.store.connection import Store

_INCR_BY = Script(script="return redis.call('INCRBY', KEYS[1], ARGV[1])")
_ECHO = Script(script="return ARGV[1]")


async def test_scripts_load_on_first_use_and_after_a_flush(store: Store) -> None:
    calls = [(_INCR_BY, ["n"], ["2"]), (_ECHO, [], ["hi"]), (_INCR_BY, ["n"], ["3"])]
    # a fresh server knows neither script: each call still runs exactly once
    assert await store.scripts(0, calls) == [2, "hi", 5]
    assert await store.scripts(0, calls) == [7, "hi", 10]
    await store.call(0, lambda r: r.script_flush())  # as after a server restart
    assert await store.scripts(0, calls) == [12, "hi", 15]
    assert await store.call(0, lambda r: r.get("n")) == "15"


async def test_scripts_send_no_script_exists_round_trip(store: Store) -> None:
    calls = [(_INCR_BY, ["m"], ["1"])]
    await store.scripts(0, calls)  # loads the script
    before = await _calls(store, "script|exists")
    for _ in range(3):
        await store.scripts(0, calls)
    assert await _calls(store, "script|exists") == before
    assert await store.call(0, lambda r: r.get("m")) == "4"


async def _calls(store: Store, command: str) -> int:
    stats = await store.call(0, lambda r: r.info("commandstats"))
    return int(dict(stats).get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_commandstats_lookup_counts(store: Store) -> None:
    """The helper above reads real counters (so the test above cannot pass vacuously)."""
    before = await _calls(store, "evalsha")
    await store.scripts(0, [(_ECHO, [], ["x"])])
    assert await _calls(store, "evalsha") > before


async def test_pop_read_takes_what_is_queued_with_hashes_then_blocks(store: Store) -> None:
    import trio

    for i in range(3):
        await store.hset(0, f"h{i}", {"n": str(i)})
    await store.lpush(0, "src", "h0", "h1", "h2", "missing")  # h0 is the oldest
    popped = await store.pop_read(0, "src", "inflight", 2, 1.0)
    assert popped == [("h0", {"n": "0"}), ("h1", {"n": "1"})]
    assert await store.pop_read(0, "src", "inflight", 10, 1.0) == [
        ("h2", {"n": "2"}),
        ("missing", {}),
    ]
    assert await store.lrange(0, "inflight") == ["missing", "h2", "h1", "h0"]  # until acked

    async def push_later() -> None:
        await trio.sleep(0.2)
        await store.lpush(0, "src", "h1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push_later)
        with trio.fail_after(5):  # an empty source: the blocking pop, read at once
            assert await store.pop_read(0, "src", "inflight", 10, 3.0) == [("h1", {"n": "1"})]
    assert await store.pop_read(0, "src", "inflight", 10, 0.1) == []  # timed out
