"""How a runner process takes its next job (node/worker/loop.py): a reliable pop over its slot's
lists in consume order (bus/core/queues.py), a blocking pop with the start pipelined behind it
when every list is empty, and the wait while its type's circuit breaker is open."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from bus.core import keys, queues
from bus.core.reasons import Reason
from bus.store.atomic.runs import NextJob
from bus.store.atomic.runs_sync import Begun, SyncRuns
from node.slot.spec import RunnerSpec
from node.worker.batch import MAX_BATCH_JOBS
from node.worker.job import Wake
from node.worker.reports import Reports, line_fields, runner_fields

log = logging.getLogger("node.worker.loop")


@dataclass
class Flags:
    """What the signal handlers read and change (node/worker/loop.py ``_on_signal``): whether
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
