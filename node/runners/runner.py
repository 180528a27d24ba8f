"""Runner pools: per context and script type, N slots that pop ``queue:<type>`` and execute.

Each attempt is numbered (``attempt``, its fencing token: bus/atomic/runs.py) and holds a
lease (``lease:<job>``, TTL renewed by a heartbeat while the script runs, re-taken if a stall
let it lapse); status moves ``dispatched -> started -> finished | error``. A failed attempt is
retried after a backoff while the job has retries left (``delayed`` zset, moved back to the
queue when due). When a job ends, its final state, the signed result for the origin and the
removal from the slot's in-flight list are written in one Lua transaction that checks first
that the attempt is still the job's current one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import trio

from bus import keys
from bus.atomic import runs
from bus.envelope import ResultBody
from bus.errors import ContentError, ModelError, StoreError
from bus.ids import ms_after, now, now_ms
from bus.models import JobStatus, Message, RunnerJob
from bus.reasons import Reason
from node.routing.messages import result_message
from node.runners import adoption, outcomes, queues
from node.runners.executor import Outcome, execute
from node.runners.joblogs import LOG_FLUSH_S, LogPump, log_paths
from node.runners.lifecycle import RetryPolicy, after_attempt
from node.runners.workers import PythonWorker
from node.state import NodeState

log = logging.getLogger(__name__)

POP_TIMEOUT_S = 5.0


async def run_runner(
    node: NodeState,
    ctx: int,
    script_type: str,
    command: list[str],
    slot: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One slot: recover what a previous run left in flight, then pop and run until stopping."""
    slot_id = f"{script_type}:{slot}"
    queue, inflight = keys.queue(script_type), keys.inflight(f"runner:{slot_id}")
    logs = log_paths(node, f"{ctx}-{slot_id}")
    outcomes.outcome_dir(node.config.run_dir).mkdir(parents=True, exist_ok=True)
    pending = await recover_slot(node, ctx, inflight, queue, logs)
    task_status.started()
    token_base = f"{node.node_id[:12]}:{node.boot}:{ctx}:{slot_id}"
    pid_dir = node.config.run_dir / "jobs"
    worker = (
        PythonWorker(max_output_bytes=node.config.max_output_bytes, pid_dir=pid_dir)
        if script_type == "python" and node.config.python_workers
        else None
    )

    async def run_script(job: RunnerJob, logs: tuple[Path, Path], outcome: Path) -> Outcome:
        if worker is not None:
            return await worker.run(job, logs, outcome)
        return await execute(
            job,
            command,
            max_output_bytes=node.config.max_output_bytes,
            pid_dir=pid_dir,
            logs=logs,
            outcome=outcome,
        )

    bases = queues.slot_bases(
        script_type, node.config.runner_groups.get(script_type, ""), str(slot)
    )
    pops = 0
    started: runs.Started | None = None
    found_empty = False
    watch = SlotWatch(node, ctx, logs)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            for adopt in pending:  # processes a dead run of the node left running
                nursery.start_soon(adopt)
            while not node.stopping.is_set():
                pops += 1
                lists = queues.consume_order(bases, pops)
                take_next = runs.NextJob(
                    tuple(lists), token_base, node.config.lease_ttl_ms, slot_id
                )
                if started is None:
                    job_key = await _pop(
                        node, ctx, script_type, lists, inflight, check_first=not found_empty
                    )
                    found_empty = False
                    if job_key is None:
                        continue
                    fields = None
                else:
                    (job_key, fields), started = started, None
                node.job_started()
                node.job_taken()
                try:
                    started = await run_job(
                        node, ctx, job_key, fields, run_script, inflight, queue, take_next, watch
                    )
                finally:
                    node.job_ended()
                found_empty = take_next.found_empty  # no need to look again before blocking
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if started is not None:  # taken with the last result, but we are stopping
                attempt = int(started[1].get("attempt") or 0)
                await runs.requeue(
                    node.store, ctx, started[0], attempt, inflight, queues.queue_of(started[1])
                )
            if worker is not None:
                await worker.close()


