"""One job in a runner process (node/worker/loop.py): its script, its watch, its live logs.

The runner never runs job code itself: every job goes to the slot's warm sandboxed worker
(node/sandbox/host.py, docs/security/sandbox.md), its stdout and stderr the
slot's log files. There a python job runs in the sandbox's warm job process (a fresh process
per job with ``[sandbox] fresh_process``), any other type by exec of its command
(node/slot/commands.py); what a job leaves running is killed after it. A limit that
fired (node/slot/outcomes.py: limit_reason) ends the job with its reason.

A watch thread, per process, does what must happen while the script runs: it renews the lease
(three times per TTL, re-taking it after a stall), forwards the output to ``logs:<job>``
every LOG_FLUSH_S, kills the job at its timeout, and reads the node's stop requests (JSON
lines on the control pipe). A job that ends before the watch thread's next tick costs it
nothing. Killing a job (a timeout, a stop, an abort) SIGKILLs its sandbox, which takes every process
of the job with it; the next job starts a new sandbox.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.core.attempts import Outcome, outcome_of
from bus.core.ids import now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from node.sandbox.host import Sandbox
from node.sandbox.plan import PATH, WORK, PlanError
from node.sandbox.spawn import SandboxLost, SandboxSpec
from node.slot import outcomes
from node.slot.commands import expand, uses_script_file
from node.slot.outcomes import (
    KILL_GRACE_S,
    LOG_FLUSH_S,
    TAIL_BYTES,
    Ending,
    LogPump,
    limit_reason,
    log_paths,
    read_back,
    tail_of,
    written,
)
from node.worker.pyjobs import become_subreaper
from node.worker.spans import end as end_span
from node.worker.spans import sandbox_span

if TYPE_CHECKING:
    from bus.store.atomic.runs_sync import SyncRuns
    from node.slot.spec import RunnerSpec

log = logging.getLogger("node.worker.loop")


class Wake(Exception):  # noqa: N818 - a signal, not an error
    """Raised in the main thread by a signal that interrupts a blocking pop."""


class Aborted(Exception):  # noqa: N818
    """The runner was told to abort (SIGINT): the running job was given back."""


@dataclass
class _Process:
    """What :func:`prepare_process` set up, shared by every job of the process."""

    control: int = -1  # the node's control pipe (stop requests)
    report: int = -1  # the pipe of the reports to the node (node/worker/ending.py: report)
    base_env: dict[str, str] = field(default_factory=dict)
    pid_file: Path | None = None
    marker: str = ""
    parent: int = 0


PROCESS = _Process()


def prepare_process(spec: RunnerSpec) -> None:
    """Fds (the control pipe moved aside, fd 0 /dev/null), the subreaper setting, the pid file
    a restarted node's orphan killer reads, and an empty environment (a python job sees
    exactly its own)."""
    PROCESS.parent = os.getppid()
    PROCESS.control = os.dup(0)
    PROCESS.report = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    become_subreaper()  # what its sandboxes leave comes to it (node/worker/pyjobs.py)
    PROCESS.base_env = {k: v for k in _PASSED_ON if (v := os.environ.get(k)) is not None}
    PROCESS.base_env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    PROCESS.marker = f"HERO_WORKER={os.environ.get('HERO_WORKER', '')}"
    pid_dir = Path(spec.run_dir) / "jobs"
    pid_dir.mkdir(parents=True, exist_ok=True)
    PROCESS.pid_file = pid_dir / str(os.getpid())
    PROCESS.pid_file.write_text(PROCESS.marker)
    outcomes.outcome_dir(Path(spec.run_dir)).mkdir(parents=True, exist_ok=True)
    os.environ.clear()


_PASSED_ON = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # of the node's own environment


def job_env(job: RunnerJob, home: str = WORK) -> dict[str, str]:
    """The job's environment, an allow-list: PATH, HOME (its work dir), TMPDIR, the node's
    locale, the job's own variables, its ids."""
    ids = {
        "HERO_JOB_ID": str(job.id),
        "HERO_CALLER_ID": str(job.caller_id),
        "HERO_CONTEXT_ID": str(job.context_id),
    }
    locale = {k: v for k in ("LANG", "LC_ALL") if (v := PROCESS.base_env.get(k))}
    base = {"PATH": PATH, "HOME": home, "TMPDIR": "/tmp"} | locale
    return base | dict(job.env_vars) | ids


