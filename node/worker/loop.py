"""A built-in runner process: pops its own queues and finishes its own jobs (the spec's local
runner, the external runner protocol of docs/use/runners.md, built in).

One process per runner slot (``[runners] python = N``: N processes per context), started,
watched and restarted by the node (node/runners/processes.py). It holds no secret it does not
need: it connects as the ``runner`` ACL user (node/host/acl.py), gets its spec (that URL with
its password) and the admission key over its stdin pipe, never in its environment, is not
dumpable, and has the results of remote requests signed by the node's signer process
(node/host/signer.py) over an inherited socket: the node key is not in this process. Per job,
with a blocking client and no event loop:

1. pop: the slot's lists in consume order (bus/core/queues.py) with ``runs_pop_first``,
   or, all empty, a blocking BLMOVE of the type queue, into ``inflight:runner:<type>:<slot>``,
   with ``runs_start_moved`` pipelined behind it (step 2 in the same round trip);
2. ``runs_start``: the attempt's fencing token and lease; then the job hash's admission stamp
   is checked (bus/core/admitted.py): a hash the node did not admit is dead-lettered
   ``not_admitted`` and ended in error, never run;
3. run: a python job in this very interpreter (the warm worker), any other type as a
   subprocess in its own process group (node/worker/job.py); a watch thread renews the
   lease, forwards live logs, enforces the timeout and stops the job on request; on a
   replicated store only once ``WAITAOF`` confirmed the start (``SyncRuns.confirm``): a start
   a failover lost would leave the job queued on the new primary, for another slot to run;
4. one Lua call ends the attempt and answers (``runs_finish_local``: the client's reply;
   ``runs_finish``: the result message signed here), or schedules the retry, and starts the
   next queued job in the same round trip (confirmed as a start is); while the type's
   circuit breaker is open (bus/store/atomic/type_breakers.py) that start, or
   ``runs_start``, refuses and says for how long, and the process waits that long without
   popping.

Signals from the node: SIGTERM drains (no new job; the running one finishes), SIGINT aborts
(the running job is killed and given back uncounted), SIGUSR1 wakes a blocking pop to look at
every list (a priority or targeted job was queued), SIGUSR2 says the Sentinels named a new
primary: every connection to the old one is shut at once (``SyncRuns.cut``), so that no
command waits on a primary that stalled and none reaches it when it wakes up still taking
writes (its replicas gone, but not yet noticed): a cut end is sent again and lands on the
new primary, a cut pop or start ends the process for the node's recovery of the slot.

The node's death drains too (its end of the control pipe closes; not PR_SET_PDEATHSIG, which
fires when the thread that forked exits, and trio forks from a worker thread): a job that
outlives its node finishes and answers, then the process exits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Protocol

from bus.core import admitted, keys, queues
from bus.core.envelope import ResultBody
from bus.core.ids import ms_after, new_id, new_nonce, now
from bus.core.models import JobStatus, Message, MessageType, RunnerJob
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError
from bus.store.atomic.runs import Ending, NextJob, Started, attempt_entry, unrunnable_detail
from bus.store.atomic.runs_sync import Begun, SyncRuns, SyncStoreError, connect, is_utf8
from bus.store.atomic.stats import StatsBatch
from bus.store.atomic.type_breakers import BreakerOpen
from bus.store.sentinel import durability
from node.host.hardening import not_dumpable
from node.host.heap import freeze_start_heap
from node.host.signer import SignerClient, SignerGone
from node.runners.exits import Outcome, outcome_of
from node.runners.lifecycle import RetryPolicy, after_attempt
from node.runners.spec import RunnerSpec, read_frame
from node.worker.job import PROCESS, Aborted, JobRun, Wake, prepare_process
from node.worker.log import line_fields, log_to

log = logging.getLogger("node.worker.loop")


class ResultSigner(Protocol):
    def sign_result(self, message: Message) -> Message: ...


class Runner:
    """The pop / start / run / end loop of one slot."""

    def __init__(
        self, spec: RunnerSpec, admission_key: bytes, signer: ResultSigner | None = None
    ) -> None:
        self.spec, self.admission_key, self.signer = spec, admission_key, signer
        self.runs = SyncRuns(connect(spec.url, spec.ctx), durability(spec.url))
        self.inflight = spec.inflight
        self.bases = queues.slot_bases(spec.script_type, spec.group, str(spec.slot))
        self.draining = False
        self.popping = False
        self.parent = os.getppid()
        self.jobs = 0
        self.job = JobRun(spec, self.runs, self.end_from_watch)
        self.ending = threading.Lock()  # the main thread or the watch thread ends an attempt
        self.taken = 0  # jobs taken since the last report to the node
        self.counts: dict[str, int] = {}  # the node's counters (hero-node status), to report
        self.breaker_wait_ms = 0  # the type's breaker lets no job start for this long
        self.gate = spec.script_type if spec.breaker_failures > 0 else ""
        # job statistics counted here, not yet in Valkey (bus/store/atomic/stats.py), and since;
        # and the slot's totals as handed over (read from Valkey at start: main)
        self.stats = StatsBatch()
        self.stats_since = 0.0
        self.totals = StatsBatch()

    # -- the loop ------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run jobs until drained, recycled (``max_jobs``) or aborted."""
        started: Started | None = None
        found_empty, held, pops = False, None, 0
        try:
            while not self._leaving():
                pops += 1
                nxt = self._take(queues.consume_order(self.bases, pops))
                if started is None and self.breaker_wait_ms:
                    self.wait_breaker()
                    continue
                begun: Begun | None
                if started is None:
                    popped = self.pop(list(nxt.lists), check_first=not found_empty, held=held)
                    found_empty, held = False, None
                    if popped is None:
                        continue
                    job_key, begun = popped
                else:
                    (job_key, begun), started = started, None
                self.taken += 1
                if self.taken >= self.spec.taken_every:
                    self.flush_reports()
                started = self.run_job(job_key, begun, nxt)
                self.job.sandbox.keep_spare()  # the job is answered: the next worker may start
                found_empty, held = nxt.found_empty, nxt.held
                self.breaker_wait_ms = self.breaker_wait_ms or nxt.breaker_wait_ms
        except Aborted:
            log.info("runner %s aborted", self.spec.slot_id, extra=self.fields())
        finally:
            self.flush_reports(idle=True)
            if started is not None:  # taken with the last result, but we are leaving
                attempt = int(started[1].get("attempt") or 0)
                self.runs.requeue(started[0], attempt, self.inflight, queues.queue_of(started[1]))

    def _leaving(self) -> bool:
        if self._orphaned():  # the node died: finish nothing new
            self.draining = True
        return self.draining or self.jobs >= self.spec.max_jobs

    def _take(self, lists: list[str]) -> NextJob:
        """How this slot takes and starts a job from ``lists`` (its lease, its token)."""
        spec = self.spec
        return NextJob(
            tuple(lists), spec.token_base, spec.lease_ttl_ms, spec.slot_id, script_type=self.gate
        )

    def pop(
        self, lists: list[str], *, check_first: bool, held: int | None = None
    ) -> tuple[str, Begun | None] | None:
        """A reliable pop over the slot's lists (see bus/core/queues.py): the entry, and how
        its start went if the pop started it too (None: not started yet). Only when every list
        is empty a blocking pop, which starts its entry in the same round trip. A signal
        (drain, wake) interrupts the blocking wait; an entry the server moved just before is
        then taken from the head of the in-flight list, if the list grew. What it held before
        the wait comes from the script that found the lists empty (the take with the last
        answer, ``held``, or the pop that does not block): the blocking pop sends no command
        of its own ahead."""
        if check_first:
            found, held = self.runs.pop_first(lists, self.inflight)
            if found is not None:
                return self._usable(found, None)
        base = next((q for q in lists if q.count(":") == 1), lists[0])
        self.flush_reports(idle=True)  # idle now: the node's figures are complete while it waits
        before = self.runs.list_length(self.inflight) if held is None else held
        nxt = self._take(lists)
        try:
            self.popping = True
            if self.draining:
                return None
            value, begun = self.runs.pop_started(
                base, self.inflight, self.spec.pop_timeout_s, before, nxt
            )
        except Wake:
            self.popping = False
            moved = self.runs.list_head(self.inflight)
            if moved is None or self.runs.list_length(self.inflight) <= before:
                return None
            # the start pipelined behind the pop may have run: the job's hash says
            fields = self.runs.hash_all(moved)
            ours = fields.get("status") == JobStatus.STARTED.value
            ours = ours and fields.get("runner") == self.spec.token(moved)
            return self._usable(moved, fields if ours else None)
        finally:
            self.popping = False
        return None if value is None else self._usable(value, begun)

    def wait_breaker(self) -> None:
        """The type's circuit breaker is open: wait it out without popping (a wake-up or a
        drain signal ends the wait early, as it ends a blocking pop)."""
        wait_s, self.breaker_wait_ms = self.breaker_wait_ms / 1000, 0
        # half-open, the runners without a probe look again every second: not worth a line each
        level = logging.INFO if wait_s > 1 else logging.DEBUG
        log.log(level, "%s: circuit breaker open; next try in %.1f s", self.spec.slot_id, wait_s)
        self.flush_reports(idle=True)
        try:
            self.popping = True
            if not self.draining:
                time.sleep(wait_s)
        except Wake:
            pass
        finally:
            self.popping = False

    def queue_of(self, job_key: str) -> str:
        """The list a popped job was queued on (its targeting fields)."""
        names = ("script_type", "group", "instance", "priority")
        return queues.queue_of(self.runs.hash_fields(job_key, names))

    def _usable(self, value: str, begun: Begun | None) -> tuple[str, Begun | None] | None:
        if is_utf8(value):
            return value, begun
        why = self.fields(reason=Reason.NOT_UTF8)
        log.warning("refused a queue entry of %s: not UTF-8", self.spec.script_type, extra=why)
        self.runs.refuse(self.inflight, value, Reason.NOT_UTF8, keys.queue(self.spec.script_type))
        return None

    # -- one job -------------------------------------------------------------------------------

    def run_job(self, job_key: str, begun: Begun | None, nxt: NextJob) -> Started | None:
        """Start (unless started already: with the previous result, or by the pop: ``begun``
        says how that start went), run and end one job; the next job if it was started in the
        same round trip as this one's end."""
        if begun is None:
            token = self.spec.token(job_key)
            begun = self.runs.start(job_key, token, nxt.ttl_ms, nxt.runner_id, self.gate)
        if isinstance(begun, BreakerOpen):  # back to the head of its queue, untouched
            self.runs.give_back(self.inflight, job_key, self.queue_of(job_key))
            self.breaker_wait_ms = begun.wait_ms
            return None
        if isinstance(begun, str):  # the entry names nothing to run: refused, alone
            detail = unrunnable_detail(begun)
            log.warning("refused %s: %s", job_key, detail, extra=self.fields(job_key, begun))
            self.runs.refuse(self.inflight, job_key, begun, keys.queue(self.spec.script_type))
            return None
        fields = begun
        if not fields:  # final (a duplicate queue entry)
            self.runs.ack(self.inflight, job_key)
            return None
        attempt = int(fields["attempt"])
        unadmitted = admitted.problem(self.admission_key, self.spec.ctx, job_key, fields)
        if unadmitted:
            self.refuse_unadmitted(job_key, fields, attempt, unadmitted)
            return None
        self.jobs += 1
        try:
            job = RunnerJob.from_hash(fields)
            request = self._request_of(job, fields)
        except (ModelError, ContentError, ValueError) as exc:
            why = self.fields(job_key, Reason.MALFORMED_JOB)
            log.error("cannot run %s (context %d): %s", job_key, self.spec.ctx, exc, extra=why)
            queue = queues.queue_of(fields)
            self.runs.dead_letter(job_key, Reason.MALFORMED_JOB, str(exc), queue)
            self.runs.finish_malformed(job_key, attempt, self.inflight, str(exc))
            return None
        # on a replicated store, not before a replica has the start: one a failover lost would
        # leave the job queued on the new primary, for another slot to run a second time
        self.runs.confirm()
        if log.isEnabledFor(logging.INFO):  # the line's fields cost even when it is dropped
            about = self.fields(job_key, attempt=attempt)
            log.info("%s started (attempt %d)", job_key, attempt, extra=about)
        outcome = self.job.run(job, request, attempt)
        with self.ending:
            if outcome is None:  # aborted: the attempt does not count; run it later
                self.runs.requeue(job_key, attempt, self.inflight, queues.queue_of(fields))
                self.job.end_logs("interrupted")
                about = self.fields(job_key, attempt=attempt)
                log.info("%s interrupted by shutdown; requeued", job_key, extra=about)
                raise Aborted
            taken = None if self._leaving() else nxt
            self.keep(outcome)
            try:
                started = self.conclude(job, fields, request, outcome, attempt, taken)
            finally:
                self.job.end_logs(outcome.status.value)
            # only now: until the end is in Valkey, the outcome file is what the next start of
            # the node adopts, should this process end before it could record it
            self.job.forget()
            return started

    def refuse_unadmitted(
        self, job_key: str, fields: dict[str, str], attempt: int, why: str
    ) -> None:
        """A job hash without this node's admission stamp: dead-lettered and ended in error,
        never run (written with a runner password, or changed since it was admitted)."""
        about = self.fields(job_key, Reason.NOT_ADMITTED, attempt=attempt)
        log.warning("refused %s (context %d): %s", job_key, self.spec.ctx, why, extra=about)
        self.runs.dead_letter(job_key, Reason.NOT_ADMITTED, why, queues.queue_of(fields))
        self.runs.finish_malformed(job_key, attempt, self.inflight, why, reason=Reason.NOT_ADMITTED)
        self.counts["jobs_not_admitted"] = self.counts.get("jobs_not_admitted", 0) + 1

    def _request_of(self, job: RunnerJob, fields: dict[str, str]) -> Message:
        """The message that carried ``job``, as far as answering it needs."""
        origin = fields.get("origin")
        if not origin:
            return Message.from_hash(self.runs.hash_all(job.message_key))
        caller, ident = keys.parse_message_key(job.message_key)
        reply_to = fields.get("reply_to", "")  # materialise copies the signed one here
        return Message(
            ident,
            caller,
            self.spec.ctx,
            origin=origin,
            destination=self.spec.node_id,
            reply_to=reply_to,
        )

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

    def keep(self, outcome: Outcome) -> None:
        """Put the attempt's outcome where the node adopts it (node/runners/adoption.py),
        before Valkey is asked to record it: that call may hang (a stopped Valkey) or fail, and
        this process may then be killed with its node (a stopped unit, the next start's orphan
        killer) holding the only copy. The exit status and any reason only: the output is in
        the slot's log files, which adoption reads and which the next job of this slot reuses
        only after this end is recorded. Not fsynced on this path (conclude fsyncs it once
        Valkey refuses)."""
        self.job.keep(recorded(outcome, output=False))

    def conclude(
        self,
        job: RunnerJob,
        fields: dict[str, str],
        request: Message,
        outcome: Outcome,
        attempt: int,
        nxt: NextJob | None,
    ) -> Started | None:
        """End the attempt: retried, or final and answered, in one Lua call; retried while
        Valkey is unreachable (the outcome exists only here)."""
        delay = 0.2
        kept = False
        taking = nxt is not None
        while True:
            try:
                started = self._end(job, fields, request, outcome, attempt, nxt)
                # the end (and the next start with it) on a replica before the outcome is
                # forgotten; unconfirmed, it is sent again like a cut one
                self.runs.confirm()
                if taking and nxt is None:  # a call cut before: it may have taken a job
                    self.give_back_taken(job.key)
                return started
            except SignerGone:  # no retry can help: the next node's recovery ends the attempt
                log.error("%s: the signer is gone; exiting", job.key, extra=self.fields(job.key))
                os._exit(2)
            except Exception as exc:  # noqa: BLE001 - Valkey away: keep the outcome, retry
                self.runs.leave_if_stale(exc)  # the retry asks the Sentinels where to go
                if not kept:
                    # Valkey may stay away long enough for the machine to go down: the outcome
                    # (its output too: the slot's log files are not synced) fsynced
                    self.job.keep(recorded(outcome), durable=True)
                    kept = True
                log.warning(
                    "%s: cannot record the outcome yet (%r); retrying",
                    job.key,
                    exc,
                    extra=self.fields(job.key),
                )
                nxt = None  # a half-applied call must not take a second job
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def give_back_taken(self, ended: str) -> None:
        """After an end that was sent again: the call that was cut may have started the next
        job too (runs_take_next) without this process learning it. Left so, that job would
        stay ``started`` by a live slot whose lease the reaper renews for ever; it is given
        back uncounted (runs_requeue, fenced by its attempt), as is an entry that was moved
        but not started."""
        for key in self.runs.list_all(self.inflight):
            if key == ended:
                continue
            names = ("status", "attempt", "runner", "script_type", "group", "instance", "priority")
            fields = self.runs.hash_fields(key, names)
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

    def _end(
        self,
        job: RunnerJob,
        fields: dict[str, str],
        request: Message,
        outcome: Outcome,
        attempt: int,
        nxt: NextJob | None,
    ) -> Started | None:
        """One Lua call: retried, finished here and answered, or finished and answered with a
        signed result; the job statistics counted here go with it (see :meth:`_counted`)."""
        token = self.spec.token(job.key)
        started_at = self.job.started_at
        entry = attempt_entry(attempt, token, outcome.status.value, outcome.reason, started_at)
        policy = RetryPolicy.of(job)
        after = after_attempt(outcome.status, outcome.reason, attempt, job.retries, policy=policy)
        result = outcome.result | {"attempts": str(attempt)}
        ending = Ending(
            job.key, attempt, self.inflight, outcome.status.value, result, outcome.reason, entry
        )
        taken: Started | None = None
        here = request.origin == self.spec.node_id
        reason = f"retrying after: {outcome.reason}" if after.retry else outcome.reason
        batch, due = self._counted(fields, "retry" if after.retry else ending.status, reason, here)
        due = due or nxt is None or after.retry
        sums = (self._handover(batch), "") if due else ("[]", self._handover(batch))
        if after.retry:
            queue = queues.target_queue(job)
            due_ms = ms_after(after.delay_s)
            ok = self.runs.retry_later(
                ending, queue=queue, reason=reason, due_ms=due_ms, stats=sums[0]
            )
            report(b"r")  # the node's retry scheduler sleeps until the next due retry
        elif here:
            ok, taken = self.runs.finish_local(
                ending,
                request.key,
                self.spec.reply_ttl_s,
                nxt,
                reply_to=request.reply_to,
                stats=sums,
            )
        else:
            answer = self._answer(
                request, ResultBody(request.key, job.key, outcome.status, result, outcome.reason)
            )
            ok, taken = self.runs.finish(ending, answer.to_hash(), answer.key, nxt, stats=sums)
        self._kept(batch, ok, applied=ok and (due or taken is None))
        self._log_end(job, outcome, after.retry, ok)
        return taken

    def _counted(
        self, fields: dict[str, str], status: str, reason: str, answered_here: bool
    ) -> tuple[StatsBatch, bool]:
        """The statistics not yet in Valkey with this attempt's end added, and whether they
        are due now: every ``taken_every`` jobs or once per lease beat; else the end hands them
        over only if it leaves this runner idle (bus/store/atomic/runs.py: then_source)."""
        took_s = time.monotonic() - self.job.began
        batch = self.stats.copy()
        batch.ended(fields, status, reason, took_s)
        if answered_here and status != "retry":
            batch.answered(fields, status, reason, took_s)
        if not self.stats.jobs:
            self.stats_since = time.monotonic()
        age_s = time.monotonic() - self.stats_since
        return batch, batch.jobs >= self.spec.taken_every or age_s >= self.job.heartbeat_s

    def _handover(self, batch: StatsBatch) -> str:
        """The ``stats`` ARGV that hands ``batch`` over: the slot's totals with it added (one
        HSET, and a hand-over whose reply was lost counts nothing twice); once the node died,
        the increments alone, for the next node may have started another process of this
        slot from the totals."""
        if self._orphaned():
            return batch.encode()
        return self.totals.merged(batch).handover(self.spec.slot_id)

    def _orphaned(self) -> bool:
        return os.getppid() != self.parent

    def _kept(self, batch: StatsBatch, ok: bool, *, applied: bool) -> None:
        """After an end: applied, nothing left (the totals include it); written but kept (a
        next job was started), the batch is what is left; refused (a superseded attempt:
        nothing written, not counted), what was left before."""
        if applied:
            if not self._orphaned():
                self.totals = self.totals.merged(batch)
            self.stats = StatsBatch()
        elif ok:
            self.stats = batch

    def _answer(self, request: Message, body: ResultBody) -> Message:
        msg = Message(
            id=new_id(),
            caller_id=request.caller_id,
            context_id=request.context_id,
            message=body.encode(),
            message_type=MessageType.RESULT,
            created_at=now(),
            updated_at=now(),
            origin=self.spec.node_id,
            destination=request.origin,
            nonce=new_nonce(),
        )
        if self.signer is None:
            raise RuntimeError("this runner has no signer: it cannot answer a remote request")
        return self.signer.sign_result(msg)

    def _log_end(self, job: RunnerJob, outcome: Outcome, retry: bool, ok: bool) -> None:
        took_ms = (time.monotonic() - self.job.began) * 1000
        name = "job_retries" if retry else "jobs_" + outcome.status.value
        name = name if ok else "stale_results"
        self.counts[name] = self.counts.get(name, 0) + 1
        if ok and not log.isEnabledFor(logging.INFO):  # a refusal warns, an end informs
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

    def fields(self, job_key: str = "", reason: str = "", **more: object) -> dict[str, object]:
        return line_fields(self.spec, job_key, reason, **more)

    def flush_reports(self, *, idle: bool = False) -> None:
        """Tell the node how many jobs this process took (its supervisor's backpressure waits
        for that) and how they ended (its counters): every ``taken_every`` jobs and before
        blocking for more, not per job. ``idle``: also the job statistics still held here
        (an end that left this runner idle applied them already, unless it was not the last
        thing it did: a refusal, a requeue)."""
        if idle and self.stats.jobs:
            batch, self.stats = self.stats, StatsBatch()
            orphaned = self._orphaned()  # then increments: see _handover
            if not orphaned:
                self.totals = self.totals.merged(batch)  # a failed hand-over: in the next one
            with contextlib.suppress(SyncStoreError):  # counts only
                if orphaned:
                    self.runs.add_stats(batch)
                else:
                    self.runs.add_stats(self.totals, self.spec.slot_id)
        if self.taken:
            report(b"t%d" % self.taken)
            self.taken = 0
        if self.counts:
            report(b"c" + json.dumps(self.counts).encode())
            self.counts = {}


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


