"""What a lone job need not pay between its start and its run is done after its end (issue 44,
bench/HISTORY.md#lone-job-latency).

The slot's output files are emptied once the end of the job that wrote them is recorded
(``JobRun.empty_logs``, which the loop calls after ``forget``), not between the next job's start
and its run: the output then does not outlive its job's end in them, and a job whose end was
recorded elsewhere (the watch thread's, before the process exits) leaves them to the next
job's start, which still empties them."""

from __future__ import annotations

from pathlib import Path

from bus.core.models import JobStatus, RunnerJob
from tests.scripts import command_job_run

SH = ["/bin/sh", "-s"]


def _job(ident: int, script: str) -> RunnerJob:
    return RunnerJob(1, ident, 1, script, "sh", timeout=60)


def test_a_jobs_output_is_gone_from_the_slot_once_its_end_is_recorded(
    tmp_path: Path, redis_url: str
) -> None:
    run = command_job_run(tmp_path, redis_url, SH)
    jobs = run.job_run
    out_file, err_file = jobs.logs
    try:
        first = run(_job(1, "echo first-output; echo first-error >&2"))
        assert first.status is JobStatus.FINISHED
        assert first.result["stdout"] == "first-output\n"
        # until its end is recorded, the output stays where adoption reads it
        assert out_file.read_text() == "first-output\n"
        assert err_file.read_text() == "first-error\n"
        jobs.empty_logs()  # the loop's step once the end is recorded (after forget)
        assert (out_file.read_text(), err_file.read_text()) == ("", "")

        second = run(_job(2, "echo second"))
        assert (second.result["stdout"], second.result["stderr"]) == ("second\n", "")
        # no empty_logs after this one: the next job's start empties what it left
        third = run(_job(3, "echo third"))
        assert (third.result["stdout"], third.result["stderr"]) == ("third\n", "")
        assert out_file.read_text() == "third\n"
    finally:
        jobs.sandbox.stop()