_LIMIT_TEXT = {
    "memory_limit": "the job ran out of its memory limit",
    "cpu_limit": "the job used up its CPU time limit",
    "pids_limit": "the job could not start more processes (its processes limit)",
    "file_size_limit": "the job wrote a file larger than its file size limit",
    "output_limit": "the job's output reached its file size limit",
    "disk_limit": "the job filled its context's disk quota (or its /tmp)",
}


def job_request(spec: RunnerSpec, job: RunnerJob) -> dict[str, Any]:
    """What the sandboxed worker needs to run ``job`` (node/sandbox/inner.py)."""
    home = WORK if spec.sandbox.get("mode") != "none" else str(spec.sandbox.get("work_dir"))
    request: dict[str, Any] = {"script": job.script, "env": job_env(job, home)}
    if spec.in_process:
        return request | {"kind": "python"}
    if not uses_script_file(spec.command):
        return request | {"kind": "exec", "argv": expand(spec.command, job)}
    path = f"/tmp/hero-job-{os.urandom(8).hex()}.{job.script_type}"
    return request | {"kind": "exec", "argv": expand(spec.command, job, path), "script_file": path}


def slot_logs(spec: RunnerSpec) -> tuple[Path, Path]:
    """The slot's output files (reused by each job it runs)."""
    return log_paths(Path(spec.run_dir), f"{spec.ctx}-{spec.slot_id}")


def open_logs(paths: tuple[Path, Path]) -> tuple[int, int]:
    """The slot's output files, open for every job the process runs: emptied per job, never
    reopened (an open with O_TRUNC and a close per file and job cost the runner ~20 system
    calls; ext4 (auto_da_alloc) also writes a file truncated to zero out at its next close)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    out = os.open(paths[0], flags, 0o666)
    try:
        return out, os.open(paths[1], flags, 0o666)
    except OSError:
        os.close(out)
        raise


def emptied(fds: tuple[int, int], sizes: tuple[int, int] | None = None) -> tuple[int, int]:
    """``fds`` empty, their shared offset at 0 (the sandbox writes through the same open file
    descriptions), for the next job's output. ``sizes``: what each held when nothing could
    write it any more (None: unknown); one that held nothing is not truncated (an ftruncate
    journals its inode even then: ~6-20 us, and most jobs leave stderr empty), only its
    offset set back (a job may have moved it without writing)."""
    for fd, size in zip(fds, sizes or (1, 1), strict=True):
        if size:
            os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    return fds


@dataclass(eq=False)
class HeldAttempt:
    """An attempt this process runs, or holds in its batch until its turn: what the main
    thread, the watch thread and a batch's end (node/worker/batch.py) share of it."""

    job: RunnerJob
    request: Message
    attempt: int
    token: str
    pump: LogPump
    next_flush: float
    next_renew: float
    deadline: float
    kill_reason: str = ""
    kill_at: float = 0.0  # when a kill that was not obeyed is escalated
    began: float = 0.0  # when its run began (monotonic), and (wall clock) its start
    started_at: int = 0
    outcome_name: str = ""  # its outcome file's (node/slot/outcomes.py)
    # the sandbox answered how the job ended, not by SIGKILL: it ran to its end, whatever
    # comes after
    answered: bool = False
    answered_at: float = 0.0  # when a batch's job answered (monotonic): its spans' times
    # the attempt's run is over (set before its end is recorded): a renewal the watch thread
    # began before that is refused by the end, which supersedes nothing
    over: bool = False


