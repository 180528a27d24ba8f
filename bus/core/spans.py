"""The bus's bridge to the OpenTelemetry API: start and end spans, turn trace contexts around.

Spans are started and ended explicitly (:func:`start`, :func:`end`), never held by a context
manager or made current across an ``await``: trio may switch tasks there, and a span made
current in one task would leak into another (opentelemetry-python #2606).

Costless when nothing is traced: :func:`start` returns None at once unless someone installed a
recording tracer provider (a node with ``[tracing]`` on, node/observe/tracing.py; an
application that set up the SDK around the client). opentelemetry-api is optional: without it
every call here is a no-op, and a client still sends a trace context of its own.

The services judge a message's trace context here too (:func:`judge`): once, where they take
the message, the drop of a bad value counted by the caller's counter.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from bus.core.errors import ModelError
from bus.core.models import Message, MessageType, RunnerJob
from bus.core.tracecontext import (
    NO_TRACE,
    MessageTrace,
    TraceParent,
    message_trace,
    new_traceparent,
    well_formed,
)

try:
    from opentelemetry import trace as _otel
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        TraceFlags,
        TraceState,
    )

    _NO_STATE: Final = TraceState()  # immutable: one for every span context without a state
except ImportError:  # pragma: no cover - opentelemetry-api is a dependency of the node
    _otel = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# Attribute names: the messaging conventions where they fit, ``hero.*`` for the rest. No
# attribute ever holds a script, an environment value or an output.
SYSTEM: Final = "messaging.system"
OPERATION: Final = "messaging.operation.type"
DESTINATION: Final = "messaging.destination.name"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
JOB_KEYS: Final = "hero.job.keys"
FLOW_ID: Final = "hero.flow.id"
CONTEXT: Final = "hero.context.id"
CALLER: Final = "hero.caller.id"
NODE: Final = "hero.node.id"
PEER: Final = "hero.peer.id"
JOB_KEY: Final = "hero.job.key"
ATTEMPT: Final = "hero.attempt"
OUTCOME: Final = "hero.outcome"
REASON: Final = "hero.reason"
SYSTEM_NAME: Final = "hero-bus"

Attributes = Mapping[str, Any]  # str, int or a sequence of str
Span = Any  # an opentelemetry.trace.Span; Any so that the module loads without the API


def kind(name: str) -> Any:  # noqa: ANN401 - a SpanKind, or None without the API
    """The SpanKind named ``name`` (PRODUCER, CONSUMER, INTERNAL, CLIENT)."""
    return _KINDS.get(name) if _otel is not None else None


_KINDS: Final = {k.name: k for k in SpanKind} if _otel is not None else {}


def recording() -> bool:
    """Whether spans started here would be recorded: a tracer provider was installed."""
    if _otel is None:
        return False
    # asked per message: the API's global, read directly, costs a tenth of
    # get_tracer_provider() (which looks its environment variable up on every call)
    provider = getattr(_otel, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None:
        return False
    if provider is _UNKNOWN:  # an API that keeps it elsewhere: ask it
        provider = _otel.get_tracer_provider()
    seen = _RECORDING
    if provider is not seen[0]:  # an isinstance of an ABC is a few µs: once per provider
        seen[:] = [provider, not isinstance(provider, _NOT_RECORDING), _direct_of(provider)]
    return bool(seen[1])


_UNKNOWN: Final = object()
# the provider last asked about, whether it records, and its direct recorder (or None)
_RECORDING: list[Any] = [_UNKNOWN, False, None]
_NOT_RECORDING: Final = (
    (_otel.ProxyTracerProvider, _otel.NoOpTracerProvider) if _otel is not None else ()
)


class Shared:
    """Attributes that many spans carry alike (a message's on its two spans at a node, a slot's
    on each attempt): made once, and encoded once by the node's exporter, which keeps the
    bytes in ``encoded`` (node/observe/otlp.py); ``base``'s come with them. A span's own
    attributes never repeat one of its group's keys. Made by :func:`group`."""

    __slots__ = ("base", "encoded", "items")

    def __init__(self, attributes: Attributes, base: Shared | None = None) -> None:
        self.items: tuple[tuple[str, Any], ...] = tuple(attributes.items())
        self.base, self.encoded = base, b""

    def all(self) -> dict[str, Any]:
        """Its attributes and its base's."""
        return (self.base.all() if self.base else {}) | dict(self.items)


