"""The console's chart sampler (node/observe/sampler.py): its arithmetic as plain functions,
and its ring on trio's autojump clock. The same data through a real node is checked in
test_console_charts.py."""

from __future__ import annotations

import pytest
import trio

from bus.errors import StoreError
from node.observe.sampler import (
    BUCKETS,
    Sample,
    Sampler,
    counts_of,
    histogram_of,
    quantile,
    rate,
    series,
)


def buckets(**by_bound: int) -> tuple[int, ...]:
    """Per-bucket counts by bound index name (``b2=5``: five in STATS_BUCKETS_S[2])."""
    out = [0] * BUCKETS
    for name, n in by_bound.items():
        out[int(name[1:])] = n
    return tuple(out)


def sample(
    clock_s: float, *, finished: int = 0, run: tuple[int, ...] | None = None, **depths: int
) -> Sample:
    return Sample(
        clock_s,
        1_700_000_000 + int(clock_s),
        {"finished": finished},
        {"run": run or (0,) * BUCKETS},
        depths,
    )


STATS = {
    "submitted|python": "7",
    "ended|python|finished|": "5",
    "ended|sh|finished|": "2",
    "ended|python|error|exit_code": "1",
    "ended|python|retry|timeout": "3",
    "answered|python|finished|": "4",
    "duration|python|0.01": "4",
    "duration|sh|0.01": "1",
    "duration|python|+Inf": "2",
    "duration_sum|python": "9.5",
    "roundtrip|python|0.5": "4",
}


def test_counts_add_up_events_of_every_type_and_context():
    other_context = {"ended|python|finished|": "10", "submitted|sh": "1"}
    totals = counts_of([STATS, other_context])
    assert totals == {"submitted": 8, "finished": 17, "failed": 1, "retried": 3}


def test_histogram_sums_types_per_bucket_and_keeps_inf():
    hist = histogram_of([STATS], "duration")
    assert hist[1] == 5  # 0.01: python 4 + sh 1
    assert hist[-1] == 2  # +Inf
    assert sum(hist) == 7
    assert sum(histogram_of([STATS], "roundtrip")) == 4


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        # all 100 in (0.01, 0.025]: interpolated within it
        (0.5, buckets(b2=100), 0.01 + 0.015 * 0.5),
        (0.99, buckets(b2=100), 0.01 + 0.015 * 0.99),
        # 50 in the first bucket (0, 0.005], 50 in (1, 2.5]: p50 ends the first, p99 near 2.5
        (0.5, buckets(b0=50, b8=50), 0.005),
        (0.99, buckets(b0=50, b8=50), 1 + 1.5 * 0.98),
        # past the last finite bound: that bound
        (0.99, buckets(b0=1, b15=99), 3600.0),
    ],
)
def test_quantile_interpolates_within_its_bucket(q, counts, expected):
    assert quantile(q, counts) == pytest.approx(expected)


def test_quantile_of_nothing_is_none():
    assert quantile(0.5, buckets()) is None


def test_rate_is_the_counter_delta_over_the_samplers_clock():
    assert rate(sample(10, finished=4), sample(15, finished=14), "finished") == 2.0
    # a reset (the context's DB flushed): counted from zero, never negative
    assert rate(sample(10, finished=40), sample(15, finished=5), "finished") == 1.0
    assert rate(sample(10, finished=4), sample(10, finished=9), "finished") == 0.0


def test_series_has_one_point_per_pair_with_latency_of_the_interval_only():
    samples = [
        sample(0, finished=0, run=buckets(), msg_in=3),
        sample(5, finished=10, run=buckets(b2=10), msg_in=1),
        sample(10, finished=10, run=buckets(b2=10), msg_in=0, outbox=2),
        sample(20, finished=30, run=buckets(b2=10, b7=20), msg_in=0, outbox=0),
    ]
    out = series(samples, 5.0)
    assert out["at"] == [1_700_000_005, 1_700_000_010, 1_700_000_020]
    assert out["rates"]["finished"] == [2.0, 0.0, 2.0]  # the gap: 20 over 10 s
    p50 = out["latency_ms"]["run_p50"]
    assert p50[0] == pytest.approx(17.5)  # ten in (10, 25] ms
    assert p50[1] is None  # nothing ended in that interval
    assert p50[2] == pytest.approx(500 + 500 * 0.5)  # the 20 new ones, in (0.5, 1] s
    assert out["latency_ms"]["roundtrip_p99"] == [None, None, None]
    assert out["depths"] == {"msg_in": [1, 0, 0], "outbox": [0, 2, 0]}


def test_series_of_one_sample_has_no_points():
    out = series([sample(0, finished=3, msg_in=1)], 5.0)
    assert out["at"] == []
    assert out["rates"]["finished"] == []


async def test_sampler_ticks_on_its_clock_keeps_a_bounded_ring_and_survives_a_failed_read(
    autojump_clock,
):
    finished = {"n": 0}
    fail_at = {3}
    reads = {"n": 0}

    async def read() -> tuple[list[dict[str, str]], dict[str, int]]:
        reads["n"] += 1
        if reads["n"] in fail_at:
            raise StoreError("Valkey went away")
        finished["n"] += 10
        return [{"ended|python|finished|": str(finished["n"])}], {"queue:python": reads["n"]}

    sampler = Sampler(read, every_s=5.0, keep=4, wall=lambda: int(trio.current_time()))
    async with trio.open_nursery() as nursery:
        await nursery.start(sampler.run)
        assert len(sampler.ring) == 1  # the first sample is taken before started
        await trio.sleep(12)  # ticks at 5 and 10: the second read fails
        assert [s.clock_s for s in sampler.ring] == [0.0, 5.0]
        await trio.sleep(5)  # tick at 15
        out = sampler.series()
        assert out["rates"]["finished"] == [2.0, 1.0]  # 10 in 5 s, then 10 over the gap
        assert out["depths"]["queue:python"] == [2, 4]
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert len(sampler.ring) == 5  # keep points: keep + 1 samples
    assert sampler.series()["at"] == [60, 65, 70, 75]
