"""How a runner process sees a started attempt through to its end (node/worker/loop.py hands it
over once the start is checked): it runs the job (node/worker/job.py; a batch is run and ended
with its ender by node/worker/batch.py), then executes the one plan (bus/core/attempts.py:
plan_ending) in one Lua call with the next job's take, keeps the outcome on disk until Valkey has it
(node/slot/outcomes.py), tries again while Valkey is away (node/slot/away.py), and gives back
what a cut call may have taken. The watch thread may end a python job's attempt too, just
before the process exits: a lock lets one of them end it.

And what the process reports of its attempts (:class:`Reports`): to Valkey, the job
statistics it counted itself (bus/core/stats.py: how many it started and how each ended, what
``hero-node status`` and the metrics read), handed over with an end's script every
``taken_every`` jobs or once per lease beat, and whenever it goes idle, not per job; to the
node, every ``taken_every`` jobs, how many it took (the supervisor's backpressure waits for
that), and the rare events the statistics do not hold (a superseded attempt's result refused,
a batch taken, a hash not admitted). A lone job tells the node nothing: its end is in the
statistics its last script wrote. Its log lines go to the node's stderr in the node's level
and format (node/observe/logs.py; ``hero-node run --log-format json`` gives one JSON object per
line whichever process wrote it), each carrying its fields as the node's lines do
(:func:`line_fields`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Protocol

import msgspec
import orjson

from bus.core import queues
from bus.core.attempts import (
    AnswerHere,
    AnswerRemote,
    Attempt,
    Outcome,
    Plan,
    Retry,
    ended_as,
    plan_ending,
)
from bus.core.envelope import build_result
from bus.core.ids import ms_after, now
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.stats import StatsBatch
from bus.store.atomic.runs import (
    Call,
    NextJob,
    Started,
    ending_of,
    finish_call,
    finish_local_call,
    requeue_call,
    retry_call,
)
from bus.store.atomic.runs_sync import SyncRuns, SyncStoreError
from node.host.signer import SignerGone
from node.slot.away import Away
from node.slot.outcomes import recorded
from node.slot.spec import RunnerSpec
from node.worker.job import PROCESS, Aborted, JobRun

log = logging.getLogger("node.worker.loop")


class ResultSigner(Protocol):
    def sign_result(self, message: Message) -> Message: ...

    def sign_results(self, messages: list[Message]) -> list[Message]: ...


class Ran(msgspec.Struct, frozen=True):
    """An attempt that ran, as its end needs it: the job, its fields as its start returned
    them (``runner``: the attempt's lease token), the request that carried it, its outcome and
    its number (the fencing token); when its run began (monotonic, and its wall-clock start)
    and its outcome file's name."""

    job: RunnerJob
    fields: dict[str, str]
    request: Message
    outcome: Outcome
    attempt: int
    began: float = 0.0
    started_at: int = 0
    outcome_name: str = ""


# an attempt of a batch that never ran, to give back uncounted: its job, attempt and queue
Back = tuple[str, int, str]
# a started job as it runs: the job, its fields, the request that carried it, its attempt
Ready = tuple[RunnerJob, dict[str, str], Message, int]


class Ender:
    """The ending state of one slot, which sees each started attempt (or batch, with
    node/worker/batch.py) from its run to its end: the lock that lets one thread end the
    running attempt, and how the last one ended. ``leaving`` says whether the process takes no
    next job (read once an attempt ran: a drain may have begun meanwhile)."""

    def __init__(
        self,
        spec: RunnerSpec,
        runs: SyncRuns,
        job: JobRun,
        reports: Reports,
        leaving: Callable[[], bool],
        signer: ResultSigner | None = None,
    ) -> None:
        self.spec, self.runs, self.job, self.reports, self.signer = spec, runs, job, reports, signer
        self.leaving = leaving
        self.inflight = spec.inflight
        self.traced = bool(spec.tracing)  # the one check a batch's end costs with tracing off
        self.ending = threading.Lock()  # the main thread or the watch thread ends an attempt
        self.ended = ""  # how the last attempt ended: retry, finished or error (its span's)
        self.ended_reason = ""  # and its reason
        self.ended_each: list[str] = []  # so, each attempt of the last batch's end
        self.about = runner_fields(spec)  # what every line says; a job's lines add to it

    def fields(self, job_key: str = "", reason: str = "", **more: object) -> dict[str, object]:
        return line_fields(self.about, job_key, reason, **more)

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
            log.info("%s interrupted by shutdown; requeued", job.key, extra=self.fields(job.key))
        else:
            recorded = {"exit_code": -signal.SIGKILL, "stdout": "", "stderr": ""}
            self.job.keep(recorded | {"reason": outcome.reason})
        return True

    # -- an attempt, from its run to its end ------------------------------------------------

    def run_and_end(
        self, job: RunnerJob, fields: dict[str, str], request: Message, attempt: int, nxt: NextJob
    ) -> list[Started]:
        """Run attempt ``attempt`` of ``job`` (node/worker/job.py) and end it by its plan, in
        the script call that takes the next jobs (``nxt``, unless the process is leaving by
        then); the jobs that call started."""
        self.ended, self.ended_reason = "", ""
        outcome = self.job.run(job, request, attempt, fields["runner"])
        with self.ending:
            if outcome is None:  # aborted: the attempt does not count; run it later
                self.runs.requeue(job.key, attempt, self.inflight, queues.queue_of(fields))
                self.job.end_logs("interrupted")
                about = self.fields(job.key, attempt=attempt)
                log.info("%s interrupted by shutdown; requeued", job.key, extra=about)
                raise Aborted
            taken = None if self.leaving() else nxt
            self.keep(outcome)
            self.ended_reason = outcome.reason
            ran = Ran(
                job,
                fields,
                request,
                outcome,
                attempt,
                self.job.began,
                self.job.started_at,
                self.job.outcome_name,
            )
            try:
                started = self.conclude(ran, taken)
            finally:
                self.job.end_logs(outcome.status.value)
            # only now: until the end is in Valkey, the outcome file is what the next start of
            # the node adopts, should this process end before it could record it
            self.job.forget()
            self.job.empty_logs()
            return started

    def keep(self, outcome: Outcome) -> None:
        """Put the attempt's outcome where the node adopts it (node/runners/adoption.py),
        before Valkey is asked to record it: that call may hang (a stopped Valkey) or fail, and
        this process may then be killed with its node (a stopped unit, the next start's orphan
        killer) holding the only copy. The exit status and any reason only: the output is in
        the slot's log files, which adoption reads and which the next job of this slot reuses
        only after this end is recorded. Not fsynced on this path (conclude fsyncs it once
        Valkey refuses)."""
        self.job.keep(recorded(outcome, output=False))

    def conclude(self, ran: Ran, nxt: NextJob | None) -> list[Started]:
        """End the attempt: retried, or final and answered, in one Lua call that takes and
        starts the next jobs too (``nxt``: how; None, take none)."""
        return self.conclude_all([ran], [], nxt)

    def conclude_all(self, rans: list[Ran], back: list[Back], nxt: NextJob | None) -> list[Started]:
        """End the attempts ``rans`` (each by its plan), give ``back`` uncounted and take the
        next jobs (``nxt``; None: none), in one Lua call; tried again while Valkey is
        unreachable (the outcomes exist only here: node/slot/away.py), without the take."""
        first = rans[0].job.key if rans else back[0][0]
        away: Away | None = None  # made on the first failure: most ends never need one
        kept = False
        taking = nxt is not None
        while True:
            try:
                started = self._end(rans, back, nxt)
                # the ends (and the next starts with them) on a replica before the outcomes
                # are forgotten; unconfirmed, they are sent again like a cut call
                self.runs.confirm()
                if taking and nxt is None:  # a call cut before: it may have taken jobs
                    self.give_back_taken({r.job.key for r in rans} | {b[0] for b in back})
                return started
            except SignerGone:  # no retry can help: the next node's recovery ends the attempt
                log.error("%s: the signer is gone; exiting", first, extra=self.fields(first))
                os._exit(2)
            except Exception as exc:  # noqa: BLE001 - Valkey away: keep the outcome, retry
                away = away or Away(first)
                self.runs.leave_if_stale(exc)  # the retry asks the Sentinels where to go
                if not kept:
                    # Valkey may stay away long enough for the machine to go down: the
                    # outcomes (their output too: the slot's log files are not synced) fsynced
                    for ran in rans:
                        self.job.keep(recorded(ran.outcome), durable=True, name=ran.outcome_name)
                    kept = True
                nxt = None  # a half-applied call must not take more jobs
                time.sleep(away.failed(exc, log, **self.fields(first)))

    def give_back_taken(self, ended: set[str]) -> None:
        """After an end that was sent again: the call that was cut may have started the next
        job too (runs_take_next) without this process learning it. Left so, that job would
        stay ``started`` by a live slot whose lease the reaper renews for ever; it is given
        back uncounted (runs_requeue, fenced by its attempt), as is an entry that was moved
        but not started."""
        for key, fields in self.runs.in_flight(self.inflight):
            if key in ended:
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
            log.info("%s: taken by a cut call; given back", key, extra=self.fields(key))

    def _end(self, rans: list[Ran], back: list[Back], nxt: NextJob | None) -> list[Started]:
        """One Lua call: each attempt retried, finished here and answered, or finished and
        answered with a signed result, what never ran given back, the next jobs taken; the job
        statistics counted here go with it (:class:`Reports`)."""
        if len(rans) == 1 and not back:
            return self._end_one(rans[0], nxt)
        here = self.spec.node_id
        plans = [self._plan(ran) for ran in rans]
        remote = [p for p in plans if isinstance(p, AnswerRemote)]
        signed = iter(
            self._signed_all([build_result(p.request, p.body, origin=here) for p in remote])
        )
        calls: list[Call] = []
        for ran, plan in zip(rans, plans, strict=True):
            ending = ending_of(plan, ran.job.key, ran.attempt, self.inflight)
            if isinstance(plan, Retry):
                due_ms = ms_after(plan.delay_s)
                calls.append(retry_call(ending, queue=plan.queue, due_ms=due_ms, stats="[]"))
            elif isinstance(plan, AnswerHere):
                ttl = self.spec.reply_ttl_s
                request_key, reply_to = ran.request.key, plan.reply_to
                call = finish_local_call(
                    ending, request_key=request_key, reply_ttl_s=ttl, reply_to=reply_to, stats="[]"
                )
                calls.append(call)
            else:
                answer = next(signed)
                calls.append(finish_call(ending, answer.key, answer.to_hash(), "[]"))
        calls += [requeue_call(key, attempt, self.inflight, queue) for key, attempt, queue in back]
        retried = any(isinstance(p, Retry) for p in plans)
        batch, due = self._counted(rans, plans)
        due = due or nxt is None or retried
        sums = (self.reports.handover(batch), "") if due else ("", self.reports.handover(batch))
        oks, taken = self.runs.end_all(calls, self.inflight, nxt, sums)
        if retried:
            report(b"r")  # the node's retry scheduler sleeps until the next due retry
        ended = oks[: len(rans)]
        applied = any(ended) and (due or not taken)
        if all(ended) or not any(ended):
            self.reports.kept(batch, any(ended), applied=applied)
        else:  # superseded ones: their counts out (the totals handed over are replaced)
            ok = [(r, p) for r, p, e in zip(rans, plans, ended, strict=True) if e]
            self.reports.kept(
                self._counted([r for r, _ in ok], [p for _, p in ok])[0], True, applied=applied
            )
            if applied:
                self.reports.flush_totals()
        for ran, plan, ok_end in zip(rans, plans, ended, strict=True):
            self._log_end(ran, isinstance(plan, Retry), ok_end)
        self.ended_each = [ended_as(plan) for plan in plans]
        self.ended = self.ended_each[-1] if plans else ""
        return taken

    def _plan(self, ran: Ran) -> Plan:
        number = Attempt(ran.attempt, ran.fields["runner"], ran.started_at, now())
        here = self.spec.node_id
        return plan_ending(ran.job, ran.outcome, number, None, request=ran.request, here=here)

    def _counted(self, rans: list[Ran], plans: list[Plan]) -> tuple[StatsBatch, bool]:
        """The statistics not yet in Valkey with these ends added, and whether they are due."""
        at = time.monotonic()
        ends = []
        for ran, plan in zip(rans, plans, strict=True):
            status = ended_as(plan)
            reason = plan.cause if isinstance(plan, Retry) else plan.body.reason
            here = isinstance(plan, AnswerHere)
            ends.append((ran.fields, status, reason, here, at - ran.began))
        return self.reports.counted(ends, self.job.heartbeat_s)

    def _end_one(self, ran: Ran, nxt: NextJob | None) -> list[Started]:
        """One end, by the script of its plan, with the take (a lone job's way). A remote
        origin's result is signed first, as the batch's are: the end's script carries it."""
        job, attempt, request = ran.job, ran.attempt, ran.request
        plan = self._plan(ran)
        answer = None
        if isinstance(plan, AnswerRemote):
            answer = self._signed(build_result(plan.request, plan.body, origin=self.spec.node_id))
        ending = ending_of(plan, job.key, attempt, self.inflight)
        retry = isinstance(plan, Retry)
        self.ended = ended_as(plan)
        self.ended_each = [self.ended]
        took_s = time.monotonic() - ran.began
        here_answered = isinstance(plan, AnswerHere)
        end = (ran.fields, ending.status, ending.reason, here_answered, took_s)
        batch, due = self.reports.counted([end], self.job.heartbeat_s)
        due = due or nxt is None or retry
        sums = (self.reports.handover(batch), "") if due else ("[]", self.reports.handover(batch))
        taken: list[Started] = []
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
            assert answer is not None  # signed above: the plan answers a remote origin
            ok, taken = self.runs.finish(ending, answer.to_hash(), answer.key, nxt, stats=sums)
        self.reports.kept(batch, ok, applied=ok and (due or not taken))
        self._log_end(ran, retry, ok)
        return taken

    def _signed_all(self, results: list[Message]) -> list[Message]:
        if not results:
            return []
        if self.signer is None:
            raise RuntimeError("this runner has no signer: it cannot answer a remote request")
        return self.signer.sign_results(results)

    def _signed(self, result: Message) -> Message:
        if self.signer is None:
            raise RuntimeError("this runner has no signer: it cannot answer a remote request")
        return self.signer.sign_result(result)

    def _log_end(self, ran: Ran, retry: bool, ok: bool) -> None:
        job, outcome = ran.job, ran.outcome
        took_ms = (time.monotonic() - ran.began) * 1000
        if not ok:  # an end that counts is in the statistics: only a refusal is told
            self.reports.count("stale_results")
        elif not log.isEnabledFor(logging.INFO):  # a refusal warns, an end informs
            return
        status = "retry" if retry else outcome.status.value
        about = self.fields(job.key, outcome.reason, status=status, duration_ms=round(took_ms, 1))
        if not ok:
            log.warning("%s: result of a superseded attempt refused", job.key, extra=about)
        elif outcome.status is JobStatus.FINISHED:
            log.info("%s finished in %.1f ms", job.key, took_ms, extra=about)
        else:
            then = "retrying" if retry else "failed"
            log.info("%s %s after %.1f ms: %s", job.key, then, took_ms, outcome.reason, extra=about)


# -- what the process reports: to its node, and to Valkey with its ends ---------------------


def report(line: bytes) -> None:
    """A line to the node: ``up`` ready, ``t<n>`` jobs taken, ``c{json}`` counters to add,
    ``r`` a retry scheduled."""
    with contextlib.suppress(OSError):  # the node is gone: nobody to tell
        os.write(PROCESS.report, line + b"\n")


class Reports:
    """The figures one runner process holds for the node and for Valkey, until they are due."""

    def __init__(self, spec: RunnerSpec, runs: SyncRuns) -> None:
        self.spec, self.runs = spec, runs
        self.parent = os.getppid()
        self.taken = 0  # jobs taken since the last report to the node
        self.counts: dict[str, int] = {}  # the node's counters (hero-node status), to report
        # job statistics counted here, not yet in Valkey (bus/core/stats.py), and since;
        # and the slot's totals as handed over (read from Valkey at start: process.py main)
        self.stats = StatsBatch()
        self.stats_since = 0.0
        self.totals = StatsBatch()
        self.starts: dict[str, int] = {}  # script type -> starts not yet in ``stats``
        self._handed: tuple[StatsBatch, StatsBatch] | None = None  # a batch, totals with it

    def orphaned(self) -> bool:
        """Whether the node that started this process has died."""
        return os.getppid() != self.parent

    def took(self) -> None:
        """One job taken: reported with the next ``taken_every``."""
        self.taken += 1
        if self.taken >= self.spec.taken_every:
            self.flush()

    def started(self, fields: dict[str, str]) -> None:
        """A job this process started (its start's script counted nothing: see
        ``NextJob.counts_starts``), counted with the next end's statistics (its type is
        labelled then, with the end's: nothing of the statistics runs per start)."""
        script_type = fields.get("script_type", "")
        self.starts[script_type] = self.starts.get(script_type, 0) + 1

    def _with_starts(self, batch: StatsBatch) -> StatsBatch:
        for script_type, n in self.starts.items():
            batch.started({"script_type": script_type}, n)
        return batch

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def counted(
        self, ends: list[tuple[dict[str, str], str, str, bool, float]], beat_s: float
    ) -> tuple[StatsBatch, bool]:
        """The statistics not yet in Valkey with these attempts' ends added (each: the job's
        fields, status, reason, whether it was answered here, how long it took), and whether
        they are due now: every ``taken_every`` jobs or once per lease beat (``beat_s``); else
        the end hands them over only if it leaves this runner idle (bus/store/atomic/runs.py:
        then_source)."""
        batch = self._with_starts(self.stats.copy())
        for fields, status, reason, answered_here, took_s in ends:
            batch.ended(fields, status, reason, took_s)
            if answered_here and status != "retry":
                batch.answered(fields, status, reason, took_s)
        if not self.stats.jobs:
            self.stats_since = time.monotonic()
        age_s = time.monotonic() - self.stats_since
        return batch, batch.jobs >= self.spec.taken_every or age_s >= beat_s

    def handover(self, batch: StatsBatch) -> str:
        """The ``stats`` ARGV that hands ``batch`` over: the slot's totals with it added (one
        HSET, and a hand-over whose reply was lost counts nothing twice); once the node died,
        the increments alone, for the next node may have started another process of this
        slot from the totals."""
        if self.orphaned():
            return batch.encode()
        merged = self.totals.merged(batch)
        self._handed = (batch, merged)  # the totals once it is applied (:meth:`kept`)
        return merged.handover(self.spec.slot_id)

    def kept(self, batch: StatsBatch, ok: bool, *, applied: bool) -> None:
        """After an end: applied, nothing left (the totals include it); written but kept (a
        next job was started), the batch is what is left; refused (a superseded attempt:
        nothing written, not counted), what was left before."""
        if applied:
            if not self.orphaned():
                handed, self._handed = self._handed, None
                # merged once, for the hand-over, not again (per end: a lone job's every time)
                if handed is not None and handed[0] is batch:
                    self.totals = handed[1]
                else:
                    self.totals = self.totals.merged(batch)
            self.stats, self.starts = StatsBatch(), {}
        elif ok:
            self.stats, self.starts = batch, {}

    def flush_totals(self) -> None:
        """Hand the slot's totals over again (one HSET), replacing totals an end handed over
        that counted a superseded attempt of its batch (refused: it must not count)."""
        if not self.orphaned():
            with contextlib.suppress(SyncStoreError):  # counts only: the next hand-over has them
                self.runs.add_stats(self.totals, self.spec.slot_id)

    def flush(self, *, idle: bool = False) -> None:
        """Tell the node how many jobs this process took (every ``taken_every`` jobs, or with
        counters it is told anyway) and its counters (at once when not idle; else before
        blocking for more), not per job. ``idle``: also the job statistics still held here (an
        end that left this runner idle applied them already, unless it was not the last thing
        it did: a refusal, a requeue).

        Going idle tells the node nothing of the jobs taken. Only the supervisor's backpressure
        waits for that count, and only while the type's queue was at its mark: slots that
        emptied it took at least as many as it waits for, less what each holds back (under
        ``taken_every`` apiece), and it looks at the queue again every second anyway
        (node/intake/supervisor.py)."""
        if idle and (self.stats.jobs or self.starts):
            batch, self.stats = self._with_starts(self.stats), StatsBatch()
            self.starts = {}
            orphaned = self.orphaned()  # then increments: see handover
            if not orphaned:
                self.totals = self.totals.merged(batch)  # a failed hand-over: in the next one
            with contextlib.suppress(SyncStoreError):  # counts only
                if orphaned:
                    self.runs.add_stats(batch)
                else:
                    self.runs.add_stats(self.totals, self.spec.slot_id)
        lines = []
        if self.taken and (self.counts or not idle):
            lines.append(b"t%d" % self.taken)
            self.taken = 0
        if self.counts:
            lines.append(b"c" + orjson.dumps(self.counts))
            self.counts = {}
        if lines:
            # one write: the node reads both lines with one wake-up, not one each (a lone job
            # leaves its runner idle, and so flushes, every time)
            report(b"\n".join(lines))


# -- log lines ------------------------------------------------------------------------------


def runner_fields(spec: RunnerSpec) -> dict[str, object]:
    """What every line of a runner process carries, built once at its start: its context and
    its slot."""
    return {"ctx": spec.ctx, "runner": spec.slot_id}


def line_fields(
    about: dict[str, object], job_key: str = "", reason: str = "", **more: object
) -> dict[str, object]:
    """The ``extra`` of a runner's log line: ``about`` (:func:`runner_fields`), the job, and
    why (the job's ``reason`` as it is stored), then ``more`` (attempt, status, duration_ms)."""
    found = dict(about)
    if job_key:
        found["job"] = job_key
    if reason:
        found["reason"] = reason
    found |= more
    return found
