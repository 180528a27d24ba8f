"""One job in a runner process (node/worker/loop.py): its script, its watch, its live logs.

A python job runs in the runner process itself, in a fresh namespace (the warm interpreter:
no pipe, no process per job; node/worker/pyjobs.py ``run_one``), its fds 1/2 captured into
the slot's log files; what it leaves running is killed after it (the process is a child
subreaper). Any other type runs its command (node/runners/commands.py) as a subprocess in its
own process group, under the wrapper that records its outcome (node/runners/outcomes.py).

A watch thread, per process, does what must happen while the script runs: it renews the lease
(three times per TTL, re-taking it after a stall), forwards the output to ``logs:<job>``
every LOG_FLUSH_S, kills the job at its timeout, and reads the node's stop requests (JSON
lines on the control pipe). A job that ends before the watch thread's next tick costs it
nothing. Killing a python job raises :class:`Killed` in the main thread (SIGUSR2); a script
that swallows it is ended by the watch thread itself, which then exits the process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.core.ids import now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from node.runners import outcomes
from node.runners.commands import prepared
from node.runners.exits import KILL_GRACE_S, Outcome, _read_back, outcome_of
from node.runners.joblogs import LOG_FLUSH_S, LogPump, log_paths
from node.worker.pyjobs import Capture, become_subreaper, end_leftovers, run_one

if TYPE_CHECKING:
    from bus.store.atomic.runs_sync import SyncRuns
    from node.worker.loop import RunnerSpec

log = logging.getLogger("node.worker.loop")


class Wake(Exception):  # noqa: N818 - a signal, not an error
    """Raised in the main thread by a signal that interrupts a blocking pop."""


class Aborted(Exception):  # noqa: N818
    """The runner was told to abort (SIGINT): the running job was given back."""


@dataclass
class _Process:
    """What :func:`prepare_process` set up, shared by every job of the process."""

    control: int = -1  # the node's control pipe (stop requests)
    report: int = -1  # the pipe of the reports to the node (proc.py: report)
    base_env: dict[str, str] = field(default_factory=dict)
    subreaper: bool = False
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
    PROCESS.subreaper = become_subreaper()
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


def job_env(job: RunnerJob) -> dict[str, str]:
    """The job's environment: a few of the node's variables, the job's, its ids."""
    ids = {
        "HERO_JOB_ID": str(job.id),
        "HERO_CALLER_ID": str(job.caller_id),
        "HERO_CONTEXT_ID": str(job.context_id),
    }
    return PROCESS.base_env | dict(job.env_vars) | ids


def slot_logs(spec: RunnerSpec) -> tuple[Path, Path]:
    """The slot's output files (reused by each job it runs)."""
    return log_paths(Path(spec.run_dir), f"{spec.ctx}-{spec.slot_id}")


@dataclass(eq=False)
class _Current:
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
    child: subprocess.Popen[bytes] | None = None


# how the watch thread ends a python job's attempt (Outcome: recorded; None: given back)
EndFromWatch = Callable[[RunnerJob, Message, "Outcome | None", int], bool]


