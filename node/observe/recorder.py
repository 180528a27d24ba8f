"""The node's own tracer provider: OpenTelemetry API spans that cost a job a few µs each.

A node (and each of its runner processes) records spans through the OpenTelemetry API
(bus/core/spans.py starts and ends them explicitly, never across an ``await``); what records
them is this provider, not the SDK's. Why: the SDK's ``start_span`` / ``end`` cost ~40 µs per
span on a 2-core machine (bounded attribute maps, locks, a ReadableSpan copy at the end, the
span processors' hooks) and its OTLP encoder 65-210 µs more; at 4 spans a job that was a third
of a traced job's CPU (bench case 10, bench/HISTORY.md#tracing-cost-2). A span here is a small
object holding what OTLP sends; ending it hands a :class:`~node.observe.otlp.Record` to the
exporter's queue, and the encoding happens in the exporter's thread, per batch
(node/observe/otlp.py).

The decisions stay the node's: the sampler is :class:`~node.observe.tracing.KeyedRatioSampler`
(a keyed hash of the trace id, never the sender's flag), and a span id pinned by
``spans.start(span_id=...)`` is used (an attempt's, derived from its job and number).
A span not sampled is a NonRecordingSpan with a valid context, as the SDK's, so that its
children and the trace context a node passes on stay in the trace.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation import _SPAN_KEY
from opentelemetry.util.types import Attributes

from bus.core.spans import Shared, take_pinned_span_id
from node.observe.otlp import Record

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NO_STATE = TraceState()
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
# OTLP's Span.flags: bit 8 says whether the parent's remoteness is known, bit 9 that it is
_PARENT_LOCAL, _PARENT_REMOTE = 0x100, 0x300
_OTLP_STATUS = {StatusCode.OK: 1, StatusCode.ERROR: 2}
_OTLP_KIND = {kind: kind.value + 1 for kind in SpanKind}  # the API counts from 0, OTLP from 1
_OTLP_KIND_NAMED = {kind.name: kind.value + 1 for kind in SpanKind}


class Sampler(Protocol):
    """What the provider asks of a sampler: whether trace ``trace_id`` is recorded."""

    def records(self, trace_id: int) -> bool: ...


class Queue(Protocol):
    """Where ended spans go: the exporter (node/observe/otlp.py ``Exporter``)."""

    def add(self, record: Record) -> None: ...

    def force_flush(self, timeout_s: float = 5.0) -> bool: ...

    def shutdown(self, timeout_s: float = 5.0) -> None: ...


class RecordingSpan(trace.Span):
    """A sampled span: its fields as OTLP sends them, handed to the exporter once ended."""

    __slots__ = ("_ctx", "_exporter", "_record", "_state")

    def __init__(self, exporter: Queue, record: Record, state: TraceState | None) -> None:
        self._exporter, self._record, self._state = exporter, record, state
        self._ctx: SpanContext | None = None

    def get_span_context(self) -> SpanContext:
        # made when asked (a child's parent through the API, a trace context passed on): most
        # spans never are
        if self._ctx is None:
            r = self._record
            self._ctx = SpanContext(r.trace_id, r.span_id, False, _SAMPLED, self._trace_state())
        return self._ctx

    def _trace_state(self) -> TraceState:
        if self._state is None:  # started directly: its header only
            header = self._record.trace_state
            self._state = TraceState.from_header([header]) if header else _NO_STATE
        return self._state

    def is_recording(self) -> bool:
        return self._record.end_ns == 0

    def set_attribute(self, key: str, value: Any) -> None:  # noqa: ANN401 - an AnyValue
        if self._record.end_ns == 0:
            self._record.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._record.end_ns == 0:
            self._record.attributes.update(attributes)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        code = status.status_code if isinstance(status, Status) else status
        if isinstance(status, Status):
            description = status.description
        self._record.status = _OTLP_STATUS.get(code, 0)
        self._record.status_message = description or ""

    def update_name(self, name: str) -> None:
        self._record.name = name

    def add_event(
        self,
        name: str,
        attributes: Attributes = None,
        timestamp: int | None = None,
    ) -> None:
        """Events are not recorded: no span of the node has any."""

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """Not recorded: an exception's text may quote content (bus/core/spans.py
        ``end_error`` records its type as the reason instead)."""

    def end(self, end_time: int | None = None) -> None:
        record = self._record
        if record.end_ns:
            return
        record.end_ns = end_time or time.time_ns()
        self._exporter.add(record)


_PARENTS = (NonRecordingSpan, RecordingSpan)  # the parents bus/core/spans.py passes on


class Tracer(trace.Tracer):
    """Starts the spans of one tracer name (an OTLP scope)."""

    def __init__(self, provider: TracerProvider, name: str) -> None:
        self.provider, self.name = provider, name

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        current: Any = context.get(_SPAN_KEY) if context is not None else None
        if type(current) not in _PARENTS and not isinstance(current, trace.Span):
            current = trace.get_current_span(context)  # a root, or the current span
        parent = current.get_span_context()
        span_id = take_pinned_span_id() or random.getrandbits(64) or 1
        if parent.is_valid:
            trace_id, parent_id, state = parent.trace_id, parent.span_id, parent.trace_state
            flags = _PARENT_REMOTE if parent.is_remote else _PARENT_LOCAL
        else:
            trace_id, parent_id, state = random.getrandbits(128) or 1, 0, parent.trace_state
            flags = _PARENT_LOCAL
        provider = self.provider
        if not provider.sampler.records(trace_id):
            return NonRecordingSpan(SpanContext(trace_id, span_id, False, _UNSAMPLED, state))
        record = Record(
            self.name,
            name,
            _OTLP_KIND[kind],
            trace_id,
            span_id,
            parent_id,
            flags | 1,
            state.to_header() if state else "",
            start_time or time.time_ns(),
            0,
            dict(attributes) if attributes else {},
            [(ln.context.trace_id, ln.context.span_id) for ln in links] if links else [],
        )
        return RecordingSpan(provider.exporter, record, state)

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(span, end_on_exit=end_on_exit) as current:
            yield current


class TracerProvider(trace.TracerProvider):
    """The provider a traced node (and each of its runner processes) installs: its spans go
    to ``exporter`` when ``sampler`` records their trace.

    Beside the API's tracers, :meth:`record` starts a span from its parts as the bus has them
    (bus/core/spans.py ``Direct``): the ids of a message's trace context as ints, groups of
    attributes made once for many spans, links as id pairs. What it records is what
    ``start_span`` records for the same span (tests/observe/test_direct_spans.py); it costs
    a third: no Context, SpanContext, TraceState, Link or attribute dict made per span."""

    records_directly = True  # bus/core/spans.py: use record()

    def __init__(self, sampler: Sampler, exporter: Queue) -> None:
        self.sampler, self.exporter = sampler, exporter
        self._tracers: dict[str, Tracer] = {}

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> Tracer:
        tracer = self._tracers.get(instrumenting_module_name)
        if tracer is None:
            tracer = self._tracers[instrumenting_module_name] = Tracer(
                self, instrumenting_module_name
            )
        return tracer

    def record(
        self,
        scope: str,
        name: str,
        kind: str,
        parent: tuple[int, int, str] | trace.Span | None,
        shared: Shared,
        attributes: dict[str, Any] | None,
        links: Sequence[tuple[int, int]],
        span_id: int,
        start_ns: int,
    ) -> trace.Span:
        """A started span (see the class docstring; the parameters: bus/core/spans.py
        ``Direct``)."""
        if isinstance(parent, tuple):  # a message's trace context: remote
            trace_id, parent_id, state = parent
            flags = _PARENT_REMOTE
        elif type(parent) is RecordingSpan:
            r = parent._record
            trace_id, parent_id, state, flags = r.trace_id, r.span_id, r.trace_state, _PARENT_LOCAL
        elif parent is None:
            trace_id, parent_id, state, flags = random.getrandbits(128) or 1, 0, "", _PARENT_LOCAL
        else:  # a span of the API's (a dropped one): as start_span takes it
            ctx = parent.get_span_context()
            if ctx.is_valid:
                trace_id, parent_id = ctx.trace_id, ctx.span_id
                state = ctx.trace_state.to_header() if ctx.trace_state else ""
                flags = _PARENT_REMOTE if ctx.is_remote else _PARENT_LOCAL
            else:
                trace_id, parent_id, state = random.getrandbits(128) or 1, 0, ""
                flags = _PARENT_LOCAL
        span_id = span_id or random.getrandbits(64) or 1
        if not self.sampler.records(trace_id):
            trace_state = TraceState.from_header([state]) if state else _NO_STATE
            return NonRecordingSpan(SpanContext(trace_id, span_id, False, _UNSAMPLED, trace_state))
        record = Record(
            scope,
            name,
            _OTLP_KIND_NAMED[kind],
            trace_id,
            span_id,
            parent_id,
            flags | 1,
            state,
            start_ns or time.time_ns(),
            0,
            attributes if attributes is not None else {},
            links,
            0,
            "",
            shared,
        )
        return RecordingSpan(self.exporter, record, None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Send the spans still queued and stop the exporter's thread."""
        self.exporter.shutdown()
