"""What a runner process tells the node, and when (node/worker/loop.py): how many jobs it took
(the supervisor's backpressure waits for that), how they ended (the node's counters, ``hero-node
status``), and the job statistics it counted itself until it hands them to Valkey
(bus/core/stats.py): every ``taken_every`` jobs or once per lease beat, and whenever it
goes idle, not per job. And its log lines, written to the node's stderr in the node's level and
format (node/observe/logs.py; ``hero-node run --log-format json`` gives one JSON object per line
whichever process wrote it), each carrying its fields as the node's lines do."""

from __future__ import annotations

import contextlib
import logging
import os
import time

import orjson

from bus.core.stats import StatsBatch
from bus.store.atomic.runs_sync import SyncRuns, SyncStoreError
from node.slot.spec import RunnerSpec
from node.worker.job import PROCESS

log = logging.getLogger("node.worker.loop")


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
        self,
        fields: dict[str, str],
        status: str,
        reason: str,
        answered_here: bool,
        took_s: float,
        beat_s: float,
    ) -> tuple[StatsBatch, bool]:
        """The statistics not yet in Valkey with this attempt's end added, and whether they
        are due now: every ``taken_every`` jobs or once per lease beat (``beat_s``); else the
        end hands them over only if it leaves this runner idle (bus/store/atomic/runs.py:
        then_source)."""
        return self.counted_all([(fields, status, reason, answered_here, took_s)], beat_s)

    def counted_all(
        self, ends: list[tuple[dict[str, str], str, str, bool, float]], beat_s: float
    ) -> tuple[StatsBatch, bool]:
        """:meth:`counted` for several ends at once (a batch's): each is (the job's fields,
        status, reason, whether it was answered here, how long it took)."""
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
        """Tell the node how many jobs this process took and how they ended: every
        ``taken_every`` jobs and before blocking for more, not per job. ``idle``: also the job
        statistics still held here (an end that left this runner idle applied them already,
        unless it was not the last thing it did: a refusal, a requeue)."""
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
        if self.taken:
            lines.append(b"t%d" % self.taken)
            self.taken = 0
        if self.counts:
            lines.append(b"c" + orjson.dumps(self.counts))
            self.counts = {}
        if lines:
            # one write: the node reads both lines with one wake-up, not one each (a lone job
            # leaves its runner idle, and so flushes, every time)
            report(b"\n".join(lines))


# -- log lines (node/observe/logs.py; set up at the process's start: node/worker/process.py) ----


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