async def _pop(
    node: NodeState,
    ctx: int,
    script_type: str,
    lists: list[str],
    inflight: str,
    *,
    check_first: bool = True,
) -> str | None:
    """A slot's reliable pop over its lists (node/runners/queues.py). Shutdown interrupts it (see
    NodeState.stop_intake); so does a job queued on one of the slot's other lists (a priority
    or targeted one) while the slot blocks on its type queue (see NodeState.wake_idle_slots):
    then it returns None and the slot looks at all its lists again. ``check_first=False``: the
    lists were just found empty, block at once."""
    before: int | None = None  # the in-flight list's length before popping (it may hold keys
    # of jobs whose result was refused as stale)
    with trio.CancelScope() as scope:
        node.intake.add(scope)
        idle = node.idle_slots.setdefault((ctx, script_type), set())
        idle.add(scope)
        try:
            before = await node.store.llen(ctx, inflight)
            return await queues.pop_slot(
                node.store, ctx, lists, inflight, POP_TIMEOUT_S, check_first=check_first
            )
        finally:
            node.intake.discard(scope)
            idle.discard(scope)
    if node.stopping.is_set() or before is None:
        return None  # nothing popped yet, or recovered at the next start (shutdown)
    # A pop the server had already carried out when it was interrupted pushed its entry on the
    # slot's in-flight list (at the head): take it from there.
    moved = await node.store.lrange(ctx, inflight)
    return str(moved[0]) if len(moved) > before else None


async def recover_slot(
    node: NodeState, ctx: int, inflight: str, queue: str, logs: tuple[Path, Path]
) -> list[Callable[[], Awaitable[None]]]:
    """Jobs a previous run of this slot left behind: concluded with the outcome their process
    recorded, adopted when their process ends, or ``runner_lost`` (see
    node/runners/adoption.py); the tasks that wait for processes still running are returned.
    A job not started yet goes back to the queue."""
    return await adoption.recover_slot(node, ctx, inflight, queue, logs, _conclude_adopted)


async def _conclude_adopted(
    node: NodeState, ctx: int, left: adoption.LeftBehind, outcome: Outcome, inflight: str
) -> None:
    runner, queue = left.fields.get("runner", ""), queues.queue_of(left.fields)
    job, request, attempt = left.job, left.request, left.attempt
    await conclude(node, ctx, job, request, outcome, runner, inflight, queue, attempt, 0)


async def run_job(
    node: NodeState,
    ctx: int,
    job_key: str,
    fields: dict[str, str] | None,
    run_script: Callable[[RunnerJob, tuple[Path, Path], Path], Awaitable[Outcome]],
    inflight: str,
    queue: str,
    take_next: runs.NextJob,
    watch: SlotWatch,
) -> runs.Started | None:
    """Run one job (``fields``: already started by the previous job's conclusion). Returns the
    next job if it was started in the same round trip as this one's result."""
    token = f"{take_next.token_base}:{job_key}"
    if fields is None:
        begun = await runs.start(
            node.store, ctx, job_key, token, take_next.ttl_ms, take_next.runner_id
        )
        if isinstance(begun, str):  # the entry names nothing to run: refused, alone
            detail = runs.unrunnable_detail(begun)
            await node.store.refuse_entry(ctx, inflight, job_key, begun, detail, queue=queue)
            return None
        fields = begun
    if not fields:  # final (a duplicate queue entry)
        await node.store.ack(ctx, inflight, job_key)
        return None
    attempt = int(fields["attempt"])  # HINCRBY wrote it: always an integer
    node.attempts_here[(ctx, job_key)] = attempt
    try:
        return await _run_attempt(
            node, ctx, job_key, fields, run_script, inflight, queue, take_next, watch
        )
    finally:
        if node.attempts_here.get((ctx, job_key)) == attempt:
            del node.attempts_here[(ctx, job_key)]


