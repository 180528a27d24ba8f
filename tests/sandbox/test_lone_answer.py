"""A lone job's round trip through its sandbox (node/sandbox/host.py ``Sandbox.run``, and
node/sandbox/inner.py): what the runner reads of the job's cgroup leaf, and when; how the warm
job process sets a job's environment and reads and writes its frames.

A job that exited 0 too quickly to have used its ``cpu_s`` on every CPU has no count to check:
its leaf's counters are read once it was answered (``keep_spare``), as the next job's start,
not on its answer's way. A job that failed, or ran long enough, still has them read as it
answers."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from pathlib import Path

import pytest

from node.sandbox import host
from node.sandbox.cgroups import POSSIBLE_CPUS, CountFiles
from node.sandbox.host import Counters, Sandbox
from node.sandbox.inner import _loads, _replace_environ, send
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
        real = host.read_counters

        def counted(files: CountFiles) -> Counters:
            self.seen.append(self.phase)
            return real(files)

        monkeypatch.setattr(host, "read_counters", counted)


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


def test_a_job_that_changed_os_environ_leaves_nothing_of_it_to_the_next() -> None:
    """The job process reads what a job changed of os.environ again; what it set last is
    trusted only while os.environ is exactly as it left it."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    saved = dict(os.environ)
    first = {"PATH": "/bin", "HERO_JOB_ID": "1", "KEPT": "k"}
    second = {"PATH": "/bin", "HERO_JOB_ID": "2", "KEPT": "k"}
    try:
        _replace_environ(first)
        os.environ["PLANTED"] = "by the job"  # what a job may do
        os.environ["KEPT"] = "changed"
        del os.environ["PATH"]
        _replace_environ(second)
        assert dict(os.environ) == second
        assert getenv(b"PLANTED") is None
        assert (getenv(b"KEPT"), getenv(b"PATH")) == (b"k", b"/bin")
        _replace_environ(second)  # nothing changed since: nothing to set
        assert dict(os.environ) == second
    finally:
        _replace_environ(saved)


def test_the_worker_reads_and_writes_its_frames_as_json_does() -> None:
    request = {"script": 'print("é")\n', "env": {"A": "1"}, "kind": "python", "n": [1, 2.5]}
    assert _loads(json.dumps(request).encode()) == request
    for bad in (b"", b" {}", b"{} ", b'{"a": 1}{}', b"nul", b"\xff"):
        with pytest.raises(ValueError):  # noqa: PT011 - whichever of json's errors
            _loads(bad)
    a, b = socket.socketpair()
    with a, b:
        answer = {"exit_code": None, "signal": 9, "cpu_s": 1e-7, "left": 2, "i": 0}
        send(a, answer)
        data = b.recv(4096)
        assert data[4:] == json.dumps(answer).encode()
        assert int.from_bytes(data[:4], "big") == len(data) - 4


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
