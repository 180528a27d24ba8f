"""A lone job's answer (node/sandbox/host.py ``Sandbox.run``): what the runner reads of the
job's cgroup leaf, and when. A job that exited 0 too quickly to have used its ``cpu_s`` on
every CPU has no count to check: its leaf's counters are read once it was answered
(``keep_spare``), as the next job's start, not on its answer's way. A job that failed, or ran
long enough, still has them read as it answers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node.sandbox import cgroups
from node.sandbox.cgroups import POSSIBLE_CPUS, Counters
from node.sandbox.host import Sandbox
from tests.sandbox.test_sandbox import _box, _run, needs_root


def test_counters_say_when_no_tree_can_have_used_a_cpu_time_since() -> None:
    a_second_ago = Counters(cpu_ns=0, read_at=time.monotonic() - 1.0)
    # one second on every CPU, twice over: within reach
    assert not a_second_ago.cpu_out_of_reach(int(POSSIBLE_CPUS * 2e9))
    assert a_second_ago.cpu_out_of_reach(int(POSSIBLE_CPUS * 2e9 * 1000))
    assert not Counters().cpu_out_of_reach(2**62)  # never read (an error): always in reach
    assert POSSIBLE_CPUS >= (os.cpu_count() or 1)


class Reads:
    """The reads of every leaf's counters, each named by the phase of the test it came in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        self.phase = "run"
        real = cgroups.Leaf.counters

        def counted(leaf: cgroups.Leaf) -> Counters:
            self.seen.append(self.phase)
            return real(leaf)

        monkeypatch.setattr(cgroups.Leaf, "counters", counted)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


def _cgroup_box(tmp_path: Path) -> Sandbox:
    box, _ = _box(tmp_path, "strict")
    if not box.spec.cgroups:
        pytest.skip("no cgroups here")
    return box


@needs_root
def test_a_quick_lone_job_has_its_counters_read_once_answered(tmp_path: Path, reads: Reads) -> None:
    box = _cgroup_box(tmp_path)
    try:
        reply, out, _err = _run(box, tmp_path, "print('first')", kind="python")
        assert (reply["exit_code"], out) == (0, "first\n")
        reads.phase = "answered"
        box.keep_spare()
        reads.seen.clear()
        reads.phase = "run"
        reply, out, _err = _run(box, tmp_path, "print('quick')", kind="python")
        assert (reply["exit_code"], out) == (0, "quick\n")
        assert "bound" not in reply
        assert reads.seen == []  # nothing read on its answer's way
        reads.phase = "answered"
        box.keep_spare()
        assert reads.seen == ["answered"]  # the next job's start, read off its way
        reads.phase = "run"
        reply, _out, _err = _run(box, tmp_path, "raise SystemExit(3)", kind="python")
        assert reply["exit_code"] == 3
        assert reads.seen == [
            "answered",
            "run",
        ]  # a failed job's bound may be a count: read at once
    finally:
        box.stop()


@needs_root
def test_a_batchs_last_quick_job_has_its_counters_read_once_answered(
    tmp_path: Path, reads: Reads
) -> None:
    """A batch's jobs before its last have their counters read as they answer (the next job
    runs by then: its window begins there); the last, like a lone job, once answered."""
    box = _cgroup_box(tmp_path)
    k = 3
    pairs = [
        (
            os.open(tmp_path / f"o{i}", os.O_RDWR | os.O_CREAT),
            os.open(tmp_path / f"e{i}", os.O_RDWR | os.O_CREAT),
        )
        for i in range(k)
    ]
    request = {"kind": "python", "script": "print('hi')", "env": {"HOME": "/job"}}
    try:
        assert box.run(request, *pairs[0])["exit_code"] == 0  # the worker starts
        reads.phase = "answered"
        box.keep_spare()
        reads.seen.clear()
        reads.phase = "batch"
        replies = list(box.run_batch([request] * k, pairs))
        assert [r["exit_code"] for r in replies] == [0] * k
        assert reads.seen == ["batch"] * (k - 1)
        reads.phase = "answered"
        box.keep_spare()
        assert reads.seen == ["batch"] * (k - 1) + ["answered"]
    finally:
        for pair in pairs:
            for fd in pair:
                os.close(fd)
        box.stop()
