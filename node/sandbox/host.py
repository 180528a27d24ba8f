"""The runner's side of a warm sandboxed worker's job conversation (node/sandbox/inner.py is
the worker): each job, or batch of jobs, sent over a unix socket, its answer read bounded and
checked, and the bounds it hit read from its cgroup leaf's counters. How a worker is started,
retired (after ``recycle_jobs`` jobs: its socket closed, it exits) and killed (a job that must
end before its time: timeout, stop, abort) is node/sandbox/spawn.py's, with the killing and
reaping of every process of the sandbox in node/sandbox/reap.py.

A worker takes ~80 ms to start here (bwrap, then Python): the job after a recycling waited that
long, one round trip in a thousand per slot (the bench's local p99 at 89 ms against ~6 ms).
The replacement is started :data:`SPARE_LEAD_JOBS` jobs before the switch (right after each job
when every job gets a fresh worker) and waits, ready, until it is needed; a spare that died
meanwhile is replaced by a new start then. A spare never ran a job.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import select
import signal
import socket
import struct
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import msgspec
import orjson

from bus.core.models import dumps_json
from node.sandbox import disk
from node.sandbox.cgroups import POSSIBLE_CPUS, CountFiles, Leaf
from node.sandbox.inner import MAX_BATCH
from node.sandbox.spawn import STAGGER, SandboxLost, SandboxSpec, Worker

log = logging.getLogger("node.worker.loop")

# jobs before a worker's retirement that its replacement is started (a worker starts in ~80 ms;
# a python job takes a few): the switch then finds it ready
SPARE_LEAD_JOBS = 32


# A warm job process holds its end of the socket while a job runs: what comes back may be the
# job's, so it is read bounded and checked, and whatever it says ends only that job.
MAX_REPLY_BYTES = 4096


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` if it is an ending (an exit code, or a signal), else SandboxLost."""
    code, signum, cpu = reply.get("exit_code"), reply.get("signal", 0), reply.get("cpu_s", 0)
    ints = type(signum) is int and (code is None or type(code) is int)
    if not (ints and type(cpu) in (int, float) and (code is not None or signum > 0)):
        raise SandboxLost(f"not an ending: {str(reply)[:200]}")
    return reply


def _not_killed(box: Worker, reply: dict[str, Any]) -> None:
    """SandboxLost if the worker was killed (a timeout, a stop, an abort) by the time a lone
    job's answer was read and that answer is the kill's own doing (the job ended by SIGKILL):
    the job ends as a kill does, whichever came first. An answer of its own (an exit, another
    signal) stands: the job ran to its end once."""
    if box.was_killed and reply.get("signal") == signal.SIGKILL:
        raise SandboxLost("killed as it answered")


# what a batch's reader does when the next answer is slow to come: after this many seconds
# without one, it calls the function once (the runner ends the jobs that answered: see
# node/worker/batch.py), then waits on
Idle = tuple[float, Callable[[], None]]


def _await_answer(sock: socket.socket, idle: Idle | None) -> None:
    """Wait until ``sock`` has something to read (an answer, or its end); if nothing comes
    within ``idle``'s bound, call its function once first. An event wait (poll), not a
    sleep: a quick answer is read the moment it comes."""
    if idle is None:
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(idle[0] * 1000):
        idle[1]()


