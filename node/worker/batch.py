"""A batch of python jobs in one runner process (node/worker/loop.py): the jobs a take found
queued (up to ``batch_jobs``, started in the same script call), run in one request to the
slot's warm sandbox (node/sandbox/host.py ``run_batch``), each alone in what it may see and
keep, and ended together by the slot's ender (node/worker/ending.py ``conclude_all``, under its
lock: :func:`run_and_end_batch`) in the script call that takes the next batch.

Each job keeps its own timeout, counted from its own turn, its own output files (the slot's for
the first, ``<slot>-<n>`` for the n-th) and live log stream; the leases of all of them are
renewed until their ends are recorded (node/worker/job.py, the watch thread). A stop for a job
that waits for its turn kills it when its turn comes.

A job that answered is not held back by a long one behind it: when the next answer does not
come within :data:`EARLY_END_S`, the jobs that answered are ended at once (their ends and
answers, without a take; ``end_early``), and the wait goes on. The rest end together with the
next take, as before.

A job that times out, is stopped, or ends the job process ends its batch there: the jobs after
it never ran, and are given back uncounted (the sandbox of a kill is gone, and with it what it
was handed). An abort gives back the running job too, as it does a lone one.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from bus.core import queues
from bus.core.attempts import Outcome
from bus.core.ids import now, now_ms
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from bus.store.atomic.runs import NextJob, Started
from node.sandbox.plan import PlanError
from node.sandbox.spawn import SandboxLost
from node.slot import outcomes
from node.slot.outcomes import KILL_GRACE_S, LOG_FLUSH_S, LogPump, log_paths, recorded
from node.worker.ending import Ender, Ran, Ready
from node.worker.job import (
    PROCESS,
    Aborted,
    HeldAttempt,
    JobRun,
    emptied,
    job_request,
    open_logs,
)
from node.worker.spans import ran_attempt

log = logging.getLogger("node.worker.loop")

MAX_BATCH_JOBS = 64  # the sandbox's bound on one request (node/sandbox/inner.py MAX_BATCH)

# How long a batch's answered jobs wait for the next answer before they are ended without
# the rest. A no-op job of a batch costs ~0.6 ms of CPU (runner and job process,
# bench/HISTORY.md#runner-batches), a whole batch of 16 ~10 ms: at 30 ms a batch of quick
# jobs still ends in one script call, even on a busy machine, while an answer behind a long
# job waits this long, not the long job's whole run.
EARLY_END_S = 0.03

# an attempt to run: the job, the request that carried it, its number, its lease's token
Item = tuple[RunnerJob, Message, int, str]
# a job of the batch that answered: its index, its outcome, its attempt's state
Done = tuple[int, Outcome, HeldAttempt]
# ends the jobs that answered, while a later one runs (without a take)
EndEarly = Callable[[list[Done]], None]


def batch_logs(run: JobRun, index: int) -> tuple[Path, Path]:
    """The output files of a batch's ``index``-th job: the slot's for the first. Named once
    per process and index: a name costs ~30 us (the folder's mkdir, a stat, pathlib), as much
    as a third of a batch job's other work here (bench/HISTORY.md#runner-cpu)."""
    if index == 0:
        return run.logs
    paths = run.batch_paths.get(index)
    if paths is None:
        spec = run.spec
        name = f"{spec.ctx}-{spec.slot_id}-{index}"
        paths = run.batch_paths[index] = log_paths(run.run_dir, name)
    return paths


def _files(run: JobRun, index: int) -> tuple[int, int]:
    """The ``index``-th job's output files, open for the life of the process, emptied."""
    if index == 0:
        return run.slot_fds()
    fds = run.batch_fds.get(index)
    if fds is None:
        fds = run.batch_fds[index] = open_logs(batch_logs(run, index))
    return emptied(fds)


def _waiting(run: JobRun, item: Item, index: int, at: float) -> HeldAttempt:
    job, request, attempt, token = item
    spec = run.spec
    pump = LogPump(
        run.runs, job.key, batch_logs(run, index), spec.max_output_bytes, spec.reply_ttl_s
    )
    cur = HeldAttempt(job, request, attempt, token, pump, 1e18, at, 1e18)
    cur.outcome_name = outcomes.outcome_name(spec.ctx, job.key, attempt)
    return cur


def _begin(run: JobRun, cur: HeldAttempt) -> None:
    """``cur``'s turn: its clocks start (its timeout counts from now)."""
    cur.began, cur.started_at = time.monotonic(), now()
    cur.next_flush = cur.began + LOG_FLUSH_S
    cur.deadline = cur.began + (cur.job.timeout or 1e9)
    run.began, run.started_at, run.outcome_name = cur.began, cur.started_at, cur.outcome_name
    run.current = cur
    if os.getppid() != PROCESS.parent:  # the next node must know which job this one runs
        run.name_running()
    if cur.kill_reason:  # stopped while it waited: it ends now, and its batch with it
        cur.kill_at = time.monotonic() + KILL_GRACE_S
        run.sandbox.kill()


def run_batch(
    run: JobRun, items: list[Item], end_early: EndEarly | None = None
) -> list[tuple[Outcome | None, HeldAttempt]]:
    """Run ``items`` in turn in one request to the slot's warm sandbox; each one's outcome
    (None: it did not run, or an abort cut it short; the caller gives it back) with its
    attempt's state (its start, its log stream, its outcome file's name). Whenever the next
    answer is slow to come, ``end_early`` gets the jobs that answered and were not given to it
    yet, to end them then (the caller then ends only the others)."""
    at = time.monotonic() + run.heartbeat_s
    curs = [_waiting(run, item, i, at) for i, item in enumerate(items)]
    fds = [_files(run, i) for i in range(len(items))]
    requests = [job_request(run.spec, cur.job) for cur in curs]
    found: list[Outcome | None] = [None] * len(items)
    ended = [False] * len(items)  # given to end_early: their ends are its

    def orphaned() -> None:  # the watch thread, once the node died: see JobRun.on_orphan
        for outcome, cur, gone in zip(list(found), curs, list(ended), strict=True):
            if outcome is not None and not gone:
                run.keep(recorded(outcome), name=cur.outcome_name)

    def idle() -> None:  # the next answer is slow: the jobs before it end now
        done = [(j, o, curs[j]) for j in range(i) if (o := found[j]) is not None and not ended[j]]
        if done and end_early is not None:
            for j, _, _ in done:
                ended[j] = True
            end_early(done)

    run.batch, run.on_orphan = curs, orphaned
    i = 0
    try:
        answers = run.sandbox.run_batch(requests, fds, (EARLY_END_S, idle))
        _begin(run, curs[0])
        try:
            for reply in answers:
                curs[i].answered_at = time.monotonic()
                curs[i].answered = reply.get("signal") != signal.SIGKILL
                code = reply["exit_code"] if reply["exit_code"] is not None else -reply["signal"]
                found[i] = _kept(run, curs[i], run.outcome_from(curs[i], reply, code, fds[i]))
                i += 1
                if i < len(curs):
                    _begin(run, curs[i])
        except (SandboxLost, PlanError, OSError) as exc:
            found[i] = _lost(run, curs, i, exc)
    except BaseException:
        for cur, gone in zip(curs, ended, strict=True):
            if not gone:  # one ended early has its end marker
                cur.pump.finish("interrupted")
        run.batch = []  # nothing will end them here: the node's recovery of the slot will
        raise
    finally:
        run.current, run.on_orphan = None, None
    return list(zip(found, curs, strict=True))


def _kept(run: JobRun, cur: HeldAttempt, outcome: Outcome) -> Outcome | None:
    """A job that answered: as :meth:`JobRun.run` has it (an abort that cut it short gives it
    back; a kill's reason is its end)."""
    if run.aborted and not cur.answered:
        return None
    if cur.kill_reason:
        return Outcome(JobStatus.ERROR, {}, cur.kill_reason)
    return outcome


def _lost(run: JobRun, curs: list[HeldAttempt], i: int, exc: BaseException) -> Outcome | None:
    """The sandbox ended in job ``i``: killed for it (a timeout, a stop: that is its end), an
    abort or a kill for a job before it (given back), or on its own (the runner lost it)."""
    cur = curs[i]
    if cur.kill_reason:
        return Outcome(JobStatus.ERROR, {}, cur.kill_reason)
    if run.aborted or any(c.kill_reason for c in curs[:i]) or os.getppid() != PROCESS.parent:
        return None  # not its own end: given back (an orphan stopped its batch before it)
    reason = f"{Reason.RUNNER_LOST}: the sandbox ended ({exc})"
    return Outcome(JobStatus.ERROR, {"stderr": str(exc)}, reason)


# -- a batch's end, by its ender (node/worker/ending.py) -------------------------------------


def run_and_end_batch(ender: Ender, ready: list[Ready], nxt: NextJob) -> list[Started]:
    """Run jobs started together (:func:`run_batch`) in one request to the slot's sandbox and
    end them, under ``ender``'s lock, in one script call that takes the next ones
    (:meth:`~node.worker.ending.Ender.conclude_all`); those that answered while a later one
    runs long are ended before it (:func:`_end_early`)."""
    early: set[int] = set()  # the indices of the jobs ended before the batch's end

    def end_early(done: list[Done]) -> None:
        early.update(i for i, _, _ in done)
        _end_early(ender, ready, done)

    items = [(job, request, attempt, f["runner"]) for job, f, request, attempt in ready]
    ran = run_batch(ender.job, items, end_early)
    with ender.ending:
        rans, back, rest, ran_curs = [], [], [], []
        for i, (outcome, cur) in enumerate(ran):
            if i in early:  # ended already
                continue
            rest.append(cur)
            if outcome is None:  # never ran, or an abort cut it short: given back
                job, fields, _, attempt = ready[i]
                back.append((job.key, attempt, queues.queue_of(fields)))
                continue
            rans.append(_ran(ready[i], outcome, cur))
            ran_curs.append(cur)
        aborted = ender.job.aborted
        taken = None if aborted or ender.leaving() else nxt
        ender.job.keep_all([(r.outcome_name, recorded(r.outcome)) for r in rans])
        for cur in rest:
            cur.over = True  # its lease needs no renewal: its end is being recorded
        ends = {r.job.key: r.outcome.status.value for r in rans}
        try:
            # always one at least: the last job is never ended early (no answer behind it)
            started = ender.conclude_all(rans, back, taken)
        finally:
            for cur in rest:
                cur.pump.finish(ends.get(cur.job.key, "interrupted"))
            ender.job.batch = []
        ender.job.forget()
        ender.job.empty_logs()
        if ender.traced:
            _spans(ender, rans, ran_curs)
    if back:
        about = ender.fields(back[0][0], given_back=len(back))
        log.info("%d jobs of a batch given back unrun", len(back), extra=about)
    if aborted:
        raise Aborted
    return started


def _end_early(ender: Ender, ready: list[Ready], done: list[Done]) -> None:
    """End the jobs of a batch that answered (``done``: their index in ``ready``) while a
    later one runs: as the batch's end ends them (kept for adoption first, each by its
    plan, answered, signed), without a take; the leases of the rest are still renewed."""
    with ender.ending:
        rans = [_ran(ready[i], outcome, cur) for i, outcome, cur in done]
        ender.job.keep_all([(r.outcome_name, recorded(r.outcome)) for r in rans])
        for _, _, cur in done:
            cur.over = True
        try:
            ender.conclude_all(rans, [], None)
        finally:
            for ran, (_, _, cur) in zip(rans, done, strict=True):
                cur.pump.finish(ran.outcome.status.value)
        ender.job.forget()
        if ender.traced:
            _spans(ender, rans, [cur for _, _, cur in done])


def _spans(ender: Ender, rans: list[Ran], curs: list[HeldAttempt]) -> None:
    """The spans of a batch's attempts, now that their ends are recorded: each its own,
    from its turn to now, its sandbox run to its answer (node/worker/spans.py)."""
    wall = now_ms() / 1000 - time.monotonic()  # what a monotonic time is in Unix time
    ended_s = time.monotonic() + wall
    endings = ender.ended_each
    for ran, cur, ended in zip(rans, curs, endings, strict=False):
        times = (cur.began + wall, (cur.answered_at or cur.began) + wall, ended_s)
        attempt = (ran.job, ran.fields, ran.request, ran.attempt)
        ran_attempt(ender.spec, attempt, ran.outcome, times, ended)


def _ran(ready: Ready, outcome: Outcome, cur: HeldAttempt) -> Ran:
    """A batch's job that ran, as its end needs it."""
    job, fields, request, attempt = ready
    return Ran(job, fields, request, outcome, attempt, cur.began, cur.started_at, cur.outcome_name)
