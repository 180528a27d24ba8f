"""How a runner process ends an attempt (node/worker/loop.py): it executes the one plan
(node/slot/plan.py) in one Lua call with the next job's take, keeps the outcome on disk until
Valkey has it (node/slot/outcomes.py), tries again while Valkey is away (node/slot/away.py),
and gives back what a cut call may have taken. The watch thread may end a python job's attempt
too, just before the process exits: a lock lets one of them end it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from bus.core import queues
from bus.core.envelope import build_result
from bus.core.ids import ms_after, now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.store.atomic.runs import NextJob, Started
from bus.store.atomic.runs_sync import SyncRuns
from node.host.signer import SignerGone
from node.slot.away import Away
from node.slot.exits import Outcome, outcome_of
from node.slot.lifecycle import RetryPolicy
from node.slot.plan import AnswerHere, Attempt, Retry, ended_as, ending_of, plan_ending
from node.slot.spec import RunnerSpec
from node.worker.job import JobRun
from node.worker.log import line_fields
from node.worker.reports import Reports, report

log = logging.getLogger("node.worker.loop")


class ResultSigner(Protocol):
    def sign_result(self, message: Message) -> Message: ...


@dataclass(frozen=True)
class Ran:
    """An attempt that ran, as its end needs it: the job, its fields as its start returned
    them, the request that carried it, its outcome and its number (the fencing token)."""

    job: RunnerJob
    fields: dict[str, str]
    request: Message
    outcome: Outcome
    attempt: int


class Ender:
    """The ending state of one slot: the lock that lets one thread end the running attempt."""

    def __init__(
        self,
        spec: RunnerSpec,
        runs: SyncRuns,
        job: JobRun,
        reports: Reports,
        signer: ResultSigner | None = None,
    ) -> None:
        self.spec, self.runs, self.job, self.reports, self.signer = spec, runs, job, reports, signer
        self.inflight = spec.inflight
        self.ending = threading.Lock()  # the main thread or the watch thread ends an attempt
        self.ended = ""  # how the last attempt ended: retry, finished or error (its span's)

    def _fields(self, job_key: str = "", reason: str = "", **more: object) -> dict[str, object]:
        return line_fields(self.spec, job_key, reason, **more)

    def end_from_watch(
        self, job: RunnerJob, request: Message, outcome: Outcome | None, attempt: int
    ) -> bool:
        """The watch thread ends the attempt of the python job the main thread runs, just
        before the process exits: given back (``outcome`` None), or its outcome recorded for
        the node, which concludes it once this process is gone (node/runners/adoption.py), so
        that whoever learns the job ended finds its process ended too. False if the main
        thread is ending the attempt already. The lock is never released: the process exits."""
        if not self.ending.acquire(blocking=False):
            return False
        if outcome is None:
            queue = queues.target_queue(job)
            self.runs.requeue(job.key, attempt, self.inflight, queue)
            log.info("%s interrupted by shutdown; requeued", job.key, extra=self._fields(job.key))
        else:
            recorded = {"exit_code": -signal.SIGKILL, "stdout": "", "stderr": ""}
            self.job.keep(recorded | {"reason": outcome.reason})
        return True

    def keep(self, outcome: Outcome) -> None:
        """Put the attempt's outcome where the node adopts it (node/runners/adoption.py),
        before Valkey is asked to record it: that call may hang (a stopped Valkey) or fail, and
        this process may then be killed with its node (a stopped unit, the next start's orphan
        killer) holding the only copy. The exit status and any reason only: the output is in
        the slot's log files, which adoption reads and which the next job of this slot reuses
        only after this end is recorded. Not fsynced on this path (conclude fsyncs it once
        Valkey refuses)."""
        self.job.keep(recorded(outcome, output=False))

    def conclude(self, ran: Ran, nxt: NextJob | None) -> Started | None:
        """End the attempt: retried, or final and answered, in one Lua call that takes and
        starts the next job too (``nxt``: how; None, take none); tried again while Valkey is
        unreachable (the outcome exists only here: node/slot/away.py), without the take."""
        job = ran.job
        away = Away(job.key)
        kept = False
        taking = nxt is not None
        while True:
            try:
                started = self._end(ran, nxt)
                # the end (and the next start with it) on a replica before the outcome is
                # forgotten; unconfirmed, it is sent again like a cut one
                self.runs.confirm()
                if taking and nxt is None:  # a call cut before: it may have taken a job
                    self.give_back_taken(job.key)
                return started
            except SignerGone:  # no retry can help: the next node's recovery ends the attempt
                log.error("%s: the signer is gone; exiting", job.key, extra=self._fields(job.key))
                os._exit(2)
            except Exception as exc:  # noqa: BLE001 - Valkey away: keep the outcome, retry
                self.runs.leave_if_stale(exc)  # the retry asks the Sentinels where to go
                if not kept:
                    # Valkey may stay away long enough for the machine to go down: the outcome
                    # (its output too: the slot's log files are not synced) fsynced
                    self.job.keep(recorded(ran.outcome), durable=True)
                    kept = True
                nxt = None  # a half-applied call must not take a second job
                time.sleep(away.failed(exc, log, **self._fields(job.key)))

    def give_back_taken(self, ended: str) -> None:
        """After an end that was sent again: the call that was cut may have started the next
        job too (runs_take_next) without this process learning it. Left so, that job would
        stay ``started`` by a live slot whose lease the reaper renews for ever; it is given
        back uncounted (runs_requeue, fenced by its attempt), as is an entry that was moved
        but not started."""
        for key, fields in self.runs.in_flight(self.inflight):
            if key == ended:
                continue
            queue = queues.queue_of(fields)
            token = self.spec.token(key)
            status = fields["status"]
            if status in (JobStatus.FINISHED.value, JobStatus.ERROR.value):
                self.runs.ack(self.inflight, key)
                continue
            if status != JobStatus.STARTED.value:
                self.runs.give_back(self.inflight, key, queue)
            elif fields["runner"] == token:
                self.runs.requeue(key, int(fields["attempt"] or 0), self.inflight, queue)
            else:
                continue
            log.info("%s: taken by a cut call; given back", key, extra=self._fields(key))

    def _end(self, ran: Ran, nxt: NextJob | None) -> Started | None:
        """One Lua call: retried, finished here and answered, or finished and answered with a
        signed result; the job statistics counted here go with it (node/worker/reports.py)."""
        job, outcome, attempt, request = ran.job, ran.outcome, ran.attempt, ran.request
        number = Attempt(attempt, self.spec.token(job.key), self.job.started_at, now())
        here = self.spec.node_id
        plan = plan_ending(job, outcome, number, RetryPolicy.of(job), request=request, here=here)
        ending = ending_of(plan, job.key, attempt, self.inflight)
        retry = isinstance(plan, Retry)
        self.ended = ended_as(plan)
        took_s = time.monotonic() - self.job.began
        here_answered = isinstance(plan, AnswerHere)
        batch, due = self.reports.counted(
            ran.fields, ending.status, ending.reason, here_answered, took_s, self.job.heartbeat_s
        )
        due = due or nxt is None or retry
        sums = (self.reports.handover(batch), "") if due else ("[]", self.reports.handover(batch))
        taken: Started | None = None
        if isinstance(plan, Retry):
            ok = self.runs.retry_later(
                ending, queue=plan.queue, due_ms=ms_after(plan.delay_s), stats=sums[0]
            )
            report(b"r")  # the node's retry scheduler sleeps until the next due retry
        elif isinstance(plan, AnswerHere):
            ok, taken = self.runs.finish_local(
                ending, request.key, self.spec.reply_ttl_s, nxt, reply_to=plan.reply_to, stats=sums
            )
        else:
            answer = self._signed(build_result(plan.request, plan.body, origin=here))
            ok, taken = self.runs.finish(ending, answer.to_hash(), answer.key, nxt, stats=sums)
        self.reports.kept(batch, ok, applied=ok and (due or taken is None))
        self._log_end(job, outcome, retry, ok)
        return taken

    def _signed(self, result: Message) -> Message:
        if self.signer is None:
            raise RuntimeError("this runner has no signer: it cannot answer a remote request")
        return self.signer.sign_result(result)

    def _log_end(self, job: RunnerJob, outcome: Outcome, retry: bool, ok: bool) -> None:
        took_ms = (time.monotonic() - self.job.began) * 1000
        name = "job_retries" if retry else "jobs_" + outcome.status.value
        name = name if ok else "stale_results"
        self.reports.count(name)
        if ok and not log.isEnabledFor(logging.INFO):  # a refusal warns, an end informs
            return
        status = "retry" if retry else outcome.status.value
        about = self._fields(job.key, outcome.reason, status=status, duration_ms=round(took_ms, 1))
        if not ok:
            log.warning("%s: result of a superseded attempt refused", job.key, extra=about)
        elif outcome.status is JobStatus.FINISHED:
            log.info("%s finished in %.1f ms", job.key, took_ms, extra=about)
        else:
            then = "retrying" if retry else "failed"
            log.info("%s %s after %.1f ms: %s", job.key, then, took_ms, outcome.reason, extra=about)


def recorded(outcome: Outcome, *, output: bool = True) -> dict[str, object]:
    """``outcome`` as an outcome file records it (node/runners/adoption.py: adopted_outcome
    reads it back): the script's exit status, its output (else adoption reads it from the
    slot's log files), and a reason where the exit status does not say it (a stop, a timeout,
    a limit, a command that could not start)."""
    result = outcome.result
    code = int(result.get("exit_code") or -signal.SIGKILL)
    record: dict[str, object] = {"exit_code": code}
    if output:
        record |= {"stdout": result.get("stdout", ""), "stderr": result.get("stderr", "")}
    if "exit_code" not in result or outcome.reason != outcome_of(code, "", "", 0).reason:
        record["reason"] = outcome.reason
    return record
