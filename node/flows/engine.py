"""The flow engine of one context, at the flow's origin node: releases jobs as their
prerequisites finish, dooms the dependents of failed jobs, and keeps the flow's status/result.

Event-driven and recoverable. The client stores an actor-signed flow (``flow:<id>``, see
bus/core/flows.py for the trust design) with its job copies in ``waiting_for_prerequisites``, adds
it to ``flows:active`` and pushes its id on ``flow_events``. Every job result that reaches this
node for a flow job pushes the flow id there too (node/intake/consumer.py ``result_write``). The
engine pops ``flow_events`` reliably and *re-evaluates* the flow from what Valkey holds: the
job copies' statuses go into :func:`bus.core.dag.schedule`; doomed jobs end in ``error`` with
reason ``prerequisite_failed``; ready jobs are released as node-signed ``flow_job`` messages on
``msg_out`` (atomically with their copy turning ``dispatched``); the flow's status and result
are written and a change is pushed on ``flow_progress:<id>`` for waiting clients. Evaluation
is idempotent, so a restart simply re-evaluates every flow still in ``flows:active``.

Every flow has a deadline (bus/core/flows.py ``FlowDoc.deadline``: signed, else the node's
``flow_deadline_s``), kept in the ``flow_deadlines`` zset while the flow is not final. A timer
sleeps until the earliest one and moves due flows onto ``flow_events``; evaluated past its
deadline, a flow's unfinished jobs end in ``error`` (``flow_deadline``) and so does the flow, so
nothing waits forever on a job refused where the origin never hears of it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import NoReturn

import trio

from bus.core import keys, spans
from bus.core.dag import DOOMED_REASON, Decision, flow_result, schedule
from bus.core.envelope import sign_message
from bus.core.flows import FlowDoc, FlowJobPayload
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import FlowStatus, JobStatus, Message, MessageType
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError, Refused
from bus.store import records
from bus.store.atomic import flows as atomic_flows
from bus.store.connection import Store
from bus.store.serve import Done, Handler, Popped, Queue, guarded, serve_queue
from node.errors import Rejected
from node.flows.trust import check_flow_doc, check_may_execute
from node.state import NodeState

log = logging.getLogger(__name__)

SERVICE = "flows"
_FINAL = (FlowStatus.FINISHED.value, FlowStatus.ERROR.value)
FLOW_DEADLINE = Reason.FLOW_DEADLINE
IDLE_WAIT_S = 3600.0  # no flow pending: the timer waits for one to be armed


@dataclass(frozen=True)
class _Loaded:
    doc: FlowDoc
    raw: dict[str, object]  # the document exactly as the actor signed it
    signatures: list[dict[str, str]]


async def run_flow_engine(
    node: NodeState, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Drive context ``ctx``'s flows until cancelled. Reports started once the events a
    previous run left in flight are requeued and every non-final flow was re-evaluated.
    Raises StoreError if Valkey fails (``resilient`` restarts it)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_queue, node.store, _queue(ctx), FlowEvents(node, ctx))
        nursery.start_soon(run_deadline_timer, node, ctx)
        task_status.started()
        await trio.sleep_forever()


def _queue(ctx: int) -> Queue:
    return Queue(ctx, keys.FLOW_EVENTS, keys.inflight(SERVICE), read=False)


class FlowEvents(Handler[None]):
    """Each entry of ``flow_events`` names a flow to evaluate (:func:`evaluate`); one that
    names none (not a number, no such flow) is refused."""

    name = SERVICE

    def __init__(self, node: NodeState, ctx: int) -> None:
        self.node, self.ctx = node, ctx

    async def recovered(self) -> None:
        await reevaluate_active(self.node, self.ctx)

    async def each(self, popped: Popped) -> Done:
        raw_id, ctx = popped.value, self.ctx
        if not (raw_id.isascii() and raw_id.isdecimal() and len(raw_id) <= 18):
            raise NoFlow(
                Reason.MALFORMED_ENTRY, "a flow event must be a flow id (a decimal number)"
            )
        if await evaluate(self.node, ctx, int(raw_id)) is None:
            raise NoFlow(Reason.UNKNOWN_FLOW, f"no flow {raw_id} in context {ctx}")
        return Done.ACK

    async def refuse(
        self, store: Store, queue: Queue, popped: Popped, refused: Refused, exc: Exception
    ) -> None:
        """Only an event that names no flow (not a number, no such flow, a key of another
        type) is dead-lettered. Anything else met while evaluating one (a flaw, logged by
        serve_queue, or a refusal evaluate did not handle itself) leaves the flow active,
        evaluated again on its next event or at the next start: its event is only
        acknowledged."""
        if isinstance(exc, (NoFlow, ContentError)):
            await super().refuse(store, queue, popped, refused, exc)
            return
        if isinstance(exc, Refused):  # serve_queue logs flaws only; this is one here
            log.error(
                "flow engine failed on flow %r (context %d)", popped.value, self.ctx, exc_info=exc
            )
        await store.ack(queue.db, queue.inflight, popped.value)


class NoFlow(Refused):
    """A flow event that names no flow to evaluate: the one refusal the engine dead-letters."""


async def run_deadline_timer(node: NodeState, ctx: int) -> NoReturn:
    """Queue flows whose deadline passed on ``flow_events`` (the engine's evaluation ends them;
    one evaluation at a time). Sleeps until the next deadline or until one is armed (no
    polling). Raises StoreError if Valkey fails."""
    while True:
        wake = node.wakeups.flow_deadline_scheduled.setdefault(ctx, trio.Event())
        after = await atomic_flows.due_to_events(node.store, ctx, now())
        with trio.move_on_after(IDLE_WAIT_S if after < 0 else max(0.0, after - now())):
            await wake.wait()
        node.wakeups.flow_deadline_scheduled[ctx] = trio.Event()


async def reevaluate_active(node: NodeState, ctx: int) -> int:
    """Evaluate every flow in ``flows:active`` (each as if popped from ``flow_events``: what
    cannot be evaluated is refused the same way); returns how many there were."""
    ids = await records.active_flows(node.store, ctx)
    handler, queue = FlowEvents(node, ctx), _queue(ctx)
    for flow_id in sorted(ids):
        await guarded(node.store, queue, handler, Popped(flow_id, {}))
    return len(ids)


async def evaluate(node: NodeState, ctx: int, flow_id: int) -> FlowStatus | None:
    """Bring flow ``flow_id`` up to date; returns its status (None: no such flow).

    Raises StoreError if Valkey fails (nothing is half-done: each step is one transaction
    and evaluation is idempotent).
    """
    fields = await records.read_flow(node.store, ctx, flow_id)
    if not fields or fields.get("status") in _FINAL:
        await records.forget_active_flow(node.store, ctx, flow_id)
        return FlowStatus(fields["status"]) if fields else None
    try:
        loaded = await _load(node, ctx, flow_id, fields)
    except Rejected as exc:
        await _refuse(node, ctx, flow_id, fields, exc)
        return FlowStatus.ERROR
    doc = loaded.doc
    deadline = doc.deadline(node.config.flow_deadline_s)
    overdue = now() >= deadline
    if overdue:
        await _end_unfinished(node, ctx, doc)
    states, results = await _read_jobs(node, ctx, doc)
    decision = schedule(doc.spec, states)
    await _doom(node, ctx, doc, decision.doomed)
    for job_id in decision.ready:
        await _release(node, ctx, loaded, job_id, results)
    states |= {j: JobStatus.ERROR for j in decision.doomed}
    states |= {j: JobStatus.DISPATCHED for j in decision.ready}
    after = schedule(doc.spec, states)
    await _save(node, ctx, doc, states, results, after, (deadline, overdue))
    if not after.done and fields.get("deadline") != str(deadline):  # armed just now
        node.wakeups.flow_deadline_scheduled.setdefault(ctx, trio.Event()).set()
    return after.flow_status


async def _end_unfinished(node: NodeState, ctx: int, doc: FlowDoc) -> None:
    """Past the flow's deadline: every job copy not final yet ends in error (flow_deadline)."""
    job_keys = [doc.job_key(j.id) for j in doc.spec.jobs]
    ended = await atomic_flows.end_unfinished(node.store, ctx, job_keys, FLOW_DEADLINE, now())
    log.warning("flow %d: deadline passed; %s unfinished job(s) ended", doc.id, ended)


