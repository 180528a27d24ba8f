"""The node's recent history for the console's charts: its job counters, latency histograms
and queue depths, sampled into a small ring in memory.

Every ``every_s`` (5 s) the sampler reads what the metrics already keep (node/observe/metrics.py):
each context's ``stats:jobs`` (job counts and the per-bucket latency histograms that
stats_jobs.lua counts) and the depths of the lists the node's slots consume. A ring of ``keep``
(120) samples holds the last 10 minutes: ~1 KB a sample, whatever the load. The charts are
differences of neighbouring samples, computed when a page asks (:func:`series`): jobs per
second from counter deltas over the sampler's own clock (trio's, so a late tick does not bend
a rate), p50/p99 from the histogram's new observations in that interval, interpolated within
their bucket as Prometheus' ``histogram_quantile`` does. A counter that went down (its context
DB flushed) counts from zero again. A tick whose read failed leaves a gap; the next rate spans
both intervals.

The sampler runs in the console's nursery: a node without a console samples nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import trio

from bus.core import keys
from bus.core.ids import now_ms
from bus.core.stats import STATS_BUCKETS_S
from bus.errors import BusError
from bus.store import records
from node.observe.metrics import bucket_counts
from node.state import NodeState

log = logging.getLogger(__name__)

SAMPLE_EVERY_S: Final = 5.0
RING_SAMPLES: Final = 120  # at 5 s: the last 10 minutes
# the counts a chart shows per second: stats:jobs event (and status, for an ending)
RATES: Final = {
    "submitted": ("submitted", ""),
    "finished": ("ended", "finished"),
    "failed": ("ended", "error"),
    "retried": ("ended", "retry"),
}
# histograms of stats:jobs: a job's round trip (submitted here, result here), and its run
# (an attempt's start to its end, where it ran)
HISTOGRAMS: Final = {"roundtrip": "roundtrip", "run": "duration"}
QUANTILES: Final = {"p50": 0.5, "p99": 0.99}
BUCKETS: Final = len(STATS_BUCKETS_S) + 1  # and +Inf


@dataclass(frozen=True)
class Sample:
    """What the node counted up to one tick: ``clock_s`` on trio's clock, ``at`` in Unix s."""

    clock_s: float
    at: float
    counts: Mapping[str, int] = field(default_factory=dict)  # RATES name -> total
    histograms: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # per-bucket counts
    depths: Mapping[str, int] = field(default_factory=dict)  # list name -> entries


# -- pure: a sample from what Valkey holds, and the charts from samples ------------------------


def counts_of(stats: Iterable[Mapping[str, str]]) -> dict[str, int]:
    """The RATES totals of some contexts' ``stats:jobs`` (merged_fields: decimal strings)."""
    totals = dict.fromkeys(RATES, 0)
    for fields in stats:
        for name, value in fields.items():
            event, *parts = name.split("|")
            for rate, (wanted, status) in RATES.items():
                if event == wanted and (not status or parts[1:2] == [status]):
                    totals[rate] += _whole(value)
    return totals


def histogram_of(stats: Iterable[Mapping[str, str]], field_name: str) -> tuple[int, ...]:
    """Observations per bucket (STATS_BUCKETS_S, then +Inf) of ``field_name`` in some contexts'
    ``stats:jobs``, all script types together."""
    out = [0] * BUCKETS
    labels = [str(b) for b in STATS_BUCKETS_S] + ["+Inf"]
    for fields in stats:
        for by_le in bucket_counts(fields, field_name).values():
            for i, label in enumerate(labels):
                out[i] += by_le.get(label, 0)
    return tuple(out)


def sample_of(
    clock_s: float, at: float, stats: Sequence[Mapping[str, str]], depths: Mapping[str, int]
) -> Sample:
    return Sample(
        clock_s,
        at,
        counts_of(stats),
        {name: histogram_of(stats, f) for name, f in HISTOGRAMS.items()},
        dict(depths),
    )


def increase(before: int, after: int) -> int:
    """How much a counter grew: from zero again if it went down (it was reset)."""
    return after - before if after >= before else after


def rate(before: Sample, after: Sample, name: str) -> float:
    """``name`` per second between two samples (0 if no time passed)."""
    elapsed = after.clock_s - before.clock_s
    if elapsed <= 0:
        return 0.0
    return increase(before.counts.get(name, 0), after.counts.get(name, 0)) / elapsed