# how the watch thread ends a python job's attempt (Outcome: recorded; None: given back)
EndFromWatch = Callable[[RunnerJob, Message, "Outcome | None", int], bool]


class JobRun:
    """Runs the jobs of one runner process, one at a time, and watches the running one."""

    def __init__(self, spec: RunnerSpec, runs: SyncRuns, end: EndFromWatch) -> None:
        self.spec, self.runs, self.end = spec, runs, end
        self.logs = slot_logs(spec)
        self.log_fds: tuple[int, int] | None = None  # the logs, open once (open_logs)
        # whether the logs hold a job's output: emptied once its end is recorded
        # (:meth:`empty_logs`), off the next job's way; else at that job's start
        self.logs_used = False
        # what they held once the job that used them answered (nothing writes them then: its
        # leftovers were killed and waited for, its job process closed them); None: unknown
        self.logs_sizes: tuple[int, int] | None = None
        # no sandbox spec, no job: a runner never runs one unsandboxed by omission
        box = SandboxSpec(**spec.sandbox) if spec.sandbox else SandboxSpec("refused", "")
        self.sandbox = Sandbox(box)
        self.current: HeldAttempt | None = None
        self.aborted = False
        self.began = 0.0
        self.started_at = 0
        # the running attempt's outcome file (node/slot/outcomes.py): its name, and the
        # folder, made a path only when the file itself is written (pathlib: 11 us a job)
        self.outcome_name = ""
        self.run_dir = Path(spec.run_dir)  # parsed once, not for every job
        self.outcomes = outcomes.outcome_dir(self.run_dir)
        slot_file = outcomes.slot_path(self.run_dir, spec.ctx, spec.slot_id)
        self.slot_file = outcomes.SlotFile(slot_file)
        # the outcome files written (not only the slot's), until their ends are recorded
        self.named: set[str] = set()
        self.batch: list[HeldAttempt] = []  # a batch's attempts, their leases renewed meanwhile
        # what the watch thread does for the running batch once the node died: the outcomes
        # its jobs ended with so far, which only this process holds, written for the next node
        self.on_orphan: Callable[[], None] | None = None
        self.batch_fds: dict[int, tuple[int, int]] = {}  # a batch's output files past the first
        self.batch_paths: dict[int, tuple[Path, Path]] = {}  # their names (node/worker/batch.py)
        self.open_logs: LogPump | None = None  # the last attempt's stream, ended by end_logs
        self.heartbeat_s = spec.lease_ttl_ms / 1000 / 3
        self.span: Any = None  # the running attempt's span, the sandbox run's parent
        # what the loop leaves for the job's run time (its start's log line): done once the
        # request is sent, while the answer is awaited, not between the start and the run
        self.meanwhile: Callable[[], None] | None = None
        self._meanwhile_idle = (0.0, self.run_meanwhile)  # the sandbox's idle, without a wait

    def start_watch(self) -> None:
        threading.Thread(target=self._watch, name="watch", daemon=True).start()

    # -- the main thread -----------------------------------------------------------------------

    def run(self, job: RunnerJob, request: Message, attempt: int, token: str) -> Outcome | None:
        """Run attempt ``attempt`` of ``job``, whose lease is ``token`` (the ``runner`` field
        its start wrote and returned); None if the runner was aborted meanwhile."""
        self.began, self.started_at = time.monotonic(), now()
        pump = LogPump(
            self.runs, job.key, self.logs, self.spec.max_output_bytes, self.spec.reply_ttl_s
        )
        far = self.began + (job.timeout or 1e9)
        cur = HeldAttempt(
            job,
            request,
            attempt,
            token,
            pump,
            self.began + LOG_FLUSH_S,
            self.began + self.heartbeat_s,
            far,
        )
        self.outcome_name = outcomes.outcome_name(self.spec.ctx, job.key, attempt)
        cur.began, cur.started_at, cur.outcome_name = self.began, self.started_at, self.outcome_name
        self.current = cur
        outcome: Outcome | None = None
        try:
            outcome = self._run_sandboxed(cur)
        except BaseException:
            pump.finish("interrupted")
            raise
        finally:
            cur.over = True
            self.current = None
            self.run_meanwhile()  # if the answer, or a failure, came before it could be done
        self.open_logs = pump
        # an abort that lands after the job ended must not give the attempt back: it ran, and
        # would run a second time; only an attempt the abort cut short is given back
        if outcome is None or (self.aborted and not cur.answered):
            return None
        if cur.kill_reason:
            return Outcome(JobStatus.ERROR, {}, cur.kill_reason)
        return outcome

    def run_meanwhile(self) -> None:
        """Do what :attr:`meanwhile` holds, once: as soon as the job's request is sent (the
        sandbox's ``idle`` function, called without waiting), else once :meth:`run` ends."""
        work, self.meanwhile = self.meanwhile, None
        if work is not None:
            work()

    def slot_fds(self) -> tuple[int, int]:
        """The slot's output files, empty, for the job about to run: opened (and emptied: a
        process before this one may have left output there) on first use; emptied here only
        if :meth:`empty_logs` did not run after the last job."""
        if self.log_fds is None:
            self.log_fds = emptied(open_logs(self.logs))
        elif self.logs_used:
            emptied(self.log_fds, self.logs_sizes)
        self.logs_used, self.logs_sizes = True, None
        return self.log_fds

    def empty_logs(self) -> None:
        """Empty the slot's output files once the end of the job that wrote them is recorded
        (after :meth:`forget`: until then adoption may read them): after its answer, not on
        the next job's way between its start and its run (two ftruncates and two lseeks,
        ~40 us of a lone job's path here, bench/HISTORY.md#lone-job-latency). The output
        then does not outlive the job's end either."""
        if self.logs_used and self.log_fds is not None:
            emptied(self.log_fds, self.logs_sizes)
        self.logs_used, self.logs_sizes = False, None

    def end_logs(self, status: str) -> None:
        """End the live log stream of the attempt :meth:`run` ran, once its end is recorded:
        a follower that sees the end marker (``job wait``) then finds the job's hash final."""
        pump, self.open_logs = self.open_logs, None
        if pump is not None:
            pump.finish(status)

    def keep(self, record: dict[str, object], *, durable: bool = False, name: str = "") -> None:
        """Keep the attempt's outcome on disk for the node to adopt, should this process not
        get to record it in Valkey (node/slot/outcomes.py): in the slot's file, which the
        slot's recovery reads once this process has ended; in the attempt's own file, fsynced,
        when ``durable``, and whenever the node has died (the next one may be reading).
        ``name``: the attempt's outcome file's, if not the running (or last) attempt's."""
        name = name or self.outcome_name
        if not name:
            return
        if durable or os.getppid() != PROCESS.parent:
            outcomes.write_outcome(self.outcomes / name, record, durable=durable)
            self.named.add(name)
        else:
            self.slot_file.keep(name, record)

    def keep_all(self, records: list[tuple[str, dict[str, object]]]) -> None:
        """Keep the outcomes of a batch's attempts (outcome file name, record) as :meth:`keep`
        keeps one: in the slot's file, in one write, or each in its own once the node died."""
        if os.getppid() != PROCESS.parent:
            for name, record in records:
                self.keep(record, name=name)
        elif records:
            self.slot_file.keep_all(records)

    @property
    def outcome_file(self) -> Path:
        """The running (or last) attempt's own outcome file."""
        return self.outcomes / self.outcome_name

    def forget(self) -> None:
        """After the attempt's end (or a batch's ends) is recorded: its outcome is of no
        further use."""
        self.slot_file.clear()
        while self.named:
            outcomes.discard(self.outcomes / self.named.pop())

    def _run_sandboxed(self, cur: HeldAttempt) -> Outcome:
        """Run the job in the slot's sandboxed worker (node/sandbox/host.py), its output in
        the slot's log files."""
        request = job_request(self.spec, cur.job)
        fds = self.slot_fds()
        box = None if self.span is None else sandbox_span(self.spec, self.span, cur.job.key)
        try:
            idle = self._meanwhile_idle if self.meanwhile is not None else None
            reply = self.sandbox.run(request, fds[0], fds[1], idle)
            # killed outright, it may be the abort's kill of the sandbox racing the answer
            cur.answered = reply.get("signal") != signal.SIGKILL
            code = reply["exit_code"] if reply["exit_code"] is not None else -reply["signal"]
        except (SandboxLost, PlanError, OSError) as exc:
            end_span(box, "failed", Reason.RUNNER_LOST)
            if not (cur.kill_reason or self.aborted):
                reason = f"{Reason.RUNNER_LOST}: the sandbox ended ({exc})"
                return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, reason)
            reply, code = {"exit_code": None, "signal": signal.SIGKILL}, -signal.SIGKILL
        else:
            if box is not None:
                end_span(box, "exited", attributes={"hero.exit_code": code})
        return self.outcome_from(cur, reply, code, fds)

    def outcome_from(
        self, cur: HeldAttempt, reply: dict[str, Any], code: int, fds: tuple[int, int]
    ) -> Outcome:
        """How the job ended, from the sandbox's answer and its output files: its exit
        status and output, or the limit it hit."""
        limit = self.spec.max_output_bytes
        files = [written(fd) for fd in fds]
        if cur.answered and fds is self.log_fds:  # the job's own answer: nothing writes them now
            self.logs_sizes = (files[0].size, files[1].size)
        tail = tail_of(fds[1], files[1], TAIL_BYTES)
        out, err = (read_back(fd, w, limit) for fd, w in zip(fds, files, strict=True))
        if os.getppid() != PROCESS.parent:
            # orphaned: should this process not get to record the end, the next node adopts it
            self.keep({"exit_code": code, "stdout": out, "stderr": err}, name=cur.outcome_name)
        signum, cpu_s = int(reply.get("signal") or 0), float(reply.get("cpu_s") or 0)
        ending = Ending(reply["exit_code"], signum, cpu_s, str(reply.get("bound") or ""))
        hit = limit_reason(ending, self.sandbox.spec.limit_values, tail, max(w.size for w in files))
        outcome = outcome_of(code, out, err, limit)
        if hit is not None and not cur.kill_reason:
            return Outcome(JobStatus.ERROR, outcome.result, f"{hit}: {_LIMIT_TEXT[hit]}")
        return outcome

    # -- signals (main thread) and the watch thread ----------------------------------------

    def abort(self) -> None:
        """SIGINT (main thread): a running command is killed; its attempt is given back."""
        self.aborted = True
        self.sandbox.kill()

    def kill(self, cur: HeldAttempt, reason: str) -> None:
        """End the running job with ``reason`` (a stop, a timeout), from the watch thread."""
        if cur.kill_reason:
            return
        cur.kill_reason, cur.kill_at = reason, time.monotonic() + KILL_GRACE_S
        log.info("%s: killing it (%s)", cur.job.key, reason)
        self.sandbox.kill()  # the whole sandbox: the job's every process ends with it

    def _escalate(self, cur: HeldAttempt) -> None:
        self.sandbox.kill()

    def _watch(self) -> None:
        while True:
            cur = self.current
            wait = LOG_FLUSH_S
            if cur is not None:
                due = min(cur.next_flush, cur.next_renew, cur.deadline, cur.kill_at or 1e18)
                wait = max(0.0, min(wait, due - time.monotonic()))
            ready, _, _ = select.select([PROCESS.control], [], [], wait)
            if ready and not self._read_control():  # the node is gone
                self._orphaned()
                return
            cur = self.current
            if cur is not None:
                with contextlib.suppress(Exception):  # Valkey away: the next tick tries again
                    self._tick(cur)
            for held in list(self.batch):  # a batch's attempts that wait, or wait for their end
                if held is not cur and not held.over and time.monotonic() >= held.next_renew:
                    held.next_renew += self.heartbeat_s
                    with contextlib.suppress(Exception):
                        self._renew(held)

    def _tick(self, cur: HeldAttempt) -> None:
        t = time.monotonic()
        if cur.kill_at and t >= cur.kill_at and self.current is cur:
            cur.kill_at = 0.0
            self._escalate(cur)
        if t >= cur.deadline and not cur.kill_reason:
            self.kill(cur, f"{Reason.TIMEOUT}: killed after {cur.job.timeout} s")
        if not cur.kill_reason and (over := self.sandbox.over_cpu()):
            self.kill(cur, over)  # the tree's CPU time (cgroups); each process's is an rlimit
        if t >= cur.next_renew:
            cur.next_renew += self.heartbeat_s
            self._renew(cur)
        if t >= cur.next_flush:
            cur.next_flush += LOG_FLUSH_S
            cur.pump.flush()

    def _renew(self, cur: HeldAttempt) -> None:
        """Renew the running attempt's lease. A refusal means another attempt took the job,
        unless this one's run is over: the tick may have read ``cur`` just before the main
        thread ended the attempt, whose recorded end then refuses the renewal (its result was
        not refused: it is the job's result)."""
        if cur.over:
            return
        if self.runs.renew(cur.job.key, cur.token, self.spec.lease_ttl_ms, cur.attempt):
            return
        if cur.over:
            log.debug("%s: attempt %d ended during its lease renewal", cur.job.key, cur.attempt)
            return
        log.warning("%s: attempt %d superseded (result refused)", cur.job.key, cur.attempt)
        cur.next_renew = 1e18

    def _orphaned(self) -> None:
        """The node died: name the running python job's outcome file in this process's pid
        file (the next node's orphan killer then spares it and adopts what it does; written
        now, not per job), and drain: the job finishes and is answered, then the process
        exits."""
        if self.batch:  # only the job it runs is answered: the rest of its batch never runs
            self.sandbox.stop_batch()
            if self.on_orphan is not None:
                self.on_orphan()
        self.name_running()
        os.kill(os.getpid(), signal.SIGTERM)

    def name_running(self) -> None:
        """Once the node died: name the running job's outcome file in this process's pid file
        (the next node's orphan killer spares this process, and its slot adopts that job)."""
        if self.current is not None and PROCESS.pid_file is not None:
            with contextlib.suppress(OSError):
                PROCESS.pid_file.write_text(f"{PROCESS.marker}\n{self.outcome_file}")

    def _read_control(self) -> bool:
        """Apply the node's requests on the control pipe; False once the node closed it."""
        data = os.read(PROCESS.control, 65536)
        if not data:
            return False
        for line in data.splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                request = json.loads(line)
                cur = self.current
                if cur is not None and request.get("stop") == cur.job.key:
                    self.kill(cur, str(request["reason"]))
                elif (waiting := self._waiting(request.get("stop"))) is not None:
                    waiting.kill_reason = str(request["reason"])  # killed when its turn comes
                    if self.current is waiting:  # it came meanwhile
                        self._escalate(waiting)
                elif cur is not None and request.get("abort"):
                    self.aborted = True
                    self._abort(cur)
        return True

    def _waiting(self, job_key: object) -> HeldAttempt | None:
        """The attempt of ``job_key`` that waits for its turn in the running batch, if any."""
        return next((c for c in self.batch if c.job.key == job_key and not c.began), None)

    def _abort(self, _cur: HeldAttempt) -> None:
        self.sandbox.kill()
