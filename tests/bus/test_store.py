"""bus.store.connection pieces that the services rely on, against a real Valkey."""

from __future__ import annotations

import pytest
import trio
from coredis.commands.script import Script

from bus.core import keys
from bus.errors import ContentError, StoreError
from bus.store import records
from bus.store.connection import Store, open_store

_INCR_BY = Script(script="return redis.call('INCRBY', KEYS[1], ARGV[1])")
_ECHO = Script(script="return ARGV[1]")
_SET = Script(script="return redis.call('SET', KEYS[1], ARGV[1])")
# a reply of every shape a script gives: bulk string, integer, nil (Lua false), nested table
_SHAPES = Script(script="return {ARGV[1], tonumber(ARGV[2]), false, {ARGV[1], 7}}")


def misnamed() -> Script[str]:
    """A script whose hash is not its text's: the server answers NOSCRIPT even right after
    loading its text (as when a ``SCRIPT FLUSH`` comes between the load and the rerun)."""
    script = Script(script="return 1")
    script.sha = Script(script="return 2").sha
    return script


async def test_scripts_load_on_first_use_and_after_a_flush(store: Store) -> None:
    calls = [(_INCR_BY, ["n"], ["2"]), (_ECHO, [], ["hi"]), (_INCR_BY, ["n"], ["3"])]
    # a fresh server knows neither script: each call still runs exactly once
    assert await store.scripts(0, calls) == [2, "hi", 5]
    assert await store.scripts(0, calls) == [7, "hi", 10]
    await store.call(0, lambda r: r.script_flush())  # as after a server restart
    assert await store.scripts(0, calls) == [12, "hi", 15]
    assert await store.call(0, lambda r: r.get("n")) == "15"


async def test_one_script_call_loads_on_first_use_and_after_a_flush(store: Store) -> None:
    """Store.script takes the scripts' path: loaded when the server answers NOSCRIPT, run
    once; a script still unknown after its load is a StoreError that says so."""
    assert await store.script(0, _INCR_BY, ["s"], ["2"]) == 2
    await store.call(0, lambda r: r.script_flush())  # as after a server restart
    assert await store.script(0, _INCR_BY, ["s"], ["3"]) == 5
    assert await store.script(0, _SHAPES, [], ["x", "5"]) == ["x", 5, None, ["x", 7]]
    with pytest.raises(StoreError, match="still missing after SCRIPT LOAD"):
        await store.script(0, misnamed(), [], [])


async def test_scripts_send_no_script_exists_round_trip(store: Store) -> None:
    calls = [(_INCR_BY, ["m"], ["1"])]
    await store.scripts(0, calls)  # loads the script
    before = await _calls(store, "script|exists")
    for _ in range(3):
        await store.scripts(0, calls)
    assert await _calls(store, "script|exists") == before
    assert await store.call(0, lambda r: r.get("m")) == "4"


async def test_scripts_reload_only_the_calls_answered_noscript(store: Store) -> None:
    await store.call(0, lambda r: r.script_load(_ECHO.script))  # the server knows _ECHO only
    loads, evalshas = await _calls(store, "script|load"), await _calls(store, "evalsha")
    calls = [(_INCR_BY, ["n"], ["2"]), (_ECHO, [], ["a"]), (_INCR_BY, ["n"], ["3"])]
    assert await store.scripts(0, calls + [(_ECHO, [], ["b"])]) == [2, "a", 5, "b"]
    assert await _calls(store, "script|load") == loads + 1  # _INCR_BY, once
    assert await _calls(store, "evalsha") == evalshas + 4 + 2  # its two calls run again
    assert await store.call(0, lambda r: r.script_exists([_INCR_BY.sha])) == (True,)


async def test_scripts_replies_are_decoded_as_a_coredis_pipeline_decodes(store: Store) -> None:
    calls = [(_SHAPES, [], ["x", "5"]), (_ECHO, [], ["\u00e9"])]
    ours = await store.scripts(0, calls)
    client = await store.db(0)
    async with client.pipeline(transaction=False) as pipe:
        pending = [pipe.evalsha(s.sha, keys=k, args=a) for s, k, a in calls]
    assert ours == [await p for p in pending] == [["x", 5, None, ["x", 7]], "\u00e9"]


async def test_a_script_still_missing_after_its_load_is_a_clear_store_error(
    store: Store,
) -> None:
    calls = [(_INCR_BY, ["n"], ["1"]), (misnamed(), [], []), (_INCR_BY, ["n"], ["1"])]
    with pytest.raises(StoreError, match="script [0-9a-f]{40} still missing after SCRIPT LOAD"):
        await store.scripts(0, calls)
    assert await store.call(0, lambda r: r.get("n")) == "2"  # the other calls ran, once each


async def test_a_script_error_comes_after_every_call_ran(store: Store) -> None:
    """Whatever the server's script cache held: a script it did not know is loaded and run
    before the error of an earlier call (whose script it knew) is raised."""
    await store.call(0, lambda r: r.script_load(_INCR_BY.script))
    await store.hset(0, "h", {"f": "v"})
    calls = [(_INCR_BY, ["h"], ["1"]), (_SET, ["s"], ["ran"])]
    with pytest.raises(ContentError, match="wrong_type"):
        await store.scripts(0, calls)
    assert await store.call(0, lambda r: r.get("s")) == "ran"


