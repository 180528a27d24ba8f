"""The one place the node sets up OpenTelemetry, and judges the trace context messages carry.

Off by default (``[tracing]`` without an endpoint): no SDK is imported, no exporter thread runs,
and every span call of the bus (bus/core/spans.py) returns at once on the API's no-op provider.
On, :func:`tracing` installs a tracer provider whose spans leave in batches over OTLP/HTTP. The
SDK's BatchSpanProcessor exports from a thread of its own (a plain ``threading.Thread``, no
asyncio): the trio loop only appends finished spans to its queue, and an export that stalls
costs the node no task, only spans dropped once that queue is full.

Sampling is the node's decision, never the sender's: a message's traceparent is signed by its
actor, an untrusted party, so neither its sampled flag nor a trace id chosen to fall under a
ratio can make a node record (and export) what it would not. :class:`KeyedRatioSampler` draws
from a keyed hash of the trace id: nodes that share ``sampling_key`` record the same traces
whole; without one each node keeps its own random key, which at a ratio below 1 samples each
node's part of a trace independently.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from bus.core import spans
from bus.core.models import Message
from bus.core.tracecontext import MessageTrace, message_trace
from node.config.tracing import TracingConfig
from node.state import Counters

log = logging.getLogger(__name__)

DROPPED = "trace_context_dropped_"  # + TraceDrop: the node counter of each drop
SHUTDOWN_S = 5.0  # the most a stopping node waits for its last spans to leave


def judge(counters: Counters, traceparent: str, tracestate: str, what: str) -> MessageTrace:
    """The trace a message (or flow document) ``what`` continues; each value dropped is
    counted (``trace_context_dropped_<reason>``) and logged, and nothing else happens: the
    message runs as if it carried none."""
    judged = message_trace(traceparent, tracestate)
    for drop in judged.dropped:
        counters.count(DROPPED + drop.drop)
        log.warning("%s: trace context dropped (%s)", what, drop, extra={"reason": str(drop.drop)})
    return judged


def judge_message(counters: Counters, message: Message) -> MessageTrace:
    return judge(counters, message.traceparent, message.tracestate, message.key)


def message_attributes(node_id: str, ctx: int, message: Message) -> dict[str, Any]:
    """What a node's span of ``message`` says of it: keys and ids, never content."""
    attributes: dict[str, Any] = {
        spans.MESSAGE_ID: message.key,
        spans.CONTEXT: ctx,
        spans.CALLER: message.caller_id,
        spans.NODE: node_id,
        "messaging.message.type": message.message_type.value,
    }
    if message.job:
        attributes[spans.JOB_KEYS] = [job.key for job in message.job]
    return attributes


def start_message_span(
    tracer: str,
    name: str,
    span_kind: str,
    node_id: str,
    ctx: int,
    message: Message,
    trace: MessageTrace,
    destination: str,
) -> spans.Span | None:
    """A node's span of one message, a child of the trace it carries (or a root)."""
    if not spans.recording():
        return None
    attributes = message_attributes(node_id, ctx, message) | {spans.DESTINATION: destination}
    context = spans.remote_context(trace.parent, trace.tracestate)
    return spans.start(tracer, name, span_kind, context=context, attributes=attributes)


def message_links(traces: Sequence[MessageTrace]) -> list[Any]:
    """Span links to the messages a frame carries (those with a trace to link to)."""
    return [spans.link_to(t.parent) for t in traces if t.parent is not None]


class KeyedRatioSampler:
    """Record a trace when a keyed hash of its trace id falls under ``ratio``; the parent's
    sampled flag and the trace id's own bits decide nothing (see the module docstring).
    Implements opentelemetry.sdk.trace.sampling.Sampler (imported only when tracing is on)."""

    def __init__(self, ratio: float, key: bytes) -> None:
        self.ratio, self.key = ratio, key
        self.bound = round(ratio * 2**64)

    def records(self, trace_id: int) -> bool:
        digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), key=self.key, digest_size=8)
        return int.from_bytes(digest.digest(), "big") < self.bound

    def should_sample(
        self,
        parent_context: Any,  # noqa: ANN401 - the SDK's types, imported lazily
        trace_id: int,
        name: str,
        kind: Any = None,  # noqa: ANN401
        attributes: Any = None,  # noqa: ANN401
        links: Any = None,  # noqa: ANN401
        trace_state: Any = None,  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult
        from opentelemetry.trace import get_current_span

        parent = get_current_span(parent_context).get_span_context()
        decision = Decision.RECORD_AND_SAMPLE if self.records(trace_id) else Decision.DROP
        return SamplingResult(decision, attributes, parent.trace_state if parent else None)

    def get_description(self) -> str:
        return f"KeyedRatioSampler{{{self.ratio}}}"


def sampling_key(config: TracingConfig) -> bytes:
    """The sampler's key: from ``sampling_key`` (shared by the nodes of a grid), else random."""
    if config.sampling_key:
        return hashlib.blake2b(config.sampling_key.encode(), digest_size=32).digest()
    return secrets.token_bytes(32)


def install(config: TracingConfig, node_id: str, node_name: str) -> Any:  # noqa: ANN401
    """Install the global tracer provider that exports this node's spans; returns it."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": config.service_name,
            "service.instance.id": node_id,
            "hero.node.name": node_name,
        }
    )
    sampler = KeyedRatioSampler(config.sampling_ratio, sampling_key(config))
    provider = TracerProvider(resource=resource, sampler=sampler)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)))
    trace.set_tracer_provider(provider)
    log.info(
        "tracing: spans to %s (sampling %g, service %s)",
        config.endpoint,
        config.sampling_ratio,
        config.service_name,
    )
    return provider


@asynccontextmanager
async def tracing(config: TracingConfig, node_id: str, node_name: str) -> AsyncIterator[None]:
    """Tracing for the node's lifetime: nothing at all when it is off; on, the provider is
    installed on entry and flushed and shut down on exit (in a thread: the SDK's shutdown
    blocks on the exporter), within SHUTDOWN_S."""
    if not config.enabled:
        yield
        return
    provider = install(config, node_id, node_name)
    try:
        yield
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_S):
            await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)
