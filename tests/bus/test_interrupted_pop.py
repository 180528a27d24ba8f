"""A runner's blocking pop cut by a signal (its Wake) leaves a clean connection behind: on a
replicated store redis-py's Sentinel connections keep the socket after an error, and the next
command would read the pop's late reply as its own (bus/store/atomic/runs_sync.py)."""

from __future__ import annotations

import signal

import pytest

from bus.store.atomic.runs import NextJob
from bus.store.atomic.runs_sync import SyncRuns, connect
from node.host.acl import RUNNER


class Woken(Exception):  # noqa: N818 - a signal, as the runner's Wake
    pass


def _wake(_signum: int, _frame: object) -> None:
    raise Woken


def test_a_pop_cut_by_a_signal_leaves_the_next_command_its_own_reply(replicated):
    runs = SyncRuns(connect(replicated.url(RUNNER), 1))
    assert runs.held("inflight:runner:x") == 0  # connected, as the runner is before it waits
    previous = signal.signal(signal.SIGALRM, _wake)
    try:
        # the signal interrupts the main thread's recv while BLMOVE waits (as the node's
        # drain or wake-up signal does): the server still owes that BLMOVE its reply
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        take = NextJob(("queue:x",), "n:b:1:x:0", 15_000, "x:0")
        with pytest.raises(Woken):
            runs.pop_started("queue:x", "inflight:runner:x", 1.0, 0, take)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # what the runner asks next (node/worker/loop.py pop): each reads its own reply
    assert runs.store.command("LRANGE", "inflight:runner:x", 0, 0) == []
    assert runs.held("inflight:runner:x") == 0
    runs.client.rpush("inflight:runner:x", "a", "b")
    assert runs.held("inflight:runner:x") == 2  # not the pop's late nil
    assert runs.store.command("LRANGE", "inflight:runner:x", 0, 0) == ["a"]