def report(line: bytes) -> None:
    """A line to the node: ``up`` ready, ``t<n>`` jobs taken, ``c{json}`` counters to add,
    ``r`` a retry scheduled."""
    with contextlib.suppress(OSError):  # the node is gone: nobody to tell
        os.write(PROCESS.report, line + b"\n")


_RUNNER: Runner | None = None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    runner = _RUNNER
    if runner is None:
        return
    if signum == signal.SIGUSR2:  # the primary moved: the blocked call fails on its own
        runner.runs.cut()
        return
    if signum in (signal.SIGTERM, signal.SIGINT):
        runner.draining = True
    if signum == signal.SIGINT:
        runner.job.abort()
    if runner.popping:
        runner.popping = False
        raise Wake


def main() -> None:
    """``python -m node.worker.pyjobs --runner``: the spec first on stdin (node/runners/spec.py)."""
    global _RUNNER
    not_dumpable()  # before the frame: the password and key never sit in a readable process
    try:
        spec, admission_key = read_frame(0)
    except EOFError:  # the node stopped (or died) before it wrote the spec: nothing to serve
        os._exit(0)
    log_to(os.dup(2), spec)  # fd 2 becomes a python job's capture file
    signer = SignerClient(spec.signer_fd) if spec.signer_fd >= 0 else None
    prepare_process(spec)  # fds, subreaper, pid file, environment
    _RUNNER = runner = Runner(spec, admission_key, signer)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, _on_signal)
    if os.getppid() != runner.parent:
        return
    runner.job.start_watch()
    frozen = freeze_start_heap()
    report(b"up")
    up = line_fields(spec)
    log.info(
        "runner %s (context %d) up, pid %d (start-up heap frozen: %d objects)",
        spec.slot_id,
        spec.ctx,
        os.getpid(),
        frozen,
        extra=up,
    )
    try:
        runner.runs.set_breaker(
            spec.script_type, spec.breaker_failures, spec.breaker_open_ms, spec.breaker_probes
        )
        runner.totals = runner.runs.slot_totals(spec.slot_id)
        runner.serve()
    except SyncStoreError as exc:  # a pop or a start whose outcome is unknown: the node's
        # recovery of the slot knows (it requeues the popped entry, ends the started attempt)
        log.error("runner %s lost Valkey (%r); exiting", spec.slot_id, exc, extra=up)
        runner.job.sandbox.stop(graceful=True)
        os._exit(2)
    # no job runs now: the sandbox ends as a retired one does, reaped here with its jobs' CPU
    # (not left to bwrap's die-with-parent and init, which would count it nowhere)
    runner.job.sandbox.stop(graceful=True)
    os._exit(0)  # the watch thread is a daemon; nothing else to wait for
