"""W3C trace context (``traceparent``, ``tracestate``) of a message: parsed, checked, made.

A message may carry the trace it belongs to (PROTOCOL.md section 4.1): signed with its other
immutable fields, so no node on the way can move a job into another trace. The values are the
sender's, so untrusted: :func:`message_trace` judges them and says why it drops one; a dropped
value never refuses the message (it runs, untraced by the sender's trace), and its sampled flag
never decides anything here: whether a node records a trace is the node's choice
(node/observe/tracing.py).

Pure: no I/O, no OpenTelemetry import (the client and the node bridge to it themselves).
"""

from __future__ import annotations

import re
import secrets
from enum import StrEnum
from typing import Final, NamedTuple

VERSION: Final = "00"
# W3C trace-context: a vendor must accept at least 512 bytes of tracestate and may drop more;
# 32 list members at most.
MAX_TRACESTATE_BYTES: Final = 512
MAX_TRACESTATE_MEMBERS: Final = 32
# a traceparent is exactly 55 characters; a longer field is dropped before any regex runs
TRACEPARENT_LEN: Final = 55

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
)
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


class TraceDrop(StrEnum):
    """Why a node ignored a message's trace context; counted as ``trace_context_dropped_<x>``."""

    BAD_TRACEPARENT = "bad_traceparent"
    BAD_TRACESTATE = "bad_tracestate"


class TraceContextError(ValueError):
    """A value that is no valid trace context; ``drop`` is the counted reason."""

    def __init__(self, drop: TraceDrop, detail: str) -> None:
        super().__init__(f"{drop}: {detail}")
        self.drop, self.detail = drop, detail


# TraceParent and MessageTrace are built for every message a service takes: immutable tuples,
# built in a fraction of a frozen dataclass's time (which sets each field through object's
# __setattr__).


class TraceParent(NamedTuple):
    """A parsed ``traceparent``: lowercase hex ids, ``flags`` as the byte it is."""

    trace_id: str  # 32 hex
    parent_id: str  # 16 hex
    flags: int

    @property
    def header(self) -> str:
        return f"{VERSION}-{self.trace_id}-{self.parent_id}-{self.flags:02x}"

    @property
    def sampled(self) -> bool:
        """What the sender decided; informational only (see the module docstring)."""
        return bool(self.flags & 1)


def parse_traceparent(value: str) -> TraceParent:
    """The traceparent ``value`` holds; TraceContextError unless it is version ``00``, a 32-hex
    trace id and a 16-hex parent id that are not all zeros, and a 2-hex flags byte, lowercase,
    nothing around it (W3C trace-context level 1; the only version a signer may write here:
    a signed field has one spelling, so a later version is a later field)."""
    match = _TRACEPARENT.fullmatch(value) if len(value) == TRACEPARENT_LEN else None
    if match is None:
        if len(value) != TRACEPARENT_LEN:
            detail = f"{len(value)} characters, not {TRACEPARENT_LEN}"
        else:
            detail = "not 00-<32 hex>-<16 hex>-<2 hex> (lowercase)"
        raise TraceContextError(TraceDrop.BAD_TRACEPARENT, detail)
    trace_id, parent_id, flags = match.groups()
    if trace_id == _ZERO_TRACE:
        raise TraceContextError(TraceDrop.BAD_TRACEPARENT, "the trace id is all zeros")
    if parent_id == _ZERO_SPAN:
        raise TraceContextError(TraceDrop.BAD_TRACEPARENT, "the parent id is all zeros")
    return TraceParent(trace_id, parent_id, int(flags, 16))


def well_formed(traceparent: str) -> bool:
    """Whether :func:`parse_traceparent` accepts ``traceparent``, building nothing: what a node
    that records no span asks of each message."""
    return (
        len(traceparent) == TRACEPARENT_LEN
        and _TRACEPARENT.fullmatch(traceparent) is not None
        and traceparent[3:35] != _ZERO_TRACE
        and traceparent[36:52] != _ZERO_SPAN
    )


def check_tracestate(value: str) -> str:
    """``value`` when it is a valid tracestate: at most 512 bytes and 32 members, each
    ``key=value`` as W3C defines them, no key twice (empty members and blanks around members
    allowed); TraceContextError otherwise."""
    size = len(value.encode("utf-8", "replace"))
    if size > MAX_TRACESTATE_BYTES:
        raise TraceContextError(TraceDrop.BAD_TRACESTATE, f"{size} bytes > {MAX_TRACESTATE_BYTES}")
    seen: set[str] = set()
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        key, eq, val = member.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(val):
            raise TraceContextError(TraceDrop.BAD_TRACESTATE, "a member is not key=value")
        if key in seen:
            raise TraceContextError(TraceDrop.BAD_TRACESTATE, "a key appears twice")
        seen.add(key)
    if len(seen) > MAX_TRACESTATE_MEMBERS:
        raise TraceContextError(
            TraceDrop.BAD_TRACESTATE, f"{len(seen)} members > {MAX_TRACESTATE_MEMBERS}"
        )
    return value


class MessageTrace(NamedTuple):
    """What a node makes of a message's trace fields: the parent to continue (None: start a
    trace of its own), the tracestate to pass on, and what it dropped, with why."""

    parent: TraceParent | None
    tracestate: str
    dropped: tuple[TraceContextError, ...] = ()

    @property
    def traceparent(self) -> str:
        """The traceparent that passes this trace on ("" without a parent)."""
        return "" if self.parent is None else self.parent.header


NO_TRACE: Final = MessageTrace(None, "")


def message_trace(traceparent: str, tracestate: str) -> MessageTrace:
    """Judge a message's ``traceparent`` and ``tracestate`` ("" when absent). A bad
    traceparent drops both (W3C: a tracestate belongs to its traceparent); a bad tracestate
    drops only itself."""
    if not traceparent:
        if not tracestate:
            return NO_TRACE
        lone = TraceContextError(TraceDrop.BAD_TRACESTATE, "a tracestate without traceparent")
        return MessageTrace(None, "", (lone,))
    try:
        parent = parse_traceparent(traceparent)
    except TraceContextError as exc:
        return MessageTrace(None, "", (exc,))
    if not tracestate:
        return MessageTrace(parent, "")
    try:
        return MessageTrace(parent, check_tracestate(tracestate))
    except TraceContextError as exc:
        return MessageTrace(parent, "", (exc,))


def new_traceparent() -> str:
    """A traceparent that starts a new trace (random ids, flags 00: nobody recorded its
    parent); what a client without a current span sends."""
    return TraceParent(secrets.token_hex(16), secrets.token_hex(8), 0).header


def inherited(traceparent: str, tracestate: str) -> tuple[str, str]:
    """``(traceparent, tracestate)`` of a message a node signs on behalf of another (a flow's
    job message; and - the hook for the result builder - a result answering a request): the
    other's trace context when it is valid, else ``("", "")``: a node never signs a value it
    would drop. ``tp, ts = inherited(request.traceparent, request.tracestate)``."""
    judged = message_trace(traceparent, tracestate)
    return judged.traceparent, judged.tracestate
