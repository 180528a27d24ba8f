"""The spans of a runner process (issue 48): one CONSUMER span per attempt of a job on its
slot, a child of the trace its message carries, and the sandbox run as that span's child.

Why here, with an exporter of the runner's own, rather than spans the node writes afterwards
from its attempt records: those records hold whole seconds (``attempt_entry``), the sandbox
run is in none of them, and a job's time is most of a trace's; the runner measures both as
they happen. It holds no secret for it: the endpoint, the ratio and the node's sampling key
come in its spec on stdin (node/observe/tracing.py ``runner_settings``), the export runs in
the exporter's own thread (node/observe/otlp.py). With tracing off none of this is
imported: the loop checks one attribute per job (``SlotLoop.traced``).

A retry is a new span, linked to the first attempt's: attempt spans have ids derived from
their trace, job and number (bus/core/spans.py ``attempt_span_id``), so the link needs no
record of the first span, whichever process of the node ran it.
"""

from __future__ import annotations

from typing import Any

from bus.core import keys, queues, spans
from bus.core.attempts import Outcome, cause_of
from bus.core.models import Message, RunnerJob
from bus.core.tracecontext import message_trace
from node.slot.spec import RunnerSpec

TRACER = "hero.runner"


def attempt_span(
    spec: RunnerSpec,
    job: RunnerJob,
    fields: dict[str, str],
    request: Message,
    attempt: int,
    start_time_s: float | None = None,
) -> spans.Span | None:
    """The started span of attempt ``attempt`` of ``job`` (None: not recorded), started now
    or at ``start_time_s`` (Unix s)."""
    trace = message_trace(request.traceparent, request.tracestate)
    group = _slot_group(spec, queues.queue_of(fields))
    queue = keys.queue(spec.script_type)
    return spans.start_attempt(TRACER, job, attempt, trace, queue, group, start_time_s)


def _slot_group(spec: RunnerSpec, destination: str) -> spans.Shared:
    """What each attempt span of this slot says alike: context, node, queue, slot."""
    key = ("run", spec.node_id, spec.ctx, spec.slot_id, destination)
    found = _GROUPS.get(key)
    if found is None:
        if len(_GROUPS) >= 256:
            _GROUPS.clear()
        found = _GROUPS[key] = spans.group(
            {
                spans.CONTEXT: spec.ctx,
                spans.NODE: spec.node_id,
                spans.DESTINATION: destination,
                "hero.slot": spec.slot_id,
            }
        )
    return found


def _sandbox_group(spec: RunnerSpec) -> spans.Shared:
    """What each sandbox span of this slot says alike: node, slot, sandbox mode."""
    mode = str(spec.sandbox.get("mode") or "")
    key = ("sandbox", spec.node_id, spec.ctx, spec.slot_id, mode)
    found = _GROUPS.get(key)
    if found is None:
        if len(_GROUPS) >= 256:
            _GROUPS.clear()
        attributes: dict[str, Any] = {spans.NODE: spec.node_id, "hero.slot": spec.slot_id}
        if mode:
            attributes["hero.sandbox.mode"] = mode
        found = _GROUPS[key] = spans.group(attributes)
    return found


# by span, slot and queue: a runner process serves one slot, so a few (bounded all the same)
_GROUPS: dict[tuple[str, str, int, str, str], spans.Shared] = {}


def sandbox_span(
    spec: RunnerSpec,
    attempt: spans.Span | None,
    job_key: str,
    start_time_s: float | None = None,
) -> spans.Span | None:
    """The started span of the sandbox run of the attempt ``attempt`` (None: not recorded),
    started now or at ``start_time_s`` (Unix s)."""
    own = {spans.JOB_KEY: job_key}
    group = _sandbox_group(spec)
    return spans.start_child(TRACER, "sandbox", "INTERNAL", attempt, group, own, start_time_s)


def ran_attempt(
    spec: RunnerSpec,
    attempt: tuple[RunnerJob, dict[str, str], Message, int],
    outcome: Outcome,
    times: tuple[float, float, float],
    ended: str,
) -> None:
    """The spans of a batch's ``attempt`` (job, fields, request, number), recorded once its
    end is (``ended``: retry, finished or error): the jobs of a batch run one after the other
    in one request to the sandbox, so each attempt's span starts at its turn and its sandbox
    span ends at its answer. ``times``: its turn, its answer and its end, in Unix s."""
    job, fields, request, number = attempt
    began, answered, ended_s = times
    span = attempt_span(spec, job, fields, request, number, began)
    if span is None:
        return
    box = sandbox_span(spec, span, job.key, began)
    code = outcome.result.get("exit_code")
    if code is not None:
        spans.end(box, "exited", attributes={"hero.exit_code": int(code)}, end_time_s=answered)
    else:  # killed (a timeout, a stop) or lost: no exit status of its own
        end(box, "failed", outcome.reason, end_time_s=answered)
    end(span, ended, outcome.reason, end_time_s=ended_s)


def end(
    span: spans.Span | None,
    outcome: str,
    reason: str = "",
    attributes: spans.Attributes | None = None,
    end_time_s: float | None = None,
) -> None:
    """End ``span`` with ``outcome`` and the cause of ``reason`` (a token such as
    ``exit:1`` or ``timeout``: a reason's text may quote what the job wrote), now or at
    ``end_time_s`` (Unix s)."""
    spans.end(span, outcome, cause_of(reason) if reason else "", attributes, end_time_s)