async def _load(node: NodeState, ctx: int, flow_id: int, fields: dict[str, str]) -> _Loaded:
    """The flow's signed document, checked; Rejected if this node must not run it."""
    try:
        raw = json.loads(fields.get("doc", ""))
        signatures = json.loads(fields.get("signatures", "[]"))
    except ValueError:
        raise Rejected(
            Reason.MALFORMED, f"flow {flow_id}: document or signatures not JSON"
        ) from None
    doc = await check_flow_doc(node, raw, signatures)
    if (doc.id, doc.context_id, doc.origin) != (flow_id, ctx, node.identity.node_id):
        raise Rejected(
            Reason.MALFORMED, f"flow {flow_id}: document is for another flow/context/node"
        )
    await check_may_execute(node, ctx, doc.caller_id)
    strays = [
        j.id for j in doc.spec.jobs if not node.peers.is_known_node(j.node) or j.context_id != ctx
    ]
    if strays:
        raise Rejected(
            Reason.UNKNOWN_DESTINATION, f"unknown node or context for {', '.join(strays)}"
        )
    return _Loaded(doc, raw, signatures)


async def _read_jobs(
    node: NodeState, ctx: int, doc: FlowDoc
) -> tuple[dict[str, JobStatus], dict[str, dict[str, str]]]:
    """The origin copies' statuses (released jobs only) and result maps."""
    states: dict[str, JobStatus] = {}
    results: dict[str, dict[str, str]] = {}
    for job in doc.spec.jobs:
        fields = await records.read_job(node.store, ctx, doc.job_key(job.id))
        try:
            states[job.id] = JobStatus(fields.get("status", ""))
        except ValueError:
            continue
        try:
            result = json.loads(fields.get("result") or "{}")
        except ValueError:
            result = {}
        if isinstance(result, dict):
            results[job.id] = {str(k): str(v) for k, v in result.items()}
    return states, results


