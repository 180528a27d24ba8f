"""A runner's output files between two jobs (node/worker/job.py ``_emptied``,
bench/HISTORY.md#runner-syscalls): the next job's output is exactly its own. A job that moved
its file's offset without writing leaves an empty file whose shared offset is not 0; the next
job's output still starts at 0 (no hole of zero bytes before it). And what a job wrote is read
back from the file's head as it was from its size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bus.core.models import JobStatus
from node.slot import outcomes
from tests.scripts import SH, command_job_run, sh_job


def test_a_job_that_moved_its_empty_outputs_offset_leaves_the_next_job_its_own_output(
    tmp_path: Path, redis_url: str
) -> None:
    run = command_job_run(tmp_path, redis_url, SH)
    jobs = run.job_run
    # the shell's own fds 1 and 2 are the slot's files' open descriptions: moved, not written
    seek = "/usr/bin/python3 -c 'import os; os.lseek(1, 4096, 0); os.lseek(2, 4096, 0)'"
    try:
        moved = run(sh_job(1, seek))
        assert (moved.status, moved.result["stdout"], moved.result["stderr"]) == (
            JobStatus.FINISHED,
            "",
            "",
        )
        jobs.empty_logs()
        after = run(sh_job(2, "echo out; echo err >&2"))
        assert (after.result["stdout"], after.result["stderr"]) == ("out\n", "err\n")
        # and with no empty_logs between (a job whose end was recorded elsewhere)
        run(sh_job(3, seek))
        last = run(sh_job(4, "echo out; echo err >&2"))
        assert (last.result["stdout"], last.result["stderr"]) == ("out\n", "err\n")
    finally:
        jobs.sandbox.stop()


def test_a_file_the_last_job_left_empty_is_not_truncated_and_one_it_wrote_is(
    tmp_path: Path, redis_url: str
) -> None:
    """A file the job that answered left empty is only rewound (an ftruncate of an empty file
    still journals its inode), one it wrote is emptied: the next job's output is its own, with
    empty_logs between the two jobs or without."""
    run = command_job_run(tmp_path, redis_url, SH)
    jobs = run.job_run
    try:
        first = run(sh_job(1, "echo out"))
        assert (first.result["stdout"], first.result["stderr"]) == ("out\n", "")
        assert jobs.logs_sizes == (4, 0)
        jobs.empty_logs()
        assert jobs.logs_sizes is None
        assert jobs.log_fds is not None
        assert os.fstat(jobs.log_fds[0]).st_size == 0
        second = run(sh_job(2, "echo err >&2"))
        assert (second.result["stdout"], second.result["stderr"]) == ("", "err\n")
        third = run(sh_job(3, "true"))  # no empty_logs before it: emptied at its start
        assert (third.result["stdout"], third.result["stderr"]) == ("", "")
    finally:
        jobs.sandbox.stop()


SIZES = [0, 3, 4095, 4097, outcomes.HEAD_BYTES, outcomes.HEAD_BYTES + 5, 200_000]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("limit", [0, 10, 65_536, 1_000_000])
def test_an_output_read_from_its_head_is_what_reading_its_size_gave(
    tmp_path: Path, size: int, limit: int
) -> None:
    """The output and its stderr tail read with one pread where the file is short, as an fstat
    of its size and reads of that gave them (two system calls a file, one now)."""
    data = bytes(range(256)) * (size // 256) + b"y" * (size % 256)
    path = tmp_path / "out"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        w = outcomes.written(fd)
        assert w.size == size
        assert outcomes.tail_of(fd, w, 4096) == data[-4096:]
        text = data[: min(size, limit)].decode("utf-8", "replace")
        expected = text + (f"\n[... {size - limit} more bytes cut]" if size > limit else "")
        assert outcomes.read_back(fd, w, limit) == (expected if size else "")
    finally:
        os.close(fd)