class Direct(Protocol):
    """A provider's recorder that takes a span's parts as they are, no API Context, Link or
    SpanContext built for them (node/observe/recorder.py ``TracerProvider.record``).

    ``parent``: ``(trace id, span id, tracestate header)`` of a remote parent (a message's),
    a span (its child, local), or None (a new trace); ``links``: (trace id, span id) pairs;
    ``span_id`` 0 and ``start_ns`` 0: a random id, now. Returns the started span."""

    def __call__(
        self,
        scope: str,
        name: str,
        kind: str,
        parent: tuple[int, int, str] | Span | None,
        shared: Shared,
        attributes: dict[str, Any] | None,
        links: Sequence[tuple[int, int]],
        span_id: int,
        start_ns: int,
    ) -> Span: ...


def _direct_of(provider: object) -> Direct | None:
    """The direct recorder of ``provider`` when it offers one (the node's); any other (an
    application's SDK provider) records through the API."""
    direct = getattr(provider, "record", None)
    return direct if getattr(provider, "records_directly", False) else None


def _direct() -> Direct | None:
    """The installed provider's direct recorder; ask :func:`recording` first."""
    return _RECORDING[2]


SYSTEM_GROUP: Final = Shared({SYSTEM: SYSTEM_NAME})  # on every span the bus starts


def group(attributes: Attributes) -> Shared:
    """A group of attributes for many spans (with the system's, as every span has it)."""
    return Shared(attributes, SYSTEM_GROUP)


def _remote(parent: TraceParent | None, tracestate: str) -> tuple[int, int, str] | None:
    """A message's trace context as a direct recorder takes a remote parent."""
    if parent is None:
        return None
    state = _STATES.get(tracestate) if tracestate else ""
    if state is None:  # as the API path would carry it: through a TraceState
        if len(_STATES) >= 256:
            _STATES.clear()
        state = _STATES[tracestate] = TraceState.from_header([tracestate]).to_header()
    return int(parent.trace_id, 16), int(parent.parent_id, 16), state


_STATES: dict[str, str] = {}  # tracestate headers, as a TraceState writes them back, bounded


def remote_context(parent: TraceParent | None, tracestate: str = "") -> Any:  # noqa: ANN401
    """An OpenTelemetry Context whose current span is ``parent`` (remote), or an empty one for
    None: a node's span is a child of the message's trace, or the root of a trace of its own,
    never of whatever happens to be current in the task."""
    if parent is None:
        return Context()
    # a message's spans (admit, route; verify, materialise) share one: a Context is immutable
    found = _REMOTE.get((parent, tracestate))
    if found is None:
        if len(_REMOTE) >= 256:
            _REMOTE.clear()
        span = NonRecordingSpan(_span_context(parent, tracestate))
        found = _REMOTE[parent, tracestate] = _otel.set_span_in_context(span)
    return found


_REMOTE: dict[tuple[TraceParent, str], Any] = {}  # the last remote contexts made, bounded