async def _doom(node: NodeState, ctx: int, doc: FlowDoc, doomed: tuple[str, ...]) -> None:
    if not doomed:
        return
    fields = {"status": JobStatus.ERROR.value, "reason": DOOMED_REASON, "updated_at": str(now())}
    await atomic_flows.set_jobs(node.store, ctx, [doc.job_key(j) for j in doomed], fields)
    log.info("flow %d: %s doomed (%s)", doc.id, ", ".join(doomed), DOOMED_REASON)


async def _release(
    node: NodeState, ctx: int, loaded: _Loaded, job_id: str, results: dict[str, dict[str, str]]
) -> None:
    """Sign (node key) and queue the job's ``flow_job`` message; its copy turns dispatched."""
    doc = loaded.doc
    spec = doc.job(job_id)
    inputs = {dep: results.get(dep, {}) for dep in spec.depends}
    stamp = now()
    job = doc.runner_job(job_id, inputs, stamp)
    payload = FlowJobPayload(loaded.raw, loaded.signatures, job_id, inputs)
    # every job of the flow continues the trace its actor signed into the document
    trace = spans.judge(node.counters.count, doc.traceparent, doc.tracestate, f"flow {doc.id}")
    message = sign_message(
        Message(
            id=new_id(),
            caller_id=doc.caller_id,
            context_id=ctx,
            message=payload.encode(),
            message_type=MessageType.FLOW_JOB,
            timeout=job.timeout,
            job=[job],
            created_at=stamp,
            updated_at=stamp,
            origin=node.identity.node_id,
            destination=spec.node,
            nonce=new_nonce(),
            traceparent=trace.traceparent,
            tracestate=trace.tracestate,
        ),
        node.identity.key,
    )
    copy = job.to_hash() | {"flow_id": str(doc.id), "flow_job": job_id, "node": spec.node}
    copy |= {"status": JobStatus.DISPATCHED.value, "message_key": message.key}
    await atomic_flows.release(node.store, ctx, job.key, copy, message)
    node.counters.count("flow_jobs_released")
    log.info("flow %d: released %s to %s… as %s", doc.id, job_id, spec.node[:16], message.key)


def _reason(doc: FlowDoc, states: dict[str, JobStatus], decision: Decision, overdue: bool) -> str:
    if decision.flow_status is not FlowStatus.ERROR:
        return ""
    failed = [j.id for j in doc.spec.jobs if states.get(j.id) is JobStatus.ERROR]
    in_error = f"job(s) in error: {', '.join(failed)}"
    if overdue:
        return f"{FLOW_DEADLINE}: not over by its deadline; {in_error}"
    return in_error


async def _save(
    node: NodeState,
    ctx: int,
    doc: FlowDoc,
    states: dict[str, JobStatus],
    results: dict[str, dict[str, str]],
    decision: Decision,
    deadline: tuple[int, bool],
) -> None:
    """Write the flow's status, result and ``deadline`` (when, and whether it passed), and
    wake waiting clients, in one transaction."""
    when, overdue = deadline
    result = flow_result(doc.spec, results, states)
    fields = {
        "status": decision.flow_status.value,
        "result": json.dumps(result, separators=(",", ":")),
        "reason": _reason(doc, states, decision, overdue),
        "deadline": str(when),
        "updated_at": str(now()),
    }
    await _write_flow(node, ctx, doc.id, fields, decision.done, when)
    if decision.done:
        log.info("flow %d %s", doc.id, decision.flow_status.value)


async def _write_flow(
    node: NodeState,
    ctx: int,
    flow_id: int,
    fields: dict[str, str],
    done: bool,
    deadline: int | None = None,
) -> None:
    """Write the flow's fields; a final flow leaves ``flows:active`` and ``flow_deadlines``,
    another is (re)armed there with ``deadline``."""
    write = atomic_flows.FlowWrite(flow_id, fields, done, deadline, node.config.reply_ttl_s)
    await atomic_flows.write_flow(node.store, ctx, write)


async def _refuse(
    node: NodeState, ctx: int, flow_id: int, fields: dict[str, str], exc: Rejected
) -> None:
    """The flow may not run here: it and its unreleased jobs end in error with the reason."""
    log.warning("flow %d (context %d) refused: %s", flow_id, ctx, exc)
    node.counters.count(f"flows_refused_{exc.reason}")
    try:
        job_keys = [keys.job(int(fields["caller_id"]), j) for j in json.loads(fields["jobs"])]
    except (KeyError, ValueError, TypeError, ModelError):
        job_keys = []
    stamp = str(now())
    failed = {"status": JobStatus.ERROR.value, "reason": exc.reason}
    await atomic_flows.set_jobs(node.store, ctx, job_keys, failed)
    reason = f"{exc.reason}: {exc.detail}" if exc.detail else exc.reason
    flow_fields = {"status": FlowStatus.ERROR.value, "reason": reason, "updated_at": stamp}
    await _write_flow(node, ctx, flow_id, flow_fields, True)