def quantile(q: float, buckets: Sequence[int]) -> float | None:
    """The ``q`` quantile (seconds) of observations counted per bucket (STATS_BUCKETS_S, then
    +Inf), interpolated linearly within its bucket; the largest finite bound if it falls in
    +Inf; None without observations."""
    total = sum(buckets)
    if total <= 0:
        return None
    rank, seen = q * total, 0
    for i, count in enumerate(buckets):
        if count and seen + count >= rank:
            if i >= len(STATS_BUCKETS_S):
                return float(STATS_BUCKETS_S[-1])
            lower = float(STATS_BUCKETS_S[i - 1]) if i else 0.0
            upper = float(STATS_BUCKETS_S[i])
            return lower + (upper - lower) * max(rank - seen, 0) / count
        seen += count
    return float(STATS_BUCKETS_S[-1])


def new_observations(before: Sequence[int], after: Sequence[int]) -> list[int]:
    return [increase(b, a) for b, a in zip(before, after, strict=True)]


def series(samples: Sequence[Sample], every_s: float) -> dict[str, Any]:
    """The charts' data, one point per pair of neighbouring samples, oldest first (columns):
    ``at`` (Unix s), ``rates`` (per second), ``latency_ms`` (``roundtrip_p50`` ...: null where
    no job ended in the interval) and ``depths`` (entries, at the later sample)."""
    pairs = list(zip(samples, samples[1:], strict=False))
    names = sorted({name for s in samples[1:] for name in s.depths})
    latency: dict[str, list[float | None]] = {}
    for hist in HISTOGRAMS:
        for label, q in QUANTILES.items():
            column = latency[f"{hist}_{label}"] = []
            for before, after in pairs:
                empty = (0,) * BUCKETS
                fresh = new_observations(
                    before.histograms.get(hist, empty), after.histograms.get(hist, empty)
                )
                seconds = quantile(q, fresh)
                column.append(None if seconds is None else round(seconds * 1000, 1))
    return {
        "every_s": every_s,
        "at": [after.at for _, after in pairs],
        "rates": {
            name: [round(rate(before, after, name), 3) for before, after in pairs] for name in RATES
        },
        "latency_ms": latency,
        "depths": {name: [after.depths.get(name, 0) for _, after in pairs] for name in names},
    }


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


# -- the service -------------------------------------------------------------------------------

Read = Callable[[], Awaitable[tuple[list[dict[str, str]], dict[str, int]]]]


class Sampler:
    """The ring of the last ``keep`` samples of ``read`` (each context's ``stats:jobs``, and
    list depths), one every ``every_s`` of trio's clock; ``wall`` stamps them (Unix s)."""

    def __init__(
        self,
        read: Read,
        every_s: float = SAMPLE_EVERY_S,
        keep: int = RING_SAMPLES,
        wall: Callable[[], float] = lambda: now_ms() / 1000,
    ) -> None:
        self.read, self.every_s, self.wall = read, every_s, wall
        self.ring: deque[Sample] = deque(maxlen=keep + 1)  # keep points need keep + 1 samples
        self._failing = False

    def series(self) -> dict[str, Any]:
        return series(list(self.ring), self.every_s)

    async def tick(self) -> None:
        """Take one sample; a failed read is logged (once per outage) and leaves a gap."""
        try:
            stats, depths = await self.read()
        except BusError as exc:
            if not self._failing:
                log.warning("charts: cannot sample the node's Valkey (%s); a gap follows", exc)
            self._failing = True
            return
        self._failing = False
        self.ring.append(sample_of(trio.current_time(), self.wall(), stats, depths))

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Sample now, report started, then every ``every_s`` (on deadlines: a slow read does
        not shift the ticks). Never raises for Valkey's failures (see :meth:`tick`)."""
        next_at = trio.current_time()
        await self.tick()
        task_status.started()
        while True:
            next_at = max(next_at + self.every_s, trio.current_time())
            await trio.sleep_until(next_at)
            await self.tick()


def node_reader(node: NodeState) -> Read:
    """What the sampler reads of a node: each context's ``stats:jobs``, and the depths of
    ``msg_out``, ``msg_in``, each runner type's queue and ``dlq`` (summed over contexts), and
    of the peers' outboxes (``outbox``: waiting to be sent, all peers)."""

    async def read() -> tuple[list[dict[str, str]], dict[str, int]]:
        store, config = node.store, node.config
        names = [keys.MSG_OUT, keys.MSG_IN, *(keys.queue(t) for t in sorted(config.runners))]
        names.append(keys.DLQ)
        stats, depths = [], dict.fromkeys(names, 0)
        for ctx in await store.context_ids():
            stats.append(await records.job_stats(store, ctx))
            for name, n in zip(names, await records.depths(store, ctx, names), strict=True):
                depths[name] += n
        depths["outbox"] = 0
        for peer_id in sorted(node.peers.known):
            depths["outbox"] += (await records.outbox_depths(store, peer_id))[0]
        return stats, depths

    return read
