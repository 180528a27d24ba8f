"""What a promise of a replicated store waits for: the one decision the node, its clients and its
runner processes share (bus/store/durable.py asks it before each ``WAITAOF``, and so does
bus/store/atomic/runs_sync.py ``SyncRuns.confirm``).

``every-replica`` (the default): ``WAITAOF 1 N`` with N = every replica the Sentinels know for
the set, up or down. A write that every replica fsynced is on whichever of them is promoted.
The case it closes (issue 43): a primary stalls, the Sentinels promote replica A, and the
primary wakes before they move replica B; it still has B, so ``WAITAOF 1 1`` there confirms
writes that B erases in its full resync from A. Woken so, the old primary has at most N - 1
replicas: it can confirm nothing. Nor can the Sentinels' own view close that window: the
address they give for the primary changes only at the end of the failover, after B moved.
The cost: with one replica down, or after the old primary died and until it is back as a
replica, no promise is given (submits fail "not durable", runners run nothing new).

``one-replica``: ``WAITAOF 1 R`` with R = ``waitaof_replicas`` (1), as before. Writes go on
with a replica down; a primary woken inside a failover can confirm, and then lose, promises.

N is the most replicas the Sentinels named so far in this process (asked again every
:data:`REFRESH_S`): it never falls when a replica dies (a dead replica stays in the Sentinels'
list), only when this process restarts after the operator removed one (``SENTINEL RESET``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

EVERY_REPLICA, ONE_REPLICA = "every-replica", "one-replica"
PROMISES = (EVERY_REPLICA, ONE_REPLICA)
REFRESH_S = 10.0  # how often a process asks the Sentinels again how many replicas there are


@dataclass
class ReplicasWanted:
    """How many replicas' fsync this process's promises wait for (``promise``: one of
    :data:`PROMISES`; ``floor``: the URL's ``waitaof_replicas``; ``clock``: seconds, monotonic,
    trio's in the node, the runner's own in a runner process)."""

    promise: str
    floor: int
    clock: Callable[[], float]
    known: int = 0  # the most replicas the Sentinels named so far
    asked_at: float | None = None

    @property
    def counts_replicas(self) -> bool:
        """Whether the Sentinels must be asked at all."""
        return self.promise == EVERY_REPLICA

    def stale(self) -> bool:
        """Whether to ask the Sentinels (again) before the next ``WAITAOF``."""
        if not self.counts_replicas:
            return False
        return self.asked_at is None or self.clock() - self.asked_at >= REFRESH_S

    def learn(self, replicas: int) -> None:
        """The Sentinels named ``replicas`` replicas of the set."""
        self.known = max(self.known, replicas)
        self.asked_at = self.clock()

    def unknown(self) -> str | None:
        """Why no promise can be given yet (the Sentinels never answered), or None."""
        if self.counts_replicas and self.asked_at is None:
            return "promise every-replica: the Sentinels did not say how many replicas there are"
        return None

    @property
    def wanted(self) -> int:
        """The R of ``WAITAOF 1 R``."""
        if self.counts_replicas:
            return max(self.known, self.floor)
        return self.floor
