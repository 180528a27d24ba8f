"""The bench's ratios against the peers are computed from its own rows as they are printed
(bench/peers.py); an instrument that adds a figure twice misreports every run."""

from __future__ import annotations

from bench.harness import Row
from bench.peers import _cpu_per_job_ms, _efficiency


def _rows() -> list[Row]:
    one = "1 local"
    return [
        Row(one, "CPU per job: bench client", "ms", [0.5]),
        Row(one, "CPU per job: node A", "ms", [0.5]),
        Row(one, "CPU per job: node A job processes", "ms", [1.0]),
        Row(one, "CPU per job: node A job processes: runners", "ms", [0.75]),
        Row(one, "CPU per job: node A job processes: sandboxes", "ms", [0.25]),
        Row(one, "CPU per job: valkey A", "ms", [0.5]),
        Row("2 cross", "CPU per job: node B", "ms", [9.0]),
        Row(one, "jobs/s submit->last result (N=10)", "jobs/s", [500.0]),
    ]


def test_cpu_per_job_counts_each_process_once_and_only_its_case() -> None:
    assert _cpu_per_job_ms(_rows(), "1 local") == 2.5  # the split rows are in the 1.0
    assert _efficiency(_rows()) == 400.0  # jobs per CPU-second
    assert _cpu_per_job_ms(_rows(), "9 replicated") is None
