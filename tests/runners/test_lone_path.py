"""What a lone job need not pay between its start and its run is done after its end (issue 44,
bench/HISTORY.md#lone-job-latency).

* The slot's output files are emptied once the end of the job that wrote them is recorded
  (``JobRun.empty_logs``, which the loop calls after ``forget``), not between the next job's
  start and its run: the output then does not outlive its job's end in them, and a job whose
  end was recorded elsewhere (the watch thread's, before the process exits) leaves them to the
  next job's start, which still empties them.
* A warm sandbox reads its cgroup leaf's counters once per job, as the job ends; the next job
  starts from those (nothing runs in the leaf between two jobs), counted as the kernel counts
  this process's read calls (``/proc/self/io``)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from bus.core.models import JobStatus
from bus.store.atomic.runs_sync import SyncRuns
from node.sandbox.host import read_counters
from node.slot.spec import RunnerSpec
from node.worker import job as procjob
from node.worker.ending import Reports
from tests.sandbox.test_sandbox import _box
from tests.scripts import SH, command_job_run, sh_job


def test_a_jobs_output_is_gone_from_the_slot_once_its_end_is_recorded(
    tmp_path: Path, redis_url: str
) -> None:
    run = command_job_run(tmp_path, redis_url, SH)
    jobs = run.job_run
    out_file, err_file = jobs.logs
    try:
        first = run(sh_job(1, "echo first-output; echo first-error >&2"))
        assert first.status is JobStatus.FINISHED
        assert first.result["stdout"] == "first-output\n"
        # until its end is recorded, the output stays where adoption reads it
        assert out_file.read_text() == "first-output\n"
        assert err_file.read_text() == "first-error\n"
        jobs.empty_logs()  # the loop's step once the end is recorded (after forget)
        assert (out_file.read_text(), err_file.read_text()) == ("", "")

        second = run(sh_job(2, "echo second"))
        assert (second.result["stdout"], second.result["stderr"]) == ("second\n", "")
        # no empty_logs after this one: the next job's start empties what it left
        third = run(sh_job(3, "echo third"))
        assert (third.result["stdout"], third.result["stderr"]) == ("third\n", "")
        assert out_file.read_text() == "third\n"
    finally:
        jobs.sandbox.stop()


def _reads() -> int:
    """Read calls this process made so far, as the kernel counts them (read, pread, ...)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup leaf per sandbox needs root here")
def test_a_warm_sandbox_reads_its_cgroup_counters_once_per_job(tmp_path: Path) -> None:
    box, _ = _box(tmp_path, "strict")
    files = [os.open(tmp_path / n, os.O_RDWR | os.O_CREAT, 0o600) for n in ("out", "err")]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/job"}
    request = {"kind": "sh", "script": "echo hi", "argv": ["/bin/sh", "-s"], "env": env}
    try:
        assert box.run(request, *files)["exit_code"] == 0  # the worker starts with this one
        if box.leaf is None:
            pytest.skip("no cgroup leaf on this host: no counters are read")
        own = _reads()
        own = _reads() - own  # what reading the count costs itself
        before = _reads()
        read_counters(box.leaf.counted)
        one_read = _reads() - before - own  # the counters' files, each read once
        assert one_read > 0
        per_job = []
        for _ in range(3):
            before = _reads()
            assert box.run(request, *files)["exit_code"] == 0
            per_job.append(_reads() - before - own)
        assert per_job == [one_read] * 3  # was twice that: before the job and after it
    finally:
        for fd in files:
            os.close(fd)
        box.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup leaf per sandbox needs root here")
def test_a_batch_reads_its_cgroup_counters_once_per_job(tmp_path: Path) -> None:
    """Within a batch too (bench/HISTORY.md#runner-cpu): each job's counters are read as it
    answers, and the next job's window begins there."""
    box, _ = _box(tmp_path, "strict")
    k = 4
    pairs = [
        tuple(os.open(tmp_path / f"{n}{i}", os.O_RDWR | os.O_CREAT, 0o600) for n in ("o", "e"))
        for i in range(k)
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/job"}
    request = {"kind": "python", "script": "print('hi')", "env": env}
    try:
        assert box.run(request, *pairs[0])["exit_code"] == 0  # the worker starts with this one
        if box.leaf is None:
            pytest.skip("no cgroup leaf on this host: no counters are read")
        own = _reads()
        own = _reads() - own
        before = _reads()
        read_counters(box.leaf.counted)
        one_read = _reads() - before - own
        assert one_read > 0
        before = _reads()
        replies = list(box.run_batch([request] * k, pairs))
        counted = _reads() - before - own  # the answers' socket receives are no read calls
        assert [r["exit_code"] for r in replies] == [0] * k
        assert counted == k * one_read  # was twice that: before each job and after it
    finally:
        for pair in pairs:
            for fd in pair:
                os.close(fd)
        box.stop()


def _writes() -> int:
    """Write calls this process made so far, as the kernel counts them."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/self/io")


def test_a_lone_job_tells_its_node_nothing_and_a_stream_one_line_per_few_jobs(
    tmp_path: Path, sync_runs: SyncRuns
) -> None:
    """A lone job leaves its runner idle, and going idle tells the node nothing: the job's end
    is in the statistics its last script wrote, and the supervisor's backpressure needs the
    count of jobs taken only from slots that keep taking (node/worker/ending.py
    ``Reports.flush``). A stream reports its jobs taken every ``taken_every``; a rare event's
    counter goes at once with what was taken, in one write the node reads in one wake-up."""
    spec = RunnerSpec("", 1, "python", 0, [], "", "n:b:1:python:0", 15_000, str(tmp_path),
                      1000, 60, "n", True, 10)  # fmt: skip
    spec = replace(spec, taken_every=4)
    reports = Reports(spec, sync_runs)
    theirs, ours = os.pipe()
    os.set_blocking(theirs, False)
    saved, procjob.PROCESS.report = procjob.PROCESS.report, ours
    try:
        reports.took()
        reports.flush(idle=True)  # the lone job's runner waits for more
        with pytest.raises(BlockingIOError):
            os.read(theirs, 4096)
        for _ in range(3):
            reports.took()  # the fourth job taken since the last report
        assert os.read(theirs, 4096) == b"t4\n"
        reports.took()
        reports.count("stale_results")
        own = _writes()
        own = _writes() - own  # what reading the count costs itself (nothing, mostly)
        before = _writes()
        reports.flush(idle=True)
        assert _writes() - before - own == 1  # one write for both lines
        assert os.read(theirs, 4096) == b't1\nc{"stale_results":1}\n'
    finally:
        procjob.PROCESS.report = saved
        os.close(theirs)
        os.close(ours)
