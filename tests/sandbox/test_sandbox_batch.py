"""A batch of jobs in one request to a warm sandboxed worker (node/sandbox/host.py
``run_batch``): each job still alone in what it may see and keep, its answer as it ends; a job
that ends the job process, or a kill (a timeout, a stop), leaves the jobs after it unrun, for
the runner to give back, never run twice.

Each test has its control: the same probe shows the jobs of one batch shared a process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from node.sandbox.host import Sandbox
from node.sandbox.spawn import SandboxLost
from tests.sandbox.test_sandbox import _box, needs_root

pytestmark = needs_root

# what each job prints: its pid, a mark an earlier job of its process left, its own variable,
# its cwd and umask; then it leaves a mark and a file in /tmp for the next job to find
PROBE = (
    "import builtins, os, sys\n"
    "print(os.getpid(), getattr(builtins, 'hero_mark', None), os.environ['OWN'],"
    " os.getcwd(), oct(os.umask(0o077)), sorted(os.listdir('/tmp')))\n"
    "print('err', os.environ['OWN'], file=sys.stderr)\n"
    "builtins.hero_mark = os.environ['OWN']\n"
    "os.chdir('/tmp'); os.umask(0); os.environ['LEFT'] = '1'\n"
    "open('/tmp/left-' + os.environ['OWN'], 'w').close()\n"
)


def _request(script: str, own: str) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/job", "OWN": own}
    return {"kind": "python", "script": script, "env": env}


class _Files:
    """A pair of output files per job, as the runner gives each job of a batch its own."""

    def __init__(self, tmp_path: Path, n: int, tag: str = "") -> None:
        self.paths = [(tmp_path / f"out{tag}{i}", tmp_path / f"err{tag}{i}") for i in range(n)]
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        self.fds = [(os.open(o, flags, 0o600), os.open(e, flags, 0o600)) for o, e in self.paths]

    def out(self, i: int) -> str:
        return self.paths[i][0].read_text()

    def err(self, i: int) -> str:
        return self.paths[i][1].read_text()

    def close(self) -> None:
        for pair in self.fds:
            for fd in pair:
                os.close(fd)


def _batch(
    box: Sandbox, tmp_path: Path, scripts: list[str], tag: str = ""
) -> tuple[list[dict], _Files]:
    files = _Files(tmp_path, len(scripts), tag)
    requests = [_request(s, f"job{i}") for i, s in enumerate(scripts)]
    try:
        return list(box.run_batch(requests, files.fds)), files
    finally:
        files.close()


def test_a_batchs_jobs_share_a_process_yet_each_has_its_own_env_cwd_output_and_tmp(
    tmp_path: Path,
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        replies, files = _batch(box, tmp_path, [PROBE] * 3)
    finally:
        box.stop()
    assert [r["exit_code"] for r in replies] == [0, 0, 0]
    seen = [files.out(i).split(" ", 2) for i in range(3)]
    assert {pid for pid, _, _ in seen} == {seen[0][0]}  # the control: one process ran all three
    assert [mark for _, mark, _ in seen] == ["None", "job0", "job1"]
    first_tmp = seen[0][2].split(" ", 3)[3]
    for i, (_, _, rest) in enumerate(seen):
        own, cwd, umask, tmp = rest.split(" ", 3)
        assert (own, cwd, umask) == (f"job{i}", "/job", "0o77")  # its own variable, cwd, umask
        # and a /tmp without the files of the jobs before it (mount points of the sandbox's own
        # binds may show there: a checkout under /tmp does)
        assert tmp == first_tmp
        assert "left-" not in tmp
        assert files.err(i) == f"err job{i}\n"


def test_what_a_job_leaves_in_the_process_sends_the_rest_of_the_batch_to_a_new_one(
    tmp_path: Path,
) -> None:
    """A job that leaves a thread running: the jobs after it run in a fresh process, each
    once (none is lost, none runs twice)."""
    box, _ = _box(tmp_path, "strict")
    thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    try:
        replies, files = _batch(box, tmp_path, [PROBE, PROBE + thread, PROBE, PROBE])
    finally:
        box.stop()
    assert [r["exit_code"] for r in replies] == [0, 0, 0, 0]
    seen = [files.out(i).split() for i in range(4)]
    assert seen[0][0] == seen[1][0] != seen[2][0] == seen[3][0]
    assert [s[1] for s in seen] == ["None", "job0", "None", "job2"]


@pytest.mark.parametrize(
    "ender", ["import os\nos._exit(3)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]
)
def test_a_job_that_ends_the_process_leaves_the_rest_of_its_batch_unrun(
    tmp_path: Path, ender: str
) -> None:
    """The worker answers for the job the process ended in; the jobs after it never ran (no
    output, no trace in the work dir), for the runner to give back. The sandbox serves on."""
    box, _ = _box(tmp_path, "strict")
    marker = "open(os.path.join(os.environ['HOME'], os.environ['OWN']), 'w').close()\n"
    job = "import os\n" + marker
    try:
        replies, files = _batch(box, tmp_path, [job, job + ender, job, job])
        after, again = _batch(box, tmp_path, [PROBE], "again")
    finally:
        box.stop()
    assert len(replies) == 2  # the two after it: not run
    assert replies[0]["exit_code"] == 0
    assert (replies[1]["exit_code"], replies[1]["signal"]) in ((3, 0), (None, 9))
    work = Path(box.spec.work_dir)
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("job")) == ["job0", "job1"]
    assert files.out(2) == files.out(3) == files.err(2) == files.err(3) == ""
    assert after[0]["exit_code"] == 0, again.err(0)


def test_a_kill_in_a_batch_ends_that_job_and_leaves_the_rest_unrun(tmp_path: Path) -> None:
    """The runner's kill of the sandbox (a job's timeout, a stop) while a batch runs: the job
    before it answered, the one running gets SandboxLost, the ones after never ran."""
    box, _ = _box(tmp_path, "strict")
    marker = "import os\nopen(os.path.join(os.environ['HOME'], os.environ['OWN']), 'w').close()\n"
    scripts = [marker, marker + "import time\ntime.sleep(3600)\n", marker]
    files = _Files(tmp_path, 3)
    answers = box.run_batch([_request(s, f"job{i}") for i, s in enumerate(scripts)], files.fds)
    try:
        first = next(answers)
        box.kill()  # what the watch thread does at the job's timeout
        with pytest.raises(SandboxLost):
            next(answers)
        replies, again = _batch(box, tmp_path, [PROBE], "again")
    finally:
        files.close()
        box.stop()
    assert first["exit_code"] == 0
    assert (Path(box.spec.work_dir) / "job0").exists()  # the control: a job leaves its mark
    assert not (Path(box.spec.work_dir) / "job2").exists()  # never ran
    assert files.out(2) == files.err(2) == ""
    assert replies[0]["exit_code"] == 0, again.err(0)  # a new sandbox serves the next batch


def test_a_stopped_batch_runs_the_job_it_began_and_none_after(tmp_path: Path) -> None:
    """The runner's node died (stop_batch): the job the worker runs ends as it would, the jobs
    after it never run (answered unrun: the runner gives them back). The second job waits on
    a FIFO: the stop is sent once it opened it, and it ends once the test closes it."""
    box, _ = _box(tmp_path, "strict")
    work = Path(box.spec.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    os.mkfifo(work / "gate", 0o600)
    os.chown(work / "gate", box.spec.uid, box.spec.uid)
    marker = "import os\nopen(os.path.join(os.environ['HOME'], os.environ['OWN']), 'w').close()\n"
    scripts = [marker, "open('gate').read()\n" + marker, marker]
    files = _Files(tmp_path, 3)
    answers = box.run_batch([_request(s, f"job{i}") for i, s in enumerate(scripts)], files.fds)
    try:
        first = next(answers)
        with open(work / "gate", "w") as gate:  # opens once the second job reads it: it runs
            box.stop_batch()
            gate.write("go")
        rest = list(answers)
    finally:
        files.close()
        box.stop()
    assert first["exit_code"] == 0
    assert [r["exit_code"] for r in rest] == [0]  # the one it began
    assert (work / "job1").exists()
    assert not (work / "job2").exists()  # never ran