async def _calls(store: Store, command: str) -> int:
    stats = await store.call(0, lambda r: r.info("commandstats"))
    return int(dict(stats).get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_commandstats_lookup_counts(store: Store) -> None:
    """The helper above reads real counters (so the test above cannot pass vacuously)."""
    before = await _calls(store, "evalsha")
    await store.scripts(0, [(_ECHO, [], ["x"])])
    assert await _calls(store, "evalsha") > before


async def test_pop_read_wait_reads_its_entry_with_the_rest_in_one_round_trip(
    store: Store,
) -> None:
    """The blocking pop (what a queue the last pop left empty starts with: serve.pop_entries),
    then one script reads its entry and takes and reads what came after it, in order."""
    for i in range(4):
        await store.hset(0, f"h{i}", {"n": str(i)})
    assert await store.pop_read_wait(0, "src", "inflight", 3, 0.1) == []  # loads the script
    await store.lpush(0, "src", "h0", "h1", "h2", "h3")
    before = {c: await _calls(store, c) for c in ("blmove", "evalsha", "lmpop", "hgetall")}
    popped = await store.pop_read_wait(0, "src", "inflight", 3, 1.0)
    assert popped == [("h0", {"n": "0"}), ("h1", {"n": "1"}), ("h2", {"n": "2"})]
    calls = {c: await _calls(store, c) - n for c, n in before.items()}
    assert calls == {"blmove": 1, "evalsha": 1, "lmpop": 1, "hgetall": 3}
    assert await store.lrange(0, "inflight") == ["h2", "h1", "h0"]
    assert await store.pop_read_wait(0, "src", "inflight", 1, 1.0) == [("h3", {"n": "3"})]
    assert await store.pop_read_wait(0, "src", "inflight", 5, 0.1) == []


async def test_pop_read_batch_takes_what_is_queued_with_hashes(store: Store) -> None:
    import trio

    for i in range(3):
        await store.hset(0, f"h{i}", {"n": str(i)})
    await store.lpush(0, "src", "h0", "h1", "h2", "missing")  # h0 is the oldest
    popped = await store.pop_read_batch(0, "src", "inflight", 2)
    assert popped == [("h0", {"n": "0"}), ("h1", {"n": "1"})]
    assert await store.pop_read_batch(0, "src", "inflight", 10) == [
        ("h2", {"n": "2"}),
        ("missing", {}),
    ]
    assert await store.lrange(0, "inflight") == ["missing", "h2", "h1", "h0"]  # until acked
    assert await store.pop_read_batch(0, "src", "inflight", 10) == []  # nothing queued

    async def push_later() -> None:
        await trio.sleep(0.2)
        await store.lpush(0, "src", "h1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push_later)
        with trio.fail_after(5):  # an empty source: the blocking pop, read at once
            assert await store.pop_read_wait(0, "src", "inflight", 10, 3.0) == [("h1", {"n": "1"})]
    assert await store.pop_read_wait(0, "src", "inflight", 10, 0.1) == []  # timed out


async def test_a_blocked_pop_read_cancelled_leaves_the_store_usable(store: Store) -> None:
    """A blocking pop has its reading script pipelined behind it on one connection: cancelled
    while it blocks, that connection is dropped, so no later command waits behind the pop or
    gets its reply; the next pop takes what comes."""
    import trio

    await store.hset(0, "h1", {"n": "1"})
    with trio.move_on_after(0.3) as waited:
        await store.pop_read_wait(0, "src", "inflight", 10, 5.0)
    assert waited.cancelled_caught
    with trio.fail_after(2):  # a pool connection left blocked would delay these by seconds
        await store.lpush(0, "src", "h1")
        assert await store.llen(0, "src") == 1
        assert await store.pop_read_wait(0, "src", "inflight", 10, 1.0) == [("h1", {"n": "1"})]
    assert await store.lrange(0, "inflight") == ["h1"]


async def test_pop_wait_takes_what_came_after_its_entry_in_the_same_round_trip(
    store: Store,
) -> None:
    """A queue that names no hashes (an outbox, flow events), drained by its last pop, starts
    with the blocking pop; the batch pop pipelined behind it takes what was queued after its
    entry: one BLMOVE and one script for three entries, in order, all in flight."""
    import trio

    assert await store.pop_wait(0, "src", "inflight", 3, 0.1) == []  # loads the script
    await store.lpush(0, "src", "e0", "e1", "e2", "e3")
    before = {c: await _calls(store, c) for c in ("blmove", "evalsha", "lmpop")}
    assert await store.pop_wait(0, "src", "inflight", 3, 1.0) == ["e0", "e1", "e2"]
    calls = {c: await _calls(store, c) - n for c, n in before.items()}
    assert calls == {"blmove": 1, "evalsha": 1, "lmpop": 1}
    assert await store.lrange(0, "inflight") == ["e2", "e1", "e0"]
    assert await store.pop_wait(0, "src", "inflight", 1, 1.0) == ["e3"]

    async def push_later() -> None:
        await trio.sleep(0.2)
        await store.lpush(0, "src", "e4")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push_later)
        with trio.fail_after(5):
            assert await store.pop_wait(0, "src", "inflight", 10, 3.0) == ["e4"]
    assert await store.pop_wait(0, "src", "inflight", 10, 0.1) == []  # timed out


async def test_an_acks_frame_removes_each_entry_once_in_one_command(store: Store) -> None:
    """An outbox's acknowledged entries leave its in-flight list: each once (as one LREM each
    would: a copy sent twice stays for its own ack), unknown ones ignored, the count of those that
    were there returned; one command, not a MULTI of one LREM per entry."""
    peer = "ab" * 32
    inflight = keys.outbox_inflight(peer)
    await store.call(0, lambda r: r.rpush(inflight, ["1|m:1", "1|m:2", "1|m:2", "1|m:3"]))
    before = await _calls(store, "multi")
    removed = await records.remove_outbox_inflight(store, peer, ["1|m:2", "1|m:3", "1|m:9"])
    assert removed == 2
    assert await store.lrange(0, inflight) == ["1|m:1", "1|m:2"]
    assert await _calls(store, "multi") == before  # one script call, no transaction


async def test_an_acks_frame_trims_the_in_flight_list_once_not_per_entry(store: Store) -> None:
    """More than two acknowledged entries leave an outbox's in-flight list in one trim (one
    LRANGE, one DEL, one RPUSH of what stays, in its order), not one LREM per entry; a copy
    sent twice keeps its second, what was not acknowledged keeps its place."""
    peer = "cd" * 32
    inflight = keys.outbox_inflight(peer)
    sent = ["1|m:1", "1|m:2", "1|m:3", "1|m:2", "1|m:4", "1|m:5"]
    await store.call(0, lambda r: r.rpush(inflight, sent))
    names = ("lrem", "lrange", "del", "rpush")
    before = [await _calls(store, n) for n in names]
    removed = await records.remove_outbox_inflight(store, peer, ["1|m:5", "1|m:2", "1|m:1", "x"])
    after = [await _calls(store, n) for n in names]
    assert removed == 3
    assert await store.lrange(0, inflight) == ["1|m:3", "1|m:2", "1|m:4"]
    assert dict(zip(names, [a - b for a, b in zip(after, before, strict=True)], strict=True)) == {
        "lrem": 0,
        "lrange": 1,
        "del": 1,
        "rpush": 1,
    }


async def test_an_acks_frame_of_the_oldest_entries_takes_them_off_in_one_pop(
    store: Store,
) -> None:
    """Acknowledged entries that are exactly the in-flight list's oldest (its tail: a pop
    pushes its batch on the head), in any order, leave it in one pop (LMPOP): no LRANGE, DEL,
    RPUSH or LREM; what was sent after them keeps its place."""
    peer = "ef" * 32
    inflight = keys.outbox_inflight(peer)
    await store.call(0, lambda r: r.lpush(inflight, ["1|m:1", "1|m:2", "1|m:3", "1|m:4"]))
    names = ("lmpop", "lrem", "lrange", "del", "rpush")
    before = [await _calls(store, n) for n in names]
    removed = await records.remove_outbox_inflight(store, peer, ["1|m:2", "1|m:1", "1|m:3"])
    after = [await _calls(store, n) for n in names]
    assert removed == 3
    assert await store.lrange(0, inflight) == ["1|m:4"]
    assert dict(zip(names, [a - b for a, b in zip(after, before, strict=True)], strict=True)) == {
        "lmpop": 1,
        "lrem": 0,
        "lrange": 0,
        "del": 0,
        "rpush": 0,
    }


async def test_a_call_cancelled_while_its_db_opens_ends(redis_url) -> None:
    """A DB's client opens on its first command (Store.db), in a task that holds it until
    the store closes. A caller cancelled while that opens (Ctrl-C on `job submit --wait`
    during its first log read) must end: trio leaves a task whose starter was cancelled in
    the start's own nursery, where the start waits for it, and the holder waits for the
    store to close. Each cancellation point is tried; the call runs in a nursery outside the
    store, so that a call that does not end is reported, then released by the close."""
    for yields in range(40):
        async with trio.open_nursery() as outside:
            async with open_store(redis_url) as store:
                scope, ended = trio.CancelScope(), trio.Event()
                outside.start_soon(_cancelled_get, store, scope, ended)
                for _ in range(yields):
                    await trio.lowlevel.checkpoint()
                scope.cancel()
                with trio.move_on_after(10):
                    await ended.wait()
                assert ended.is_set(), f"a call cancelled after {yields} yields never ended"


async def _cancelled_get(store: Store, scope: trio.CancelScope, ended: trio.Event) -> None:
    with scope:
        await store.get(3, "k")
    ended.set()
