"""``bench/wakes.py`` follows a lone round trip along the wake-ups the scheduler recorded.
What it must get right, or each segment's median is another segment's: a thread's wake-up
counts as its process's; the answer is the sandbox's last wake-up of the runner before the
end (a job's output wakes the runner before it); the runner is the one that sent the job to
its sandbox, not the other slot's (woken by Valkey for its own reasons); the client's wake-up
by its submission's reply is not the result's."""

from __future__ import annotations

from bench.wakes import SEGMENTS, Wake, chains, parse_wakes, segment_rows

C, N, V, R1, R2, S1 = 100, 200, 300, 401, 402, 501
KNOWN = {C: "C", N: "N", V: "V", R1: "R", R2: "R"}
NAMES = {C: "python", N: "python", V: "valkey-server", R1: "python", R2: "python", S1: "python"}


def _wake(t_us: float, a: int, b: int) -> Wake:
    return Wake(t_us, a, b, NAMES.get(a, "kworker/0:1"), NAMES.get(b, "kworker/0:1"))


def _trip(t0: float) -> list[Wake]:
    """One round trip starting at ``t0`` with every distraction a real one has."""
    return [
        _wake(t0, C, V),  # the client's MULTI ... EXEC
        _wake(t0 + 100, V, N),  # the supervisor's pop
        _wake(t0 + 101, V, C),  # the EXEC's reply: not the result
        _wake(t0 + 150, C, V),  # the client's blocking pop for the result, not a new message
        _wake(t0 + 600, N, V),  # materialise
        _wake(t0 + 700, V, R2),  # the other slot, woken for its own reasons
        _wake(t0 + 900, V, R1),  # the runner with the job
        _wake(t0 + 950, 999, R1),  # a kernel thread: ignored
        _wake(t0 + 1200, R1, S1),  # the request
        _wake(t0 + 1300, S1, R1),  # the job's output
        _wake(t0 + 1450, S1, R1),  # the answer
        _wake(t0 + 1700, R1, V),  # the end script
        _wake(t0 + 1900, V, C),  # the result
    ]


def test_a_round_trip_is_followed_past_every_distraction() -> None:
    wakes = _trip(0) + _trip(2500) + [_wake(5000, C, V)]
    trips = chains(wakes, KNOWN)
    # the second trip starts at the client's write that closed the first one (t = 2500), but
    # the first's CV2 is that write too: two trips, each whole
    assert len(trips) == 2
    first = trips[0]
    assert [first[k] for k in ("CV", "VN", "NV", "VR", "RS", "SR", "RV", "VC", "CV2")] == [
        0,
        100,
        600,
        900,
        1200,
        1450,
        1700,
        1900,
        2500,
    ]
    rows = {name: p50 for name, _, p50, _ in segment_rows(trips)}
    assert rows["runner: request sent to its sandbox"] == 300  # from its own wake-up
    assert rows["sandbox: the job run, answered"] == 250  # to the answer, not the output
    assert rows["round trip, wake-up to wake-up"] == 2500
    assert len(rows) == len(SEGMENTS) + 1


def test_a_trip_whose_runner_was_not_woken_after_the_materialise_is_dropped() -> None:
    trip = [w for w in _trip(0) if not (w.waker == V and w.wakee == R1)]
    trip.insert(0, _wake(-50, V, R1))  # woken before the materialise: not by this job
    assert chains([*trip, *_trip(2500), _wake(5000, C, V)], KNOWN) == [
        chains([*_trip(2500), _wake(5000, C, V)], KNOWN)[0]
    ]


def test_perf_lines_are_read_by_process() -> None:
    lines = [
        "           time    cpu  task name                       wait time  sch delay   run time",
        "   50265.871315 [0000]  perf[9378]                          awakened: migration/0[18]",
        "   50265.871400 [0001]  python[9362/9358]                   awakened: valkey-server[9345]",
        "   50265.871500 [0000]  valkey-server[9345]                 awakened: python[9358]",
        "   50265.871600 [0000]  Trio thread 1[9401/9358]            awakened: python[9367]",
        "   50265.871700 [0001]  python[9358]                        0.025      0.008      0.002",
    ]
    wakes = parse_wakes(lines)
    assert [(w.waker, w.wakee) for w in wakes] == [
        (9378, 18),
        (9358, 9345),  # the thread 9362 of process 9358
        (9345, 9358),
        (9358, 9367),
    ]
    assert wakes[1].t_us == 50265.8714 * 1e6
    assert wakes[3].waker_comm == "Trio thread 1"
