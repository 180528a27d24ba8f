"""The bench's ratios against the peers are computed from its own rows as they are printed
(bench/peers.py); an instrument that adds a figure twice misreports every run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness import Row
from bench.peers import REPEATS, _cpu_per_job_ms, _efficiency, _repeats, peer_rows, ratio_rows


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


def _compare_file(path: Path) -> None:
    """What compare.sh writes per peer beside its summary line: each repetition's figures."""
    reps = [
        {
            "warm_jobs_per_cpu_s": 1147.0,
            "warm_cpu_ms_per_job_client": 0.214,
            "latency": {"p50_ms": 5.1},
        },
        {
            "warm_jobs_per_cpu_s": 1479.0,
            "warm_cpu_ms_per_job_client": 0.196,
            "latency": {"p50_ms": 5.2},
        },
    ]
    path.write_text(json.dumps({"system": "dramatiq", "summary": {}, "reps": reps}))


def test_a_peer_s_repetitions_are_read_flat(tmp_path: Path) -> None:
    _compare_file(tmp_path / "peer_dramatiq_p2t8.json")
    reps = _repeats(tmp_path / "peer_dramatiq_p2t8.json")
    assert [r["warm_jobs_per_cpu_s"] for r in reps] == [1147.0, 1479.0]
    assert [r["latency_p50_ms"] for r in reps] == [5.1, 5.2]
    assert _repeats(tmp_path / "none.json") == []
    (tmp_path / "bad.json").write_text("{not json")
    assert _repeats(tmp_path / "bad.json") == []


def test_the_peer_rows_show_each_repetition_and_the_cpu_split(tmp_path: Path) -> None:
    """A peer's spread within one run is in the table (min and max of its repetitions), and
    where its CPU per job goes, beside case 1's rows of ours."""
    _compare_file(tmp_path / "peer_dramatiq_p2t8.json")
    summary = {
        "warm_jobs_per_cpu_s": 1313.0,
        "warm_cpu_ms_per_job_client": 0.205,
        "latency_p50_ms": 5.15,
        REPEATS: _repeats(tmp_path / "peer_dramatiq_p2t8.json"),
    }
    rows = {r.metric: r for r in peer_rows({"dramatiq": summary})}
    efficiency = rows["dramatiq: jobs per CPU-second"]
    assert (efficiency.samples, efficiency.median) == ([1147.0, 1479.0], 1313.0)
    assert rows["dramatiq: CPU per job: client"].samples == [0.214, 0.196]
    assert rows["dramatiq: round trip p50"].samples == [5.1, 5.2]
    alone = {r.metric: r for r in peer_rows({"saq": {"warm_jobs_per_cpu_s": 617.0}})}
    assert alone["saq: jobs per CPU-second"].samples == [617.0]


def test_a_ratio_names_its_range_against_the_peer_s_repetitions(tmp_path: Path) -> None:
    """The verdict is on the median; the note says how far the ratio moves with the peer
    alone (its two repetitions), a ratio against our own figures names none."""
    _compare_file(tmp_path / "peer_dramatiq_p2t8.json")
    peers = {
        "dramatiq": {
            "warm_jobs_per_cpu_s": 1313.0,
            REPEATS: _repeats(tmp_path / "peer_dramatiq_p2t8.json"),
        }
    }
    cross = Row("2 cross", "jobs/s submit->last result (N=10)", "jobs/s", [250.0])
    rows = {r.metric: r for r in ratio_rows([*_rows(), cross], peers)}
    cpu = rows["jobs per CPU-second (all processes) / Dramatiq's"]
    assert cpu.samples == [400.0 / 1313.0]
    assert cpu.note.endswith("; 0.27-0.35 against the peer's repetitions")
    assert rows["cross-node jobs/s / local jobs/s"].samples == [0.5]
    assert "repetitions" not in rows["cross-node jobs/s / local jobs/s"].note
