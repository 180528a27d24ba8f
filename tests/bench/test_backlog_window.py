"""Case 7's backlog window times the node's drain, not its start-up (bench/cases.py Backlogs).

A node started on a queued backlog routes and runs it while its runner processes come up one
by one: on main 96dbbb3, by the ready line, a 1,000 backlog was routed whole (so its window was
timed without routing) and 2,240-2,620 of a 100,000 one (bench/HISTORY.md#flat-cost-2). The
backlog now waits under another name until the node is ready and is released whole; a window
job queued before the release fails the run instead of printing a figure that is not one."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import coredis
import pytest
import trio

from bench import workload
from bench.cases import STAGED, Backlogs, Env, Plan, _queued_after, _release
from bench.harness import ACTOR_ID, CONTEXT_ID, Procs
from bus.core import keys
from bus.store.connection import Store
from crypto import KeyPair

BACKLOG = 40


def _plan() -> Plan:
    return Plan.make(quick=True, runs=1, budget_s=None)


@pytest.fixture
async def db(redis_url: str) -> AsyncIterator[Any]:
    r: Any = coredis.Redis.from_url(redis_url, db=CONTEXT_ID, decode_responses=True)
    async with r:
        yield r


async def test_a_released_backlog_wakes_the_supervisors_pop_oldest_first(
    db: Any, store: Store, redis_url: str
) -> None:
    """What the bench relies on: while staged, msg_out is empty (a node started now routes
    nothing); one release puts the whole backlog there, and the supervisor's own blocking pop
    (Store.pop_read_wait), waiting already, wakes with the oldest messages and their hashes."""
    actor, node_id = KeyPair.generate(), KeyPair.generate().public_hex
    messages = [
        workload.signed_job_message(actor, ACTOR_ID, CONTEXT_ID, node_id, node_id) for _ in range(5)
    ]
    for m in messages:  # what the bench loads (workload.submitted_form)
        await db.hset(m.key, m.to_hash())
        await db.lpush(keys.MSG_OUT, [m.key])
    await db.rename(keys.MSG_OUT, STAGED)
    assert await db.llen(keys.MSG_OUT) == 0
    popped: list[tuple[str, dict[str, str]]] = []

    async def pop() -> None:
        popped.extend(
            await store.pop_read_wait(CONTEXT_ID, keys.MSG_OUT, "inflight:supervisor", 64, 30)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(10):
            await _release(db)
    assert popped == [(m.key, m.to_hash()) for m in messages]
    assert await db.exists([STAGED]) == 0


async def test_a_window_job_queued_before_the_release_fails_the_run(db: Any) -> None:
    released_ms = await _release_nothing(db)
    await db.hset("job:42:1", {"stats_queued_ms": str(released_ms)})
    await db.hset("job:42:2", {"stats_queued_ms": str(released_ms + 5)})
    await _queued_after(db, ["job:42:1", "job:42:2"], released_ms)
    await db.hset("job:42:3", {"stats_queued_ms": str(released_ms - 1)})
    with pytest.raises(RuntimeError, match="1 of 3 backlog jobs were queued before"):
        await _queued_after(db, ["job:42:1", "job:42:2", "job:42:3"], released_ms)


async def _release_nothing(db: Any) -> int:
    await db.lpush(STAGED, ["-"])  # a RENAME needs a key
    released_ms = await _release(db)
    await db.delete([keys.MSG_OUT])
    return released_ms


async def test_a_backlog_run_times_only_jobs_queued_after_the_node_was_ready(
    tmp_path: Path,
) -> None:
    """Through a real node and runner processes: every job of the window was queued after the
    release (Backlogs.run_one raises otherwise), and all ran."""
    procs = Procs()
    try:
        async with trio.open_nursery() as nursery:
            env = Env(_plan(), procs, nursery, tmp_path)
            backlogs = Backlogs(env)
            await trio.to_thread.run_sync(backlogs.prepare, BACKLOG)
            with trio.fail_after(120):
                result = await backlogs.run_one(BACKLOG, BACKLOG)
            nursery.cancel_scope.cancel()
    finally:
        await procs.stop_all()
        shutil.rmtree(tmp_path / "backlog", ignore_errors=True)
    assert result.rate > 0
    assert result.replies_in_window == BACKLOG