async def _run_attempt(
    node: NodeState,
    ctx: int,
    job_key: str,
    fields: dict[str, str],
    run_script: Callable[[RunnerJob, tuple[Path, Path], Path], Awaitable[Outcome]],
    inflight: str,
    queue: str,
    take_next: runs.NextJob,
    watch: SlotWatch,
) -> runs.Started | None:
    """Run and conclude the started attempt ``fields["attempt"]`` of ``job_key``."""
    token = f"{take_next.token_base}:{job_key}"
    attempt = int(fields["attempt"])
    try:
        job = RunnerJob.from_hash(fields)
        request = await _request_of(node, ctx, job, fields)
    except (ModelError, ContentError) as exc:  # its message_key may name a key of another type
        log.error("cannot run %s (context %d): %s", job_key, ctx, exc)
        await node.store.dead_letter(ctx, job_key, Reason.MALFORMED_JOB, str(exc), queue=queue)
        await runs.finish_malformed(node.store, ctx, job_key, attempt, inflight, str(exc))
        return None
    queue = queues.queue_of(fields)  # retries and requeues go back where the job was targeted
    started_at = now()
    outcome: Outcome | None = None
    outcome_file = outcomes.outcome_path(node.config.run_dir, ctx, job_key, attempt)
    stop = trio.CancelScope()
    node.running[job_key] = stop
    pump = LogPump(node, ctx, job_key, watch.paths)
    watch.begin(job_key, token, attempt, pump)
    try:
        with stop:
            outcome = await run_script(job, pump.paths, outcome_file)
        if stop.cancelled_caught:  # a signed stop request (see node/routing/stops.py)
            reason = node.stop_reasons.pop(job_key, Reason.STOPPED)
            outcome = Outcome(JobStatus.ERROR, {}, reason)
    finally:
        watch.end()
        node.running.pop(job_key, None)
        if pump.touched:  # a flush in progress ends first, then the rest and the end marker
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                with contextlib.suppress(StoreError):
                    await pump.finish(outcome.status.value if outcome else "interrupted")
        if outcome is None:  # cancelled (shutdown): the attempt does not count; run it later
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await runs.requeue(node.store, ctx, job_key, attempt, inflight, queue)
                    outcomes.discard(outcome_file)
                    log.info("%s interrupted by shutdown; requeued", job_key)
                except StoreError as exc:  # recovered at the next start instead
                    log.warning("%s interrupted; not requeued now (%s)", job_key, exc)
    assert outcome is not None  # set on every path that gets here (else the finally re-raised)
    nxt = None if node.stopping.is_set() else take_next
    started = await conclude(
        node, ctx, job, request, outcome, token, inflight, queue, attempt, started_at, nxt
    )
    outcomes.discard(outcome_file)  # recorded in Valkey (or refused): nothing to adopt
    return started


async def _request_of(node: NodeState, ctx: int, job: RunnerJob, fields: dict[str, str]) -> Message:
    """The message that carried ``job``, as far as answering it needs: read from the job hash
    (materialise copies ``origin`` there), or from the message hash for older jobs."""
    origin = fields.get("origin")
    if not origin:
        return Message.from_hash(await node.store.hgetall(ctx, job.message_key))
    try:
        caller, ident = keys.parse_message_key(job.message_key)
    except ValueError:
        raise ModelError(f"bad message_key {job.message_key!r}") from None
    reply_to = fields.get("reply_to", "")
    return Message(ident, caller, ctx, origin=origin, destination=node.node_id, reply_to=reply_to)


@dataclass(eq=False)
class _Running:
    job_key: str
    token: str
    attempt: int
    pump: LogPump
    next_flush: float
    next_renew: float
    current: bool = True  # False once the attempt was superseded: nothing left to renew


class SlotWatch:
    """One per slot, for whatever job the slot is running: keeps its lease alive (three times
    per lease TTL) and forwards its live output (every LOG_FLUSH_S). A job that ends before its
    first flush is never looked at, so a short job costs no task, timer or Redis command here."""

    def __init__(self, node: NodeState, ctx: int, paths: tuple[Path, Path]) -> None:
        self.node, self.ctx, self.paths = node, ctx, paths
        self.ttl_ms = node.config.lease_ttl_ms
        self.heartbeat_s = self.ttl_ms / 1000 / 3
        self.current: _Running | None = None
        self._began = trio.Event()

    def begin(self, job_key: str, token: str, attempt: int, pump: LogPump) -> None:
        now = trio.current_time()
        next_renew = now + self.heartbeat_s
        self.current = _Running(job_key, token, attempt, pump, now + LOG_FLUSH_S, next_renew)
        self._began.set()

    def end(self) -> None:
        self.current = None

    async def run(self) -> NoReturn:
        while True:
            job = self.current
            if job is None:
                self._began = trio.Event()
                await self._began.wait()
                continue
            await trio.sleep_until(min(job.next_flush, job.next_renew))
            if self.current is not job:
                continue  # that job ended; look at the one running now (if any)
            if trio.current_time() >= job.next_renew:
                job.next_renew += self.heartbeat_s
                await self._renew(job)
            if trio.current_time() >= job.next_flush:
                job.next_flush += LOG_FLUSH_S
                with contextlib.suppress(StoreError):
                    await job.pump.flush()

    async def _renew(self, job: _Running) -> None:
        """Keep the lease, or re-take it if a stall let it lapse: the process is alive."""
        if not job.current:
            return
        try:
            current = await runs.renew(
                self.node.store, self.ctx, job.job_key, job.token, self.ttl_ms, job.attempt
            )
        except StoreError as exc:
            log.warning("%s: cannot renew lease: %s", job.job_key, exc)
            return
        if not current and self.current is job:
            job.current = False
            log.warning("%s: attempt %d superseded (result refused)", job.job_key, job.attempt)


