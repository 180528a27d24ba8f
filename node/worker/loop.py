"""The loop of one runner slot (the spec's local runner, the external runner protocol of
docs/use/runners.md, built in): it pops its own queues and finishes its own jobs, in the runner
process that serves the slot (node/worker/process.py: its start, its signals, its exit). Per
job, with a blocking client and no event loop:

1. pop: the slot's lists in consume order (bus/core/queues.py) with ``runs_pop_first``,
   or, all empty, a blocking BLMOVE of the type queue, into ``inflight:runner:<type>:<slot>``,
   with ``runs_start_moved`` pipelined behind it (step 2 in the same round trip);
2. ``runs_start``: the attempt's fencing token and lease; then the job hash's admission stamp
   is checked (bus/core/admitted.py): a hash the node did not admit is dead-lettered
   ``not_admitted`` and ended in error, never run;
3. run: in the slot's sandboxed worker (node/sandbox/host.py; node/sandbox/inner.py: by
   default a python job in its warm job process, any other type spawned from there), as
   node/worker/job.py prepares it in the slot's terms; a watch thread renews the
   lease, forwards live logs, enforces the timeout and stops the job on request; on a
   replicated store only once ``WAITAOF`` confirmed the start (``SyncRuns.confirm``): a start
   a failover lost would leave the job queued on the new primary, for another slot to run;
4. one Lua call ends the attempt and answers (``runs_finish_local``: the client's reply;
   ``runs_finish``: the result message signed here), or schedules the retry, and starts the
   next queued job in the same round trip (confirmed as a start is); while the type's
   circuit breaker is open (bus/store/atomic/type_breakers.py) that start, or
   ``runs_start``, refuses and says for how long, and the process waits that long without
   popping.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from bus.core import admitted, keys, queues
from bus.core.attempts import Outcome
from bus.core.models import Message, RunnerJob
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError
from bus.store.atomic.runs import Begun, NextJob, Started, unrunnable_detail
from bus.store.atomic.runs_sync import SyncRuns
from bus.store.atomic.type_breakers import BreakerOpen
from bus.store.sentinel import durability
from node.slot.spec import RunnerSpec
from node.worker.batch import MAX_BATCH_JOBS, run_and_end_batch
from node.worker.ending import Ender, Ready, Reports, ResultSigner, line_fields, runner_fields
from node.worker.job import Aborted, JobRun, Wake
from node.worker.spans import attempt_span
from node.worker.spans import end as end_span

log = logging.getLogger("node.worker.loop")

__all__ = ["RunnerSpec", "SlotLoop"]


# -- taking jobs: a reliable pop over the slot's lists in consume order (bus/core/queues.py), a
# blocking pop with the start pipelined behind it when every list is empty, and the wait while
# the type's circuit breaker is open


@dataclass
class Flags:
    """What the signal handlers read and change (node/worker/process.py): whether
    the process drains, and whether the main thread waits where a signal may interrupt it."""

    draining: bool = False
    popping: bool = False


def batch_size(spec: RunnerSpec) -> int:
    """How many queued jobs the slot takes at once: ``batch_jobs`` (at most
    :data:`~node.worker.batch.MAX_BATCH_JOBS`) for python jobs in a warm sandbox, traced or
    not (each job of a batch has its own attempt span: node/worker/spans.py), on a single or a
    replicated store; else one."""
    warm = spec.in_process and not spec.sandbox.get("fresh_process")
    if not warm:
        return 1
    # a replicated store too: a take's starts are confirmed (one WAITAOF) before any of its
    # jobs runs, and its ends before their outcome files are forgotten (node/worker/loop.py);
    # nothing is confirmed on a primary the Sentinels have replaced (bus/store/sync.py confirm)
    return max(1, min(spec.batch_jobs, MAX_BATCH_JOBS))


class Popper:
    """The popping state of one slot: its lists, and how long its type's breaker holds it."""

    def __init__(self, spec: RunnerSpec, runs: SyncRuns, reports: Reports, flags: Flags) -> None:
        self.spec, self.runs, self.reports, self.flags = spec, runs, reports, flags
        self.inflight = spec.inflight
        self.bases = queues.slot_bases(spec.script_type, spec.group, str(spec.slot))
        self.breaker_wait_ms = 0  # the type's breaker lets no job start for this long
        self.gate = spec.script_type if spec.breaker_failures > 0 else ""
        self.count = batch_size(spec)

    def take(self, lists: list[str]) -> NextJob:
        """How this slot takes and starts jobs from ``lists`` (its lease, its token, how many
        of what is queued at once)."""
        spec = self.spec
        return NextJob(
            tuple(lists),
            spec.token_base,
            spec.lease_ttl_ms,
            spec.slot_id,
            script_type=self.gate,
            count=self.count,
            counts_starts=True,
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
                return self.usable(found, None)
        base = next((q for q in lists if q.count(":") == 1), lists[0])
        self.reports.flush(idle=True)  # idle now: the node's figures are complete while it waits
        before = self.runs.held(self.inflight) if held is None else held
        nxt = self.take(lists)
        try:
            self.flags.popping = True
            if self.flags.draining:
                return None
            value, begun = self.runs.pop_started(
                base, self.inflight, self.spec.pop_timeout_s, before, nxt
            )
        except Wake:
            self.flags.popping = False
            # the start pipelined behind the pop may have run: the job's hash says
            moved = self.runs.moved_before_wake(self.inflight, before, self.spec.token_base)
            return None if moved is None else self.usable(*moved)
        finally:
            self.flags.popping = False
        return None if value is None else self.usable(value, begun)

    def wait_breaker(self) -> None:
        """The type's circuit breaker is open: wait it out without popping (a wake-up or a
        drain signal ends the wait early, as it ends a blocking pop)."""
        wait_s, self.breaker_wait_ms = self.breaker_wait_ms / 1000, 0
        # half-open, the runners without a probe look again every second: not worth a line each
        level = logging.INFO if wait_s > 1 else logging.DEBUG
        log.log(level, "%s: circuit breaker open; next try in %.1f s", self.spec.slot_id, wait_s)
        self.reports.flush(idle=True)
        try:
            self.flags.popping = True
            if not self.flags.draining:
                time.sleep(wait_s)
        except Wake:
            pass
        finally:
            self.flags.popping = False

    def usable(self, value: str | bytes, begun: Begun | None) -> tuple[str, Begun | None] | None:
        """A popped entry, unless it is not UTF-8 text (the store hands it over as bytes):
        refused then (dead-lettered)."""
        if isinstance(value, str):
            return value, begun
        why = line_fields(runner_fields(self.spec), reason=Reason.NOT_UTF8)
        log.warning("refused a queue entry of %s: not UTF-8", self.spec.script_type, extra=why)
        self.runs.refuse(self.inflight, value, Reason.NOT_UTF8, keys.queue(self.spec.script_type))
        return None


# -- the loop -------------------------------------------------------------------------------


class SlotLoop:
    """The pop / start / run / end loop of one slot. Its state is split by what owns it: the
    popping (:class:`Popper`), the attempts from their run to their end
    (:class:`~node.worker.ending.Ender`), the reports (:class:`~node.worker.ending.Reports`),
    the running job (:class:`~node.worker.job.JobRun`); the loop keeps only the count of jobs
    it ran and the flags the signals change, and checks each start before it hands the
    attempt over."""

    def __init__(
        self, spec: RunnerSpec, admission_key: bytes, signer: ResultSigner | None = None
    ) -> None:
        self.spec, self.admission_key = spec, admission_key
        self.runs = SyncRuns.open(spec.url, spec.ctx, durability(spec.url))
        self.inflight = spec.inflight
        self.flags = Flags()
        self.jobs = 0
        self.reports = Reports(spec, self.runs)
        self.job = JobRun(spec, self.runs, self.end_from_watch)
        self.ender = Ender(spec, self.runs, self.job, self.reports, self._leaving, signer)
        self.popper = Popper(spec, self.runs, self.reports, self.flags)
        self.traced = bool(spec.tracing)  # the one check a job costs with tracing off
        self.about = runner_fields(spec)  # what every line says; a job's lines add to it

    @property
    def draining(self) -> bool:
        """Whether the process drains (SIGTERM, SIGINT, or its node died): no new job."""
        return self.flags.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.flags.draining = value

    # -- the loop ------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run jobs until drained, recycled (``max_jobs``) or aborted."""
        taken: list[Started] = []  # started with the last end
        found_empty, held, pops = False, None, 0
        try:
            while not self._leaving():
                pops += 1
                nxt = self.popper.take(queues.consume_order(self.popper.bases, pops))
                if not taken and self.popper.breaker_wait_ms:
                    self.popper.wait_breaker()
                    continue
                if not taken:
                    popped = self.popper.pop(
                        list(nxt.lists), check_first=not found_empty, held=held
                    )
                    found_empty, held = False, None
                    if popped is None:
                        continue
                    self.reports.took()
                    taken = self.run_job(popped[0], popped[1], nxt)
                else:
                    batch, taken = taken, []
                    for _ in batch:
                        self.reports.took()
                    if len(batch) > 1:  # what shows that batches form (hero-node status)
                        self.reports.count("batch_takes")
                    if len(batch) == 1:
                        taken = self.run_job(batch[0][0], batch[0][1], nxt)
                    else:
                        taken = self.run_batch(batch, nxt)
                self.job.sandbox.keep_spare()  # the job is answered: the next worker may start
                found_empty, held = nxt.found_empty, nxt.held
                self.popper.breaker_wait_ms = self.popper.breaker_wait_ms or nxt.breaker_wait_ms
        except Aborted:
            log.info("runner %s aborted", self.spec.slot_id, extra=self.fields())
        finally:
            for _, fields in taken:  # started with the last result: counted, then given back
                self.reports.started(fields)
            self.reports.flush(idle=True)
            for job_key, fields in taken:  # taken with the last result, but we are leaving
                attempt = int(fields.get("attempt") or 0)
                self.runs.requeue(job_key, attempt, self.inflight, queues.queue_of(fields))

    def _leaving(self) -> bool:
        if self.reports.orphaned():  # the node died: finish nothing new
            self.flags.draining = True
        return self.flags.draining or self.jobs >= self.spec.max_jobs

    # -- one job -------------------------------------------------------------------------------

    def run_job(self, job_key: str, begun: Begun | None, nxt: NextJob) -> list[Started]:
        """Start (unless started already: with the previous result, or by the pop: ``begun``
        says how that start went), run and end one job; the next jobs if they were started in
        the same round trip as this one's end."""
        if begun is None:
            token = self.spec.token(job_key)
            begun = self.runs.start(
                job_key, token, nxt.ttl_ms, nxt.runner_id, self.popper.gate, counted=True
            )
        if isinstance(begun, BreakerOpen):  # back to the head of its queue, untouched
            self.runs.give_back(self.inflight, job_key, self.runs.queue_of(job_key))
            self.popper.breaker_wait_ms = begun.wait_ms
            return []
        if isinstance(begun, str):  # the entry names nothing to run: refused, alone
            detail = unrunnable_detail(begun)
            log.warning("refused %s: %s", job_key, detail, extra=self.fields(job_key, begun))
            self.runs.refuse(self.inflight, job_key, begun, keys.queue(self.spec.script_type))
            return []
        ready = self._ready(job_key, begun)
        if ready is None:
            return []
        job, fields, request, attempt = ready
        # on a replicated store, not before a replica has the start: one a failover lost would
        # leave the job queued on the new primary, for another slot to run a second time
        self.runs.confirm()
        if self.traced:
            self.job.span = attempt_span(self.spec, job, fields, request, attempt)
        if log.isEnabledFor(logging.INFO):  # the line while the job runs, not before it
            self.job.meanwhile = functools.partial(self._log_start, job_key, attempt)
        try:
            return self.ender.run_and_end(job, fields, request, attempt, nxt)
        finally:
            if self.job.span is not None:
                span, self.job.span = self.job.span, None
                end_span(span, self.ender.ended or "interrupted", self.ender.ended_reason)

    def _ready(self, job_key: str, fields: dict[str, str]) -> Ready | None:
        """A started job as it runs (its job, fields, request and attempt), or None: a final
        job's duplicate entry (dropped), a hash this node did not admit or cannot read
        (refused, ended in error)."""
        if not fields:  # final (a duplicate queue entry)
            self.runs.ack(self.inflight, job_key)
            return None
        self.reports.started(fields)  # its start's script counted nothing
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
        return job, fields, request, attempt

    def _log_start(self, job_key: str, attempt: int) -> None:
        if log.isEnabledFor(logging.INFO):  # the line's fields cost even when it is dropped
            about = self.fields(job_key, attempt=attempt)
            log.info("%s started (attempt %d)", job_key, attempt, extra=about)

    # -- a batch -------------------------------------------------------------------------------

    def run_batch(self, batch: list[Started], nxt: NextJob) -> list[Started]:
        """Run and end jobs started together, once each is checked: with the ender
        (:func:`~node.worker.batch.run_and_end_batch`)."""
        ready = [r for key, fields in batch if (r := self._ready(key, fields)) is not None]
        if not ready:
            return []
        self.runs.confirm()  # as run_job's: the starts on a replica before any job runs
        if len(ready) == 1:
            job, fields, request, attempt = ready[0]
            self._log_start(job.key, attempt)
            return self.ender.run_and_end(job, fields, request, attempt, nxt)
        for job, _, _, attempt in ready:
            self._log_start(job.key, attempt)
        return run_and_end_batch(self.ender, ready, nxt)

    def refuse_unadmitted(
        self, job_key: str, fields: dict[str, str], attempt: int, why: str
    ) -> None:
        """A job hash without this node's admission stamp: dead-lettered and ended in error,
        never run (written with a runner password, or changed since it was admitted)."""
        about = self.fields(job_key, Reason.NOT_ADMITTED, attempt=attempt)
        log.warning("refused %s (context %d): %s", job_key, self.spec.ctx, why, extra=about)
        self.runs.dead_letter(job_key, Reason.NOT_ADMITTED, why, queues.queue_of(fields))
        self.runs.finish_malformed(job_key, attempt, self.inflight, why, reason=Reason.NOT_ADMITTED)
        self.reports.count("jobs_not_admitted")

    def _request_of(self, job: RunnerJob, fields: dict[str, str]) -> Message:
        """The message that carried ``job``, as far as answering it needs."""
        origin = fields.get("origin")
        if not origin:
            return Message.from_hash(self.runs.message_fields(job.message_key))
        caller, ident = keys.parse_message_key(job.message_key)
        # materialising copies the signed reply_to and trace context here
        # (node/intake/admission.py), under the admission stamp: the trace the attempt
        # continues and its result carries back costs no read of the message (an HGETALL per
        # job, its script too)
        return Message(
            ident,
            caller,
            self.spec.ctx,
            origin=origin,
            destination=self.spec.node_id,
            reply_to=fields.get("reply_to", ""),
            traceparent=fields.get("traceparent", ""),
            tracestate=fields.get("tracestate", ""),
        )

    def end_from_watch(
        self, job: RunnerJob, request: Message, outcome: Outcome | None, attempt: int
    ) -> bool:
        """The watch thread ends the running python job's attempt just before the process
        exits (:meth:`node.worker.ending.Ender.end_from_watch`)."""
        return self.ender.end_from_watch(job, request, outcome, attempt)

    def fields(self, job_key: str = "", reason: str = "", **more: object) -> dict[str, object]:
        return line_fields(self.about, job_key, reason, **more)
