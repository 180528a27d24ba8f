"""What a promise of a replicated store waits for: the one decision the node, its clients and its
runner processes share (bus/store/durable.py asks it before each ``WAITAOF``, and so does
bus/store/atomic/runs_sync.py ``SyncRuns.confirm``).

``every-replica`` (the default): ``WAITAOF 1 N`` with N = every replica the Sentinels could
promote: every replica they know for the set, less those they flag down (``s_down``,
``o_down``), which their leader never selects (sentinel.c ``sentinelSelectReplica`` skips
them; it skips a ``disconnected`` one too, but the replica it has just selected is flagged so
while it is promoted: :data:`DOWN_FLAGS`). A write that every such replica fsynced is on whichever
of them is promoted. The case it closes (issue 43): a primary stalls, the Sentinels promote
replica A, and the primary wakes before they move replica B; it still has B, so ``WAITAOF 1 1``
there confirms writes that B erases in its full resync from A. Woken so, the old primary has at
most N - 1 replicas (neither A nor B is flagged down): it can confirm nothing.

A replica counted out comes back as the Sentinels see it answer: the count is asked again at
most :data:`DOWN_REFRESH_S` later while one is counted out (at once in the node, on the
Sentinels' ``-sdown``), and only then do promises wait for its fsync again. Writes confirmed
meanwhile are on every other replica; the leader ranks a replica by the replication offset it
last reported (``compareReplicasForPromotion``), and one that came back without them reports
less, or, an old primary still saying it is one, none (0): it is promoted only if every replica
holding them is lost as well (docs/operate/promise.md states that trade-off).

``one-replica``: ``WAITAOF 1 R`` with R = ``waitaof_replicas`` (1), as before. Writes go on
with a replica down; a primary woken inside a failover can confirm, and then lose, promises.

The set's size is the most replicas the Sentinels listed so far in this process: one they
stop listing (a Sentinel that has just started, ``SENTINEL RESET``) still counts until this
process restarts; only one they list and flag down is counted out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

EVERY_REPLICA, ONE_REPLICA = "every-replica", "one-replica"
PROMISES = (EVERY_REPLICA, ONE_REPLICA)
REFRESH_S = 10.0  # how often a process asks the Sentinels again how many replicas there are
# ... while a replica is counted out: it is counted again this soon after it answers
DOWN_REFRESH_S = 1.0
# how a Sentinel flags a server it would not promote (sentinel.c sentinelSelectReplica). Not
# ``disconnected``, which it skips too: the promotion it sends the replica it selected ends
# with CLIENT KILL TYPE normal, so every Sentinel flags the new primary-to-be disconnected
# while the old one may still be awake to confirm writes without it (the failover window)
DOWN_FLAGS = ("s_down", "o_down")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


Row = Mapping[str, object] | Iterable[object]  # one row of SENTINEL REPLICAS, as clients give it


def _row(replica: Row) -> dict[str, object]:
    """A row as a mapping (a client without a parser for it returns ``[name, value, ...]``)."""
    if isinstance(replica, Mapping):
        return {_text(k): v for k, v in replica.items()}
    flat = list(replica)
    return {_text(k): v for k, v in zip(flat[::2], flat[1::2], strict=False)}


def flagged_down(replica: Row) -> bool:
    """Whether one row of ``SENTINEL REPLICAS`` flags the replica down."""
    flags = _row(replica).get("flags", "")
    if isinstance(flags, Iterable) and not isinstance(flags, str | bytes):
        names = {_text(f) for f in flags}  # a parsed set of flags
    else:
        names = set(_text(flags).split(","))
    return bool(names & set(DOWN_FLAGS))


def down_in(replicas: Iterable[Row]) -> set[str]:
    """The addresses (ip:port) of the replicas one Sentinel's ``SENTINEL REPLICAS`` flags down."""
    rows = [_row(r) for r in replicas]
    return {f"{_text(r['ip'])}:{_text(r['port'])}" for r in rows if flagged_down(r)}


def counted_out(views: list[set[str]], attached: set[str] | None) -> int:
    """How many replicas a promise may leave out of its count: flagged down in every
    Sentinel's view (``views``: :func:`down_in` of each that answered), and not attached to
    the primary (``attached``: the ip:port its ``ROLE`` lists; None if it did not answer as a
    primary: then none). ``WAITAOF`` counts every attached replica, so one that is, down to
    the Sentinels, could stand in for a replica they can promote."""
    if not views or attached is None:
        return 0
    return len(set.intersection(*views) - attached)


def address(named: object) -> str:
    """ip:port of a primary as ``SENTINEL GET-MASTER-ADDR-BY-NAME`` names it (a pair); ""
    when the Sentinel knows no primary (None, or a pair without a host)."""
    if not isinstance(named, list | tuple) or len(named) != 2 or not named[0]:
        return ""
    return f"{_text(named[0])}:{_text(named[1])}"


def elsewhere(named: set[str], written: str | None) -> str | None:
    """Why writes made on ``written`` (ip:port) cannot be confirmed there, when the Sentinels
    that answered (``named``: the primary each names, :func:`address`) agree on another
    primary: a failover replaced that server, and a replica it still has will resync from
    the new one, erasing what it confirmed. None when they name ``written``, disagree (a
    failover in progress: no replica is counted out then, and an old primary cannot have
    them all), or ``written`` is not known."""
    if written is None or len(named) != 1 or written in named or "" in named:
        return None
    return f"the Sentinels name primary {next(iter(named))}, the writes went to {written}"


@dataclass
class ReplicasWanted:
    """How many replicas' fsync this process's promises wait for (``promise``: one of
    :data:`PROMISES`; ``floor``: the URL's ``waitaof_replicas``; ``clock``: seconds, monotonic,
    trio's in the node, the runner's own in a runner process)."""

    promise: str
    floor: int
    clock: Callable[[], float]
    known: int = 0  # the most replicas the Sentinels listed so far
    down: int = 0  # of those, how many the last count found flagged down
    asked_at: float | None = None
    recount: bool = False  # a Sentinel said a server went down or came back

    @property
    def counts_replicas(self) -> bool:
        """Whether the Sentinels must be asked at all."""
        return self.promise == EVERY_REPLICA

    def stale(self) -> bool:
        """Whether to ask the Sentinels (again) before the next ``WAITAOF``."""
        if not self.counts_replicas:
            return False
        if self.asked_at is None or self.recount:
            return True
        every = DOWN_REFRESH_S if self.down else REFRESH_S
        return self.clock() - self.asked_at >= every

    def learn(self, listed: int, down: int = 0) -> None:
        """The Sentinels listed ``listed`` replicas of the set, ``down`` of them flagged down
        (asked of several Sentinels: the fewest any of them flagged)."""
        self.known = max(self.known, listed)
        self.down = min(down, listed)
        self.asked_at = self.clock()
        self.recount = False

    def unanswered(self) -> None:
        """No Sentinel answered the count: a replica counted out may be back unseen, so every
        replica counts again until they answer."""
        self.down = 0

    def changed(self) -> None:
        """A Sentinel announced a server down or back (``+sdown``, ``-sdown``): the next
        promise asks them again first."""
        self.recount = True

    def unknown(self) -> str | None:
        """Why no promise can be given yet (the Sentinels never answered), or None."""
        if self.counts_replicas and self.asked_at is None:
            return "promise every-replica: the Sentinels did not say how many replicas there are"
        return None

    @property
    def wanted(self) -> int:
        """The R of ``WAITAOF 1 R``."""
        if self.counts_replicas:
            return max(self.known - self.down, self.floor)
        return self.floor
