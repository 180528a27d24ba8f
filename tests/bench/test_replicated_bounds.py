"""Case 9's CPU bounds are computed from its own CPU rows as they are printed
(bench/replicated.py): a bound that counted a process twice, or forgot one, would misstate
what the machine allows the replicated store."""

from __future__ import annotations

import pytest

from bench.replicated import cpu_bounds

UNIX = {"bench client": 0.5, "node": 0.5, "node job processes": 1.1, "valkey": 0.5, "total": 2.6}
REPL = {
    "bench client": 0.7,
    "node": 0.6,
    "node job processes": 1.4,
    "valkey primary": 0.75,
    "valkey replicas": 0.7,
    "sentinels": 0.05,
    "total": 4.2,
}


def test_the_ceiling_counts_only_the_replicas_above_the_single_valkey() -> None:
    ceiling, _ = cpu_bounds(UNIX, REPL)
    assert ceiling == pytest.approx(2.6 / 3.3)  # 0.79: under 0.8 whatever the node does


def test_off_these_cores_leaves_out_the_replicas_and_the_sentinels() -> None:
    _, off = cpu_bounds(UNIX, REPL)
    assert off == pytest.approx(2.6 / 3.45)


def test_without_replicas_both_bounds_are_the_plain_cpu_ratio() -> None:
    alone = {k: v for k, v in REPL.items() if k not in ("valkey replicas", "sentinels")}
    alone["total"] = 3.45
    assert cpu_bounds(UNIX, alone) == (pytest.approx(1.0), pytest.approx(2.6 / 3.45))
