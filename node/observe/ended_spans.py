"""The attempt spans of attempts the *node* ends, not a runner process (issue 48): a slot's
attempt that a dead run of the node left behind, concluded or adopted at start
(node/runners/recovery.py, adoption.py), and an external runner's attempt, or one whose lease
lapsed, answered by the results service (node/runners/external.py).

A runner process records each attempt it runs as it happens (node/worker/spans.py). These
attempts have no such span: their process is gone (its span never ended, so never exported)
or speaks raw Redis. The node writes the span when it ends the attempt, with the id the runner's
would have had (bus/core/spans.py ``attempt_span_id``: derived from trace, job and number, so
a retry's link to the first attempt finds it either way), starting when the attempt started
(whole seconds: the job hash's ``started_at``) and ending now, marked ``hero.ended_by``.

Costless with tracing off: one check, before any read.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from bus.core import keys, spans
from bus.core.attempts import cause_of
from bus.core.ids import now
from bus.core.models import RunnerJob
from bus.core.tracecontext import message_trace
from bus.errors import StoreError
from bus.store import records
from bus.store.connection import Store

log = logging.getLogger(__name__)

TRACER: Final = "hero.node"
ENDED_BY: Final = "hero.ended_by"  # "node": the attempt's span was written by its node


async def attempt_ended(
    store: Store,
    node_id: str,
    ctx: int,
    job: RunnerJob,
    attempt: int,
    started_at: int,
    outcome: str,
    reason: str = "",
) -> None:
    """Record the span of attempt ``attempt`` of ``job``, which the node ended with ``outcome``
    (``retry``, ``finished``, ``error``) for ``reason`` (the attempt's; only its cause is
    recorded: a reason's text may quote what the job wrote). Never raises: the attempt is
    ended already, and a span the store kept from being read is only a span."""
    if not spans.recording():
        return
    try:
        names = ["traceparent", "tracestate"]
        fields = await records.read_fields(store, ctx, [job.message_key], names)
    except StoreError as exc:
        log.info("%s: attempt %d's span not recorded: %s", job.key, attempt, exc)
        return
    trace = message_trace(fields[0].get("traceparent", ""), fields[0].get("tracestate", ""))
    attributes: dict[str, Any] = {spans.CONTEXT: ctx, spans.NODE: node_id, ENDED_BY: "node"}
    span = spans.start_attempt(
        TRACER,
        job,
        attempt,
        trace,
        keys.queue(job.script_type),
        attributes,
        start_time_s=float(started_at) if 0 < started_at <= now() else None,
    )
    spans.end(span, outcome, cause_of(reason) if reason else "")
