"""A queue's pop takes the hashes this process's writers handed it (serve.Known) from memory
and reads back only the others: what it gives the handler is what Valkey holds, whichever way
it came, and the registry's version still comes with every pop."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from bus.core import keys
from bus.core.models import Hash
from bus.core.reasons import Reason
from bus.store.connection import Store
from bus.store.serve import Known, Popped, Queue, pop_entries

DB = 1
SOURCE, INFLIGHT = "queue:known", "inflight:known"


async def _calls(store: Store, command: str) -> int:
    stats = await store.read(DB, lambda r: r.info("commandstats"))
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def _push(store: Store, entries: dict[str, Hash]) -> None:
    """Each hash written and its key queued, as a delivery does (one script there)."""
    for key, fields in entries.items():
        await store.hset(DB, key, fields)
        await store.lpush(DB, SOURCE, key)


def _queue(known: Known, *, registry: bool = False) -> Queue:
    return Queue(DB, SOURCE, INFLIGHT, registry=registry, known=known, timeout_s=1.0)


@pytest.mark.parametrize("block_first", [False, True])
async def test_handed_hashes_are_not_read_back(store: Store, block_first: bool) -> None:
    known = Known()
    entries = {f"m:{i}": {"n": str(i)} for i in range(3)}
    await _push(store, entries)
    known.remember("m:0", entries["m:0"])
    known.remember("m:2", entries["m:2"])
    before = await _calls(store, "hgetall")
    with trio.fail_after(10):
        popped, _ = await pop_entries(store, _queue(known), block_first=block_first)
    assert popped == [Popped(k, v) for k, v in entries.items()]
    assert await _calls(store, "hgetall") - before == 1  # m:1 alone, not handed over
    # taken once: a second copy of an entry (a recovery's) is read back
    assert await known.take(["m:0", "m:2"]) == {}


async def test_an_unhanded_entry_of_another_type_is_refused(store: Store) -> None:
    known = Known()
    await _push(store, {"m:ok": {"n": "1"}})
    known.remember("m:ok", {"n": "1"})
    await store.set_new(DB, "m:str", "x", 60)
    await store.lpush(DB, SOURCE, "m:str")
    with trio.fail_after(10):
        popped, _ = await pop_entries(store, _queue(known))
    assert popped == [Popped("m:ok", {"n": "1"})]
    [dead] = await store.dead_letters(DB)
    assert dead["key"] == "m:str"
    assert dead["reason"] == Reason.WRONG_TYPE
    assert await store.lrange(DB, INFLIGHT) == ["m:ok"]


@pytest.mark.parametrize("was_there", [False, True])
async def test_an_entry_being_stored_is_taken_as_stored(store: Store, was_there: bool) -> None:
    """A delivery announces its entries before its write; a pop that moved one first waits
    for the delivery's verdict: stored, its hash from memory; found there already (an older
    copy, whose hash may differ), read back, never the announced guess."""
    known = Known()
    announced = known.storing(["m:x"])
    held = {"v": "older copy"} if was_there else {"v": "announced"}
    await _push(store, {"m:x": held})
    got: list[Popped] = []

    async def pop() -> None:
        popped, _ = await pop_entries(store, _queue(known))
        got.extend(popped)

    before = await _calls(store, "hgetall")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pop)
            await trio.testing.wait_all_tasks_blocked()
            known.stored(announced, {} if was_there else {"m:x": {"v": "announced"}})
    assert got == [Popped("m:x", held)]
    assert await _calls(store, "hgetall") - before == (1 if was_there else 0)


@pytest.mark.parametrize("block_first", [False, True])
async def test_a_registry_change_between_two_pops_is_seen(store: Store, block_first: bool) -> None:
    known = Known()
    queue = _queue(known, registry=True)
    for i, bump in enumerate([False, True]):
        if bump:
            await store.call(keys.ACTORS_DB, lambda r: r.incr(keys.REGISTRY_VERSION))
        await _push(store, {f"m:{i}": {"n": str(i)}})
        known.remember(f"m:{i}", {"n": str(i)})
        with trio.fail_after(10):
            await pop_entries(store, queue, block_first=block_first)
        version = await store.get(keys.ACTORS_DB, keys.REGISTRY_VERSION)
        assert store.registry_seen == (version or "0")
    assert store.registry_seen == "1"


async def test_past_its_bound_the_oldest_are_forgotten() -> None:
    known = Known(most=2)
    for i in range(3):
        known.remember(f"m:{i}", {"n": str(i)})
    assert await known.take(["m:0", "m:1", "m:2"]) == {"m:1": {"n": "1"}, "m:2": {"n": "2"}}