class JobRun:
    """Runs the jobs of one runner process, one at a time, and watches the running one."""

    def __init__(self, spec: RunnerSpec, runs: SyncRuns, end: EndFromWatch) -> None:
        self.spec, self.runs, self.end = spec, runs, end
        self.logs = slot_logs(spec)
        self.capture = Capture(spec.max_output_bytes)
        self.current: _Current | None = None
        self.aborted = False
        self.began = 0.0
        self.started_at = 0
        self.outcome_file: Path | None = None
        self.open_logs: LogPump | None = None  # the last attempt's stream, ended by end_logs
        self.heartbeat_s = spec.lease_ttl_ms / 1000 / 3

    def start_watch(self) -> None:
        threading.Thread(target=self._watch, name="watch", daemon=True).start()

    # -- the main thread -----------------------------------------------------------------------

    def run(self, job: RunnerJob, request: Message, attempt: int) -> Outcome | None:
        """Run attempt ``attempt`` of ``job``; None if the runner was aborted meanwhile."""
        self.began, self.started_at = time.monotonic(), now()
        token = f"{self.spec.token_base}:{job.key}"
        pump = LogPump(
            self.runs, job.key, self.logs, self.spec.max_output_bytes, self.spec.reply_ttl_s
        )
        far = self.began + (job.timeout or 1e9)
        cur = _Current(
            job,
            request,
            attempt,
            token,
            pump,
            self.began + LOG_FLUSH_S,
            self.began + self.heartbeat_s,
            far,
        )
        self.outcome_file = outcomes.outcome_path(
            Path(self.spec.run_dir), self.spec.ctx, job.key, attempt
        )
        self.current = cur
        outcome: Outcome | None = None
        try:
            if self.spec.in_process:
                outcome = self._run_python(cur)
            else:
                outcome = self._run_command(cur)
        except BaseException:
            pump.finish("interrupted")
            raise
        finally:
            self.current = None
        self.open_logs = pump
        if self.aborted or outcome is None:
            return None
        if cur.kill_reason:
            return Outcome(JobStatus.ERROR, {}, cur.kill_reason)
        return outcome

    def end_logs(self, status: str) -> None:
        """End the live log stream of the attempt :meth:`run` ran, once its end is recorded:
        a follower that sees the end marker (``job wait``) then finds the job's hash final."""
        pump, self.open_logs = self.open_logs, None
        if pump is not None:
            pump.finish(status)

    def forget(self) -> None:
        """After the attempt's end is recorded: its outcome file is of no further use."""
        if self.outcome_file is not None:
            outcomes.discard(self.outcome_file)

    def _run_python(self, cur: _Current) -> Outcome:
        self.capture.start([str(p) for p in self.logs])
        code = run_one(cur.job.script, job_env(cur.job))
        end_leftovers(PROCESS.subreaper)
        out, err = self.capture.finish()
        if os.getppid() != PROCESS.parent and self.outcome_file is not None:
            # orphaned: should this process not get to record the end, the next node adopts it
            reply = {"exit_code": code, "stdout": out, "stderr": err}
            outcomes.write_outcome(self.outcome_file, reply)
        return outcome_of(code, out, err, self.spec.max_output_bytes)

    def _run_command(self, cur: _Current) -> Outcome:
        limit, outcome = self.spec.max_output_bytes, self.outcome_file
        pid_dir = Path(self.spec.run_dir) / "jobs"
        try:
            with prepared(self.spec.command, cur.job, pid_dir) as (argv, fed):
                argv = outcomes.wrapped(argv, outcome) if outcome is not None else argv
                files = [p.open("w+b") for p in self.logs]
                try:
                    code = self._child(cur, argv, fed.script, files, pid_dir)
                finally:
                    out, err = (_read_back(f, limit) for f in files)
        except OSError as exc:
            return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, f"cannot start runner: {exc}")
        return outcome_of(code, out, err, limit)

    def _child(
        self, cur: _Current, argv: list[str], script: str, files: list[Any], pid_dir: Path
    ) -> int:
        proc = subprocess.Popen(  # noqa: S603 - running the configured command is the point
            argv,
            stdin=subprocess.PIPE,
            stdout=files[0],
            stderr=files[1],
            env=job_env(cur.job),
            start_new_session=True,
        )
        pid_file = pid_dir / str(proc.pid)
        pid_file.write_text(f"{cur.job.caller_id}:{cur.job.id}\n{self.outcome_file}")
        cur.child = proc
        try:
            if self.aborted:
                _killpg(proc.pid, signal.SIGKILL)
            proc.communicate(script.encode())
        finally:
            cur.child = None
            pid_file.unlink(missing_ok=True)
            _killpg(proc.pid, signal.SIGKILL)  # what the script left in its group ends with it
        return proc.returncode

    # -- signals (main thread) and the watch thread ----------------------------------------

    def abort(self) -> None:
        """SIGINT (main thread): a running command is killed; its attempt is given back."""
        self.aborted = True
        cur = self.current
        if cur is not None and cur.child is not None:
            _killpg(cur.child.pid, signal.SIGKILL)

    def kill(self, cur: _Current, reason: str) -> None:
        """End the running job with ``reason`` (a stop, a timeout), from the watch thread."""
        if cur.kill_reason:
            return
        cur.kill_reason, cur.kill_at = reason, time.monotonic() + KILL_GRACE_S
        log.info("%s: killing it (%s)", cur.job.key, reason)
        if cur.child is not None:
            _killpg(cur.child.pid, signal.SIGTERM)
        elif self.spec.in_process:
            self._end_python(cur, Outcome(JobStatus.ERROR, {}, reason))

    def _end_python(self, cur: _Current, outcome: Outcome | None) -> None:
        """End the attempt of the python job running in the main thread, then this process
        (what the job started goes with its process group, which the node kills)."""
        if self.end(cur.job, cur.request, outcome, cur.attempt):
            cur.pump.finish(outcome.status.value if outcome else "interrupted")
            os._exit(0)

    def _escalate(self, cur: _Current) -> None:
        if cur.child is not None:
            _killpg(cur.child.pid, signal.SIGKILL)

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

    def _tick(self, cur: _Current) -> None:
        t = time.monotonic()
        if cur.kill_at and t >= cur.kill_at and self.current is cur:
            cur.kill_at = 0.0
            self._escalate(cur)
        if t >= cur.deadline and not cur.kill_reason:
            self.kill(cur, f"{Reason.TIMEOUT}: killed after {cur.job.timeout} s")
        if t >= cur.next_renew:
            cur.next_renew += self.heartbeat_s
            ttl = self.spec.lease_ttl_ms
            if not self.runs.renew(cur.job.key, cur.token, ttl, cur.attempt):
                log.warning("%s: attempt %d superseded (result refused)", cur.job.key, cur.attempt)
                cur.next_renew = 1e18
        if t >= cur.next_flush:
            cur.next_flush += LOG_FLUSH_S
            cur.pump.flush()

    def _orphaned(self) -> None:
        """The node died: name the running python job's outcome file in this process's pid
        file (the next node's orphan killer then spares it and adopts what it does; written
        now, not per job), and drain: the job finishes and is answered, then the process
        exits."""
        cur = self.current
        if cur is not None and self.spec.in_process and PROCESS.pid_file is not None:
            with contextlib.suppress(OSError):
                PROCESS.pid_file.write_text(f"{PROCESS.marker}\n{self.outcome_file}")
        os.kill(os.getpid(), signal.SIGTERM)

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
                elif cur is not None and request.get("abort"):
                    self.aborted = True
                    self._abort(cur)
        return True

    def _abort(self, cur: _Current) -> None:
        if cur.child is not None:
            _killpg(cur.child.pid, signal.SIGKILL)
        elif self.spec.in_process:
            self._end_python(cur, None)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
