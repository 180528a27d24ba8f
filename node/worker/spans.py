"""The spans of a runner process (issue 48): one CONSUMER span per attempt of a job on its
slot, a child of the trace its message carries, and the sandbox run as that span's child.

Why here, with an exporter of the runner's own, rather than spans the node writes afterwards
from its attempt records: those records hold whole seconds (``attempt_entry``), the sandbox
run is in none of them, and a job's time is most of a trace's; the runner measures both as
they happen. It holds no secret for it: the endpoint, the ratio and the node's sampling key
come in its spec on stdin (node/observe/tracing.py ``runner_settings``), the export runs in
the SDK's own thread. With tracing off none of this is imported: the loop checks one
attribute per job (``SlotLoop.traced``).

A retry is a new span, linked to the first attempt's: attempt spans have ids derived from
their trace, job and number (bus/core/spans.py ``attempt_span_id``), so the link needs no
record of the first span, whichever process of the node ran it.
"""

from __future__ import annotations

from typing import Any

from bus.core import keys, queues, spans
from bus.core.models import Message, RunnerJob
from bus.core.tracecontext import message_trace
from node.slot.lifecycle import cause_of
from node.slot.spec import RunnerSpec

TRACER = "hero.runner"


def attempt_span(
    spec: RunnerSpec, job: RunnerJob, fields: dict[str, str], request: Message, attempt: int
) -> spans.Span | None:
    """The started span of attempt ``attempt`` of ``job`` (None: not recorded)."""
    trace = message_trace(request.traceparent, request.tracestate)
    attributes: dict[str, Any] = {
        spans.CONTEXT: spec.ctx,
        spans.NODE: spec.node_id,
        spans.DESTINATION: queues.queue_of(fields),
        "hero.slot": spec.slot_id,
    }
    return spans.start_attempt(
        TRACER, job, attempt, trace, keys.queue(spec.script_type), attributes
    )


def sandbox_span(spec: RunnerSpec, attempt: spans.Span | None, job_key: str) -> spans.Span | None:
    """The started span of the sandbox run of the attempt ``attempt`` (None: not recorded)."""
    if attempt is None:
        return None
    attributes = {spans.JOB_KEY: job_key, spans.NODE: spec.node_id, "hero.slot": spec.slot_id}
    mode = str(spec.sandbox.get("mode") or "")
    if mode:
        attributes["hero.sandbox.mode"] = mode
    context = spans.child_context(attempt)
    return spans.start(TRACER, "sandbox", "INTERNAL", context=context, attributes=attributes)


def end(
    span: spans.Span | None,
    outcome: str,
    reason: str = "",
    attributes: spans.Attributes | None = None,
) -> None:
    """End ``span`` with ``outcome`` and the cause of ``reason`` (a token such as
    ``exit:1`` or ``timeout``: a reason's text may quote what the job wrote)."""
    spans.end(span, outcome, cause_of(reason) if reason else "", attributes)