def _span_context(parent: TraceParent, tracestate: str) -> Any:  # noqa: ANN401
    state = TraceState.from_header([tracestate]) if tracestate else _NO_STATE
    return SpanContext(
        trace_id=int(parent.trace_id, 16),
        span_id=int(parent.parent_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(parent.flags),
        trace_state=state,
    )


def link_to(parent: TraceParent) -> Any:  # noqa: ANN401
    """A span link to ``parent`` (a message a frame carries)."""
    return Link(_span_context(parent, ""))


# a span id start() asks the provider's id generator to use (node/observe/tracing.py
# PinnedIds), per thread: set and taken within one start_span call
_PINNED = threading.local()


def take_pinned_span_id() -> int:
    """The span id pinned for the span being started (0: none); taken once."""
    pinned = getattr(_PINNED, "span_id", 0)
    _PINNED.span_id = 0
    return pinned


def start(
    tracer_name: str,
    name: str,
    span_kind: str,
    *,
    context: Any = None,  # noqa: ANN401 - an opentelemetry Context; None: the current one
    attributes: Attributes | None = None,
    links: Sequence[Any] = (),
    span_id: int = 0,
    start_time_s: float | None = None,
) -> Span | None:
    """A started span (to be ended with :func:`end`), or None when nothing is recorded.
    ``span_id``: the id it gets where the node's provider allows it (else a random one);
    ``start_time_s``: when it started (Unix s), if before now."""
    if not recording():
        return None
    tracer = _tracer(tracer_name)
    _PINNED.span_id = span_id
    try:
        return tracer.start_span(
            name,
            context=context,
            kind=kind(span_kind),
            attributes={SYSTEM: SYSTEM_NAME, **(attributes or {})},
            links=list(links) or None,
            start_time=None if start_time_s is None else int(start_time_s * 1e9),
        )
    finally:
        _PINNED.span_id = 0


# the tracers of the installed provider, by name: get_tracer() builds a new one on each call,
# a third of what starting a span costs (bench case 10)
_TRACERS: dict[str, Any] = {}
_TRACERS_OF: list[Any] = [None]  # the provider they come from


def _tracer(name: str) -> Any:  # noqa: ANN401 - an opentelemetry Tracer
    provider = getattr(_otel, "_TRACER_PROVIDER", None)
    if provider is not _TRACERS_OF[0]:  # another provider installed (a test's, a new node's)
        _TRACERS.clear()
        _TRACERS_OF[0] = provider
    tracer = _TRACERS.get(name)
    if tracer is None:
        tracer = _TRACERS[name] = _otel.get_tracer(name)
    return tracer


def child_context(span: Span | None) -> Any:  # noqa: ANN401
    """An OpenTelemetry Context whose current span is ``span`` (a parent to pass on
    explicitly, never made current)."""
    return _otel.set_span_in_context(span) if span is not None else None


def attempt_span_id(trace_id: str, job_key: str, attempt: int) -> int:
    """The span id of attempt ``attempt`` of ``job_key`` in trace ``trace_id``: derived, so
    that a retry, run by whichever process of the node, links to its first attempt without
    anyone recording that attempt's span. Never 0 (an invalid id)."""
    seed = f"{trace_id}|{job_key}|{attempt}".encode()
    value = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big")
    return value or 1


def attempt_link(trace_id: str, job_key: str) -> Any:  # noqa: ANN401
    """A span link to the first attempt of ``job_key`` in trace ``trace_id``."""
    first = attempt_span_id(trace_id, job_key, 1)
    return Link(
        SpanContext(
            trace_id=int(trace_id, 16),
            span_id=first,
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    )


def start_attempt(
    tracer_name: str,
    job: RunnerJob,
    attempt: int,
    trace: MessageTrace,
    queue_name: str,
    attributes: Attributes | Shared,
    start_time_s: float | None = None,
) -> Span | None:
    """The started CONSUMER span of attempt ``attempt`` of ``job`` (None: not recorded),
    whoever ends it (a runner process, or the node for an attempt it ended itself): parented
    on the message's trace, its id derived from the job and attempt so that a retry links to
    the first. ``attributes`` adds to the job's own (key, message, caller, attempt); a
    :func:`group` (a slot's, the same for each attempt) never repeats them."""
    if not recording():
        return None
    parent, span_id = trace.parent, 0
    if parent is not None:
        span_id = attempt_span_id(parent.trace_id, job.key, attempt)
    own: dict[str, Any] = {
        JOB_KEY: job.key,
        MESSAGE_ID: job.message_key,
        CALLER: job.caller_id,
        ATTEMPT: attempt,
    }
    direct = _direct()
    if direct is not None:
        links: Sequence[tuple[int, int]] = ()
        if parent is not None and attempt > 1:
            links = [(int(parent.trace_id, 16), attempt_span_id(parent.trace_id, job.key, 1))]
        if isinstance(attributes, Shared):
            shared = attributes
        else:
            shared, own = SYSTEM_GROUP, own | dict(attributes)
        return direct(
            tracer_name,
            f"run {queue_name}",
            "CONSUMER",
            _remote(parent, trace.tracestate),
            shared,
            own,
            links,
            span_id,
            0 if start_time_s is None else int(start_time_s * 1e9),
        )
    if isinstance(attributes, Shared):
        attributes = attributes.all()
    return start(
        tracer_name,
        f"run {queue_name}",
        "CONSUMER",
        context=remote_context(parent, trace.tracestate),
        attributes=own | dict(attributes),
        links=[attempt_link(parent.trace_id, job.key)] if parent and attempt > 1 else [],
        span_id=span_id,
        start_time_s=start_time_s,
    )


def start_child(
    tracer_name: str,
    name: str,
    span_kind: str,
    parent: Span | None,
    attributes: Shared,
    own: Attributes | None = None,
    start_time_s: float | None = None,
) -> Span | None:
    """A started span, a child of ``parent`` (None: not recorded), with the ``attributes``
    of a :func:`group` (never repeated in ``own``, the span's own)."""
    if parent is None or not recording():
        return None
    direct = _direct()
    if direct is not None:
        start_ns = 0 if start_time_s is None else int(start_time_s * 1e9)
        mine = dict(own) if own else {}
        return direct(tracer_name, name, span_kind, parent, attributes, mine, (), 0, start_ns)
    return start(
        tracer_name,
        name,
        span_kind,
        context=child_context(parent),
        attributes=attributes.all() | dict(own or {}),
        start_time_s=start_time_s,
    )


def end(
    span: Span | None,
    outcome: str = "",
    reason: str = "",
    attributes: Attributes | None = None,
    end_time_s: float | None = None,
) -> None:
    """End ``span`` (None: nothing), with its ``outcome`` and refusal ``reason`` (a token),
    now or at ``end_time_s`` (Unix s)."""
    if span is None:
        return
    if outcome:
        span.set_attribute(OUTCOME, outcome)
    if reason:
        span.set_attribute(REASON, reason)
        span.set_status(_otel.Status(_otel.StatusCode.ERROR, reason))
    for name, value in (attributes or {}).items():
        span.set_attribute(name, value)
    span.end(None if end_time_s is None else int(end_time_s * 1e9))


def traceparent_of(span: Span | None) -> tuple[str, str]:
    """``(traceparent, tracestate)`` naming ``span`` as the parent ("" , "" when it has no
    valid context: a no-op span outside any trace)."""
    if span is None or _otel is None:
        return "", ""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return "", ""
    parent = TraceParent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", int(ctx.trace_flags))
    return parent.header, ctx.trace_state.to_header() if ctx.trace_state else ""


def current_span() -> Span | None:
    """The caller's current span (its OpenTelemetry context), None without the API."""
    return _otel.get_current_span() if _otel is not None else None


def outgoing_trace(span: Span | None) -> tuple[str, str]:
    """The trace context a client signs into what it sends: ``span``'s (its PRODUCER span),
    else the caller's current span's, else a new trace (bus/core/tracecontext.py)."""
    for candidate in (span, current_span()):
        found = traceparent_of(candidate)
        if found[0]:
            return found
    return new_traceparent(), ""


def end_error(span: Span | None, exc: BaseException) -> None:
    """End ``span`` for an exception: ``rejected`` with a refusal's reason token (``Refused``
    and ``Rejected`` carry one), else ``failed`` with the exception's type (never its text:
    it may quote content)."""
    if span is None:
        return
    reason = getattr(exc, "reason", "")
    if reason:
        end(span, "rejected", str(reason))
    else:
        end(span, "failed", type(exc).__name__)


# -- a message's trace, as a service judges it ---------------------------------------------------

DROPPED: Final = "trace_context_dropped_"  # + TraceDrop: the node counter of each drop


def judge(
    count: Callable[[str], None], traceparent: str, tracestate: str, what: str
) -> MessageTrace:
    """The trace a message (or flow document) ``what`` continues; each value dropped is
    counted (``count(trace_context_dropped_<reason>)``) and logged, and nothing else happens:
    the message runs as if it carried none."""
    judged = message_trace(traceparent, tracestate)
    for drop in judged.dropped:
        count(DROPPED + drop.drop)
        log.warning("%s: trace context dropped (%s)", what, drop, extra={"reason": str(drop.drop)})
    return judged


def judge_message(count: Callable[[str], None], message: Message) -> MessageTrace:
    """:func:`judge` for a service that takes ``message``; while no span is recorded, a
    well-formed trace context costs one regex match (NO_TRACE: there is nothing to continue)."""
    if not recording() and not message.tracestate:
        if not message.traceparent or well_formed(message.traceparent):
            return NO_TRACE
    return judge(count, message.traceparent, message.tracestate, message.key)


def message_attributes(node_id: str, ctx: int, message: Message) -> dict[str, Any]:
    """What a node's span of ``message`` says of it: keys and ids, never content."""
    return {CONTEXT: ctx, NODE: node_id, **_of_message(message)}


def _of_message(message: Message) -> dict[str, Any]:
    """:func:`message_attributes`, the message's own part."""
    attributes: dict[str, Any] = {
        MESSAGE_ID: message.key,
        CALLER: message.caller_id,
        "messaging.message.type": message.message_type.value,
    }
    if message.job:
        attributes[JOB_KEYS] = [job.key for job in message.job]
    if message.message_type is MessageType.FLOW_JOB:
        flow_id = _flow_id(message.message)
        if flow_id:
            attributes[FLOW_ID] = flow_id
    return attributes


def _flow_id(payload: str) -> str:
    """The flow id a flow job message's payload names ("" if it names none); only read while
    spans are recorded."""
    # here, not at the top: a runner process imports this module, and flows (with the DAG
    # scheduler) cost each of its starts (tests/runners/test_runner_procs.py)
    from bus.core.flows import FlowJobPayload

    try:
        flow = FlowJobPayload.decode(payload).flow
    except ModelError:
        return ""
    flow_id = flow.get("id")
    return str(flow_id) if type(flow_id) is int else ""


def start_message_span(
    tracer: str,
    name: str,
    span_kind: str,
    node_id: str,
    ctx: int,
    message: Message,
    trace: MessageTrace,
    destination: str,
) -> Span | None:
    """A node's span of one message, a child of the trace it carries (or a root)."""
    if not recording():
        return None
    direct = _direct()
    if direct is None:
        attributes = message_attributes(node_id, ctx, message) | {DESTINATION: destination}
        context = remote_context(trace.parent, trace.tracestate)
        return start(tracer, name, span_kind, context=context, attributes=attributes)
    shared = _message_group(message, _node_group(node_id, ctx, destination))
    parent = _remote(trace.parent, trace.tracestate)
    return direct(tracer, name, span_kind, parent, shared, {}, (), 0, 0)


def _node_group(node_id: str, ctx: int, destination: str) -> Shared:
    """What every span of a node's queue says alike: the system, node, context, queue."""
    found = _NODE_GROUPS.get((node_id, ctx, destination))
    if found is None:
        if len(_NODE_GROUPS) >= 256:
            _NODE_GROUPS.clear()
        found = _NODE_GROUPS[node_id, ctx, destination] = group(
            {NODE: node_id, CONTEXT: ctx, DESTINATION: destination}
        )
    return found


def _message_group(message: Message, base: Shared) -> Shared:
    """What each span of ``message`` says of it, on ``base`` (its node's): made once for its
    two spans at a node (admit and route; verify and materialise), which see the same message
    object. Kept by key and object id, never the message itself (its script may be large): an
    id reused for another message of the same key in the same context is the same signed
    message parsed again (a key names one message there), and says the same."""
    found = _MESSAGE_GROUPS.get(message.key)
    if found is not None and found[0] == id(message) and found[1].base is base:
        return found[1]
    made = Shared(_of_message(message), base)
    if len(_MESSAGE_GROUPS) >= _MESSAGE_GROUPS_MAX:
        _MESSAGE_GROUPS.clear()
    _MESSAGE_GROUPS[message.key] = (id(message), made)
    return made


_NODE_GROUPS: dict[tuple[str, int, str], Shared] = {}
# the groups of the messages last spanned, by key: a pop's batch (64) is admitted, then routed
_MESSAGE_GROUPS: dict[str, tuple[int, Shared]] = {}
_MESSAGE_GROUPS_MAX: Final = 256