class _Frames:
    """The answers of one batch request, read as they come: the job after an answer runs
    meanwhile, so two answers may come in one read. Only the last may have nothing behind it
    unread: more bytes there are a job's (it wrote to the socket)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.data = sock, b""

    def next(self, *, last: bool, idle: Idle | None = None) -> dict[str, Any]:
        if not self._whole():  # outside the try: what the function raises is not the sandbox's
            _await_answer(self.sock, idle)
        try:
            size = self._size()
            while len(self.data) < 4 + size:
                self._read()
            value = orjson.loads(self.data[4 : 4 + size])
            self.data = self.data[4 + size :]
            if last and self.data:
                raise ValueError(f"{len(self.data)} bytes behind the answer: a job wrote there")
        except (OSError, ValueError) as exc:
            raise SandboxLost(str(exc)) from None
        if not isinstance(value, dict):
            raise SandboxLost("not a reply")
        return value

    def _whole(self) -> bool:
        """Whether a whole answer is read already (it came with the one before)."""
        data = self.data
        return len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]

    def _size(self) -> int:
        while len(self.data) < 4:
            self._read()
        (size,) = struct.unpack(">I", self.data[:4])
        if size > MAX_REPLY_BYTES:
            raise ValueError(f"an answer of {size} bytes")
        return size

    def _read(self) -> None:
        chunk = self.sock.recv(4 + MAX_REPLY_BYTES + 1)
        if not chunk:
            raise OSError("the sandboxed worker ended")
        self.data += chunk


# -- a job's counters, as its cgroup leaf (node/sandbox/cgroups.py) keeps them -----------------


def _count(text: bytes, key: bytes) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


class Counters(msgspec.Struct, frozen=True):
    oom_kills: int = 0
    forks_refused: int = 0
    cpu_ns: int | None = None  # CPU time of every process the leaf has held; None: not counted
    read_at: float = -math.inf  # time.monotonic() just before they were read

    def cpu_out_of_reach(self, bound_ns: int) -> bool:
        """Whether the leaf's tree cannot have used ``bound_ns`` of CPU time since these
        counters were read: not in the wall time since, on every CPU the machine may have,
        with half the bound to spare (the kernel charges a running task's time late, by up
        to a tick)."""
        return (time.monotonic() - self.read_at) * POSSIBLE_CPUS * 2e9 < bound_ns


def read_counters(files: CountFiles) -> Counters:
    """A leaf's OOM kills, refused forks and tree's CPU time so far (three preads of files
    held open); Counters() if they cannot be read."""
    at = time.monotonic()
    try:
        oom, forks = os.pread(files.memory, 4096, 0), os.pread(files.pids, 4096, 0)
    except OSError:
        return Counters()
    return Counters(_count(oom, b"oom_kill"), _count(forks, b"max"), tree_cpu_ns(files), at)


def tree_cpu_ns(files: CountFiles) -> int | None:
    """CPU time of a leaf's tree so far (v1 ``cpuacct.usage``, v2 ``cpu.stat``'s
    usage_usec), one pread of a file held open; None where the leaf does not count it."""
    try:
        text = os.pread(files.cpu, 4096, 0)
    except OSError:
        return None
    if files.v2:
        return _count(text, b"usage_usec") * 1000
    with contextlib.suppress(ValueError):
        return int(text)
    return None


class Sandbox(Worker):
    """One warm sandboxed worker of a runner slot (and its spare, near its retirement), and
    the jobs it runs."""

    def __init__(
        self, spec: SandboxSpec, rng: random.Random = STAGGER, stderr: int | None = None
    ) -> None:
        """``stderr``: where bwrap and the worker write theirs (an open fd; None: inherited),
        so that the probe can say why a sandbox did not start."""
        super().__init__(spec, rng, stderr)
        # while a job runs: its leaf and the leaf's CPU time when it began (over_cpu)
        self._job_cpu: tuple[Leaf, int] | None = None
        self._after: tuple[Leaf, Counters] | None = None  # the leaf's, as the last job ended
        self.batching = False  # a batch request's answers are still to come (stop_batch)

    def start(self) -> None:
        """Make the spare (or a worker started now) the current worker, once it said hello.
        Raises SandboxLost if it cannot start."""
        self._take()
        try:
            hello = self._receive()
        except SandboxLost:
            self._retire()
            raise
        self.uid = int(hello.get("uid", -1))

    def run(
        self, request: dict[str, Any], out: int, err: int, idle: Idle | None = None
    ) -> dict[str, Any]:
        """Run one job (its stdout and stderr the open files ``out``/``err``); how it ended.
        Raises SandboxLost if the worker died meanwhile (it was killed: a timeout, a stop).
        ``idle``: what to do meanwhile should its answer be slow to come (a batch's job)."""
        self._retire_spent()  # one keep_spare() did not retire after its last answer, or killed
        if self.sock is None:
            self.start()
        assert self.sock is not None
        before = self._counters_before()
        if self.leaf is not None and before is not None and before.cpu_ns is not None:
            self._job_cpu = (self.leaf, before.cpu_ns)
        data = dumps_json(request)
        try:
            socket.send_fds(self.sock, [struct.pack(">I", len(data)) + data], [out, err])
        except OSError as exc:
            self._job_cpu = None
            self._retire()
            raise SandboxLost(str(exc)) from None
        _await_answer(self.sock, idle)  # what its function raises is not the sandbox's
        try:
            reply = _checked(self._receive())  # a socket's error is SandboxLost there too
            _not_killed(self, reply)
        except SandboxLost:
            self._job_cpu = None
            self._retire()
            raise
        self._job_cpu = None
        self.jobs += 1
        if reply.get("left"):  # what the job left in /tmp could not all be removed
            self.recycle_at = self.jobs  # a new sandbox, a new /tmp, after this answer
        if bound := self._bound(before, reply["exit_code"] != 0, lone=True):
            reply["bound"] = bound
        return reply

    def run_batch(
        self,
        requests: list[dict[str, Any]],
        files: list[tuple[int, int]],
        idle: Idle | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Run ``requests`` in turn (each job's stdout and stderr its own pair of ``files``);
        yields how each ended, in order, as its answer comes (the job after it runs by then).
        With a warm worker the jobs go in one request (node/sandbox/inner.py), each still alone:
        its own rlimits, environment, cwd, output and leftovers killed before its answer. What
        a job leaves that the next must not meet (in the job process, or in /tmp) gets the
        rest of the batch sent again, to a new process or a new sandbox: none of them ran.

        Stops early, having yielded fewer endings than requests, when a job ended the job
        process (the worker answered for it): the jobs after it never ran (the caller gives
        them back). Raises SandboxLost, as :meth:`run` does, in the job the worker died in (a
        kill: a timeout, a stop, an abort); the jobs after it never ran either.

        ``idle``: when an answer is slow to come, its function is called once (from this
        thread, the job running meanwhile) before the wait goes on: the caller may end the
        jobs that answered without waiting for the rest."""
        if len(requests) != len(files):
            raise ValueError("one pair of files per request")
        done = 0
        while done < len(requests):
            if self.spec.fresh_process or len(requests) - done == 1:
                # a process per job anyway: one request per job costs nothing more
                yield self.run(requests[done], *files[done], idle)
                done += 1
                continue
            until = done + MAX_BATCH
            ended = yield from self._batch(requests[done:until], files[done:until], idle)
            done += ended[0]
            if ended[1]:
                return

    def _batch(
        self, requests: list[dict[str, Any]], files: list[tuple[int, int]], idle: Idle | None
    ) -> Generator[dict[str, Any], None, tuple[int, bool]]:
        """One batch request to the warm worker: (how many jobs it answered, whether the
        job process died in the last of them, the rest not run)."""
        self._retire_spent()
        if self.sock is None:
            self.start()
        assert self.sock is not None
        self._read_after()  # the first job's window, from now
        data = dumps_json({"jobs": requests})
        fds = [fd for pair in files for fd in pair]
        try:
            socket.send_fds(self.sock, [struct.pack(">I", len(data)) + data], fds)
        except OSError as exc:
            self._retire()
            raise SandboxLost(str(exc)) from None
        frames = _Frames(self.sock)
        self.batching = True
        try:
            return (yield from self._answers(frames, len(requests), idle))
        finally:  # however it ends (a caller that stops reading too): no stop for a batch gone
            self.batching, self._job_cpu = False, None

    def _answers(
        self, frames: _Frames, n: int, idle: Idle | None
    ) -> Generator[dict[str, Any], None, tuple[int, bool]]:
        for i in range(n):
            # the counters read as the job before it answered: one read per job, not two (the
            # next job's window begins where the last one's ended, so none of its events is
            # missed between two reads)
            before = self._counters_before()
            if self.leaf is not None and before is not None and before.cpu_ns is not None:
                self._job_cpu = (self.leaf, before.cpu_ns)  # this job's tree, from its turn
            try:
                reply = frames.next(last=i + 1 == n, idle=idle)
                if reply.get("i") != i:
                    raise SandboxLost(f"an answer out of turn: {str(reply)[:200]}")
                if reply.get("unrun") is True:  # stopped (stop_batch): the rest never ran
                    return i, True
                _checked(reply)
            except SandboxLost:
                self._job_cpu = None
                self._retire()
                raise
            self._job_cpu = None
            del reply["i"]
            self.jobs += 1
            if reply.get("left"):  # what the job left in /tmp could not all be removed
                self.recycle_at = self.jobs
            if bound := self._bound(before, reply["exit_code"] != 0, lone=i + 1 == n):
                reply["bound"] = bound
            lost, resend = bool(reply.pop("lost", False)), bool(reply.pop("resend", False))
            if lost or resend or i + 1 == n:
                self.batching = False  # no answer to come: a stop now would meet the next request
            yield reply
            if lost or resend:
                return i + 1, lost
        return n, False

    def stop_batch(self) -> None:
        """Ask the warm worker to run no further job of the batch it runs (any thread): the
        job it runs ends as it would, the rest are answered unrun. Nothing while no batch
        runs."""
        sock = self.sock
        if sock is None or not self.batching:
            return
        data = dumps_json({"stop": True})
        with contextlib.suppress(OSError):  # gone: the batch ends anyway
            sock.sendall(struct.pack(">I", len(data)) + data)

    def over_cpu(self) -> str:
        """The reason to end the running job with if its tree has used more CPU time than
        its ``cpu_s`` ("" if not, or if no cgroup counts it): read by the runner's watch
        tick, which already wakes every half second while a job runs (any thread may call
        this). The per-process RLIMIT_CPU stays as the backstop."""
        running = self._job_cpu
        if running is None:
            return ""
        leaf, start = running
        used = tree_cpu_ns(leaf.counted)
        bound = self.spec.limit_values.cpu_s
        if used is None or used - start < bound * 1_000_000_000:
            return ""
        spent = (used - start) / 1e9
        return f"cpu_limit: the job's processes used {spent:.1f} s of CPU time (cpu_s {bound})"

    def _counters_before(self) -> Counters | None:
        """The leaf's counters as a job starts: those read as the worker's last job ended, or
        once a quick lone job was answered (:meth:`keep_spare`; between two requests nothing
        runs in the leaf: the worker waits; within a batch the next job begins as the last one
        answers), else read now. One read per job, after it, instead of one before it too:
        three preads less between a lone job's start and its run
        (bench/HISTORY.md#lone-job-latency), and per job of a batch
        (bench/HISTORY.md#runner-cpu)."""
        if self.leaf is None:
            return None
        last, self._after = self._after, None
        if last is not None and last[0] is self.leaf:
            return last[1]
        return read_counters(self.leaf.counted)

    def _bound(self, before: Counters | None, failed: bool, lone: bool = False) -> str:
        """The reason of a bound the job hit, as the kernel counted it (its cgroup's OOM
        kills, refused forks and its tree's CPU time) or as its work dir shows it (full).
        Only CPU time is a bound even for a job that then exited 0: its tree used more than
        ``cpu_s`` (what it used since the last watch tick), as no process may under its
        rlimit; the others a job may meet and cope with.

        A ``lone`` job (no next job of a batch running already: a lone request, a batch's
        last job) that exited 0 too quickly to have used ``cpu_s`` on every CPU has nothing to
        read: the next job's counters are read once this one is answered
        (:meth:`keep_spare`), not on its answer's way, or before the next request is sent."""
        cpu_s = self.spec.limit_values.cpu_s
        if self.leaf is not None and before is not None:
            if lone and not failed and before.cpu_out_of_reach(cpu_s * 1_000_000_000):
                return ""
            after = read_counters(self.leaf.counted)
            self._after = (self.leaf, after)
            if after.cpu_ns is not None and before.cpu_ns is not None:
                if after.cpu_ns - before.cpu_ns >= cpu_s * 1_000_000_000:
                    return "cpu_limit"
            if not failed:
                return ""
            if after.oom_kills > before.oom_kills:
                return "memory_limit"
            if after.forks_refused > before.forks_refused:
                return "pids_limit"
        if not failed:
            return ""
        if self.spec.disk_quota and disk.full(self.spec.work_dir):
            return "disk_limit"
        return ""

    def keep_spare(self) -> None:
        """Start the next worker if its switch is :data:`SPARE_LEAD_JOBS` jobs away or less
        (and a worker ran a job: none is started for a slot that never ran one). Called once a
        job was answered, not before: a start costs ~0.7 ms, which a result need not wait for.
        If it fails, the next job's start tries again and reports why. A worker that ran its
        last job is retired here, after the answer, not on the job's way, and after its spare
        was started: its exit (~8 ms) overlaps the spare's start. The next job's counters are
        read here too, if its answer did not read them (:meth:`_bound`)."""
        due = self.jobs > 0 and self.jobs >= self.recycle_at - SPARE_LEAD_JOBS
        if self.spare is None and due:
            try:
                self.spare = self._spawn()
            except (OSError, SandboxLost, ValueError) as exc:
                log.warning("could not start a spare sandbox worker ahead of time: %s", exc)
        self._retire_spent()
        self._read_after()  # the next job's, read off its way

    def _read_after(self) -> None:
        """Read the leaf's counters now, as the next job's start, unless the last answer did."""
        if self.leaf is not None and self._after is None:
            self._after = (self.leaf, read_counters(self.leaf.counted))

    def _receive(self) -> dict[str, Any]:
        """One answer (it comes in one send: mostly one recv reads all of it). More than
        one frame is not an answer: a job wrote to the socket."""
        assert self.sock is not None
        try:
            data = self.sock.recv(4 + MAX_REPLY_BYTES + 1)
            if not data:
                raise OSError("the sandboxed worker ended")
            if len(data) < 4:
                data += self._exact(4 - len(data))
            (size,) = struct.unpack(">I", data[:4])
            if size > MAX_REPLY_BYTES:
                raise ValueError(f"an answer of {size} bytes")
            if len(data) > 4 + size:
                extra = len(data) - 4 - size
                raise ValueError(f"{extra} bytes behind the answer: a job wrote there")
            value = orjson.loads(data[4:] + self._exact(4 + size - len(data)))
        except (OSError, ValueError) as exc:
            raise SandboxLost(str(exc)) from None
        if not isinstance(value, dict):
            raise SandboxLost("not a reply")
        return value

    def _exact(self, n: int) -> bytes:
        assert self.sock is not None
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise OSError("the sandboxed worker ended")
            data += chunk
        return data

    def _retire_spent(self) -> None:
        """Retire the worker, letting it exit, if it ran its jobs (:attr:`recycle_at`), or
        the worker itself, dead, if it was killed: whenever the kill came (as its last job
        answered, or after), no job is handed to it (:meth:`keep_spare` after an answer, and
        each request before it is sent, call this)."""
        if self.proc is not None and (self.jobs >= self.recycle_at or self.was_killed):
            self._retire(graceful=True)