async def conclude(
    node: NodeState,
    ctx: int,
    job: RunnerJob,
    request: Message,
    outcome: Outcome,
    token: str,
    inflight: str,
    queue: str,
    attempt: int,
    started_at: int,
    take_next: runs.NextJob | None = None,
) -> runs.Started | None:
    """Finish the job or schedule its retry; retried while Redis is unreachable, because the
    outcome exists only here (re-running the job instead would run it twice). With
    ``take_next``, a finished job's runner also starts its next job in the same round trip."""
    started: runs.Started | None = None
    policy = RetryPolicy.of(job)
    nxt = after_attempt(outcome.status, outcome.reason, attempt, job.retries, policy=policy)
    entry = runs.attempt_entry(attempt, token, outcome.status.value, outcome.reason, started_at)
    delay = 0.2
    while True:
        try:
            if nxt.retry:
                due_ms = ms_after(nxt.delay_s)
                ok = await runs.retry_later(
                    node.store,
                    ctx,
                    job.key,
                    attempt,
                    inflight,
                    queue=queue,
                    reason=f"retrying after: {outcome.reason}",
                    entry=entry,
                    due_ms=due_ms,
                )
                node.wake_retries(ctx)
            else:
                ok, started = await _finish(
                    node, ctx, job, request, outcome, inflight, entry, attempt, take_next
                )
            break
        except StoreError as exc:
            log.warning("%s: cannot record the outcome yet (%s); retrying", job.key, exc)
            take_next = None  # a half-applied pipeline must not take a second job
            await trio.sleep(delay)
            delay = min(delay * 2, 5.0)
    if not ok:
        node.count("stale_results")
        log.warning("%s: result of superseded attempt %d refused", job.key, attempt)
    else:
        node.count("job_retries" if nxt.retry else "jobs_" + outcome.status.value)
    return started


async def _finish(
    node: NodeState,
    ctx: int,
    job: RunnerJob,
    request: Message,
    outcome: Outcome,
    inflight: str,
    entry: str,
    attempt: int,
    take_next: runs.NextJob | None,
) -> tuple[bool, runs.Started | None]:
    result = outcome.result | {"attempts": str(attempt)}
    ending = runs.Ending(
        job.key, attempt, inflight, outcome.status.value, result, outcome.reason, entry
    )
    if request.origin == node.node_id:  # answered here: no signed result message needed
        return await runs.finish_local(
            node.store,
            ctx,
            ending,
            request_key=request.key,
            reply_ttl_s=node.config.reply_ttl_s,
            reply_to=request.reply_to,
            take_next=take_next,
        )
    body = ResultBody(request.key, job.key, outcome.status, result, outcome.reason)
    answer = result_message(node, request, body)
    return await runs.finish(node.store, ctx, ending, answer=answer, take_next=take_next)


async def run_retry_scheduler(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Move failed attempts back to their queue when their backoff is over. Sleeps until the
    next retry is due, or until a runner schedules an earlier one (no polling)."""
    task_status.started()
    while True:
        wake = node.retry_scheduled.setdefault(ctx, trio.Event())
        next_due = await runs.move_due(node.store, ctx, now_ms())
        wait_s = 3600.0 if next_due < 0 else max(0.0, (next_due - now_ms()) / 1000)
        with trio.move_on_after(wait_s):
            await wake.wait()
        node.retry_scheduled[ctx] = trio.Event()
