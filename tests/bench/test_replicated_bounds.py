"""Case 9's CPU bounds are computed from its own CPU rows as they are printed
(bench/replicated.py): a bound that counted a process twice, or forgot one, would misstate
what the machine allows the replicated store."""

from __future__ import annotations

import pytest

from bench.cases import Throughput
from bench.replicated import _cpu_ms, cpu_bounds

UNIX = {"bench client": 0.5, "node": 0.5, "node job processes": 1.1, "valkey": 0.5, "total": 2.6}
TCP = {"bench client": 0.55, "node": 0.5, "node job processes": 1.15, "valkey": 0.5, "total": 2.7}
REPL = {
    "bench client": 0.7,
    "node": 0.6,
    "node job processes": 1.4,
    "valkey primary": 0.75,
    "valkey replicas": 0.7,
    "sentinels": 0.05,
    "total": 4.2,
    "node job processes: runners": 0.9,  # a split of "node job processes", not in the total
}


def test_the_ceiling_adds_only_the_replicas_to_the_store_over_tcp() -> None:
    ceiling, _ = cpu_bounds(UNIX, TCP, REPL)
    assert ceiling == pytest.approx(2.6 / 3.4)


def test_off_these_cores_leaves_out_the_replicas_and_the_sentinels() -> None:
    _, off = cpu_bounds(UNIX, TCP, REPL)
    assert off == pytest.approx(2.6 / 3.45)


def test_without_replicas_the_ceiling_is_the_transport_alone() -> None:
    alone = {k: v for k, v in REPL.items() if k not in ("valkey replicas", "sentinels")}
    alone["total"] = 3.45
    assert cpu_bounds(UNIX, TCP, alone) == (pytest.approx(2.6 / 2.7), pytest.approx(2.6 / 3.45))


def test_cpu_per_job_counts_the_job_processes_once_and_sums_the_replicas() -> None:
    seconds = {
        "node": 0.5,
        "node job processes": 1.0,
        "node job processes: runners": 0.75,  # the split of the line above
        "node job processes: sandboxes": 0.25,
        "valkey primary": 0.5,
        "valkey replica 1": 0.25,
        "valkey replica 2": 0.25,
        "sentinel 1": 0.25,
    }
    cpu = _cpu_ms(Throughput(n=1000, submit_s=1.0, total_s=1.0, errors=0, cpu=seconds))
    assert cpu["total"] == pytest.approx(2.75)
    assert cpu["valkey replicas"] == pytest.approx(0.5)
    assert cpu["sentinels"] == pytest.approx(0.25)
    assert cpu["node job processes: runners"] == pytest.approx(0.75)
