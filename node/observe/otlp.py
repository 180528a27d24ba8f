"""OTLP/HTTP for the node's spans: a finished span as a plain record, its protobuf encoding
(an ``ExportTraceServiceRequest``, opentelemetry-proto's ``trace.proto``), and the thread that
sends batches of them to the endpoint.

Why not the SDK's exporter: its encoder builds a protobuf message object per span, attribute
and value, then serialises them: 65-210 µs per span on a 2-core machine (bench case 10), the
largest share of what a traced job cost. The records here are written straight to the wire
format, once, in the exporter's thread: the fields are few and fixed (ids, name, kind, times,
key/value attributes, links, status), and a key's bytes are encoded once per process.
The receiver sees the same message the SDK would send (tests/otlp.py decodes it with
opentelemetry-proto).

The exporter behaves as the SDK's BatchSpanProcessor does, with its ``OTEL_BSP_*`` variables:
finished spans wait in a bounded queue (dropped, and counted, once it is full), a plain thread
sends them every ``OTEL_BSP_SCHEDULE_DELAY`` ms or as soon as a batch is full; a failed send is
logged and its spans dropped (a trace is not worth holding the node's memory for).
"""

from __future__ import annotations

import collections
import http.client
import logging
import os
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from bus.core.spans import Shared

log = logging.getLogger(__name__)

# the SDK's defaults (opentelemetry.sdk.environment_variables)
SCHEDULE_DELAY_MS: Final = 5000
MAX_QUEUE: Final = 2048
MAX_BATCH: Final = 512
EXPORT_TIMEOUT_MS: Final = 30000


@dataclass(slots=True)
class Record:
    """A finished span as the exporter needs it: ids as ints (trace, span, parent; 0: none),
    its scope (tracer name), kind as OTLP numbers it (1 INTERNAL ... 5 CONSUMER), times in
    Unix ns, attributes, links as (trace id, span id), status code (0 unset, 2 error)."""

    scope: str
    name: str
    kind: int
    trace_id: int
    span_id: int
    parent_id: int
    flags: int
    trace_state: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: Sequence[tuple[int, int]] = ()
    status: int = 0
    status_message: str = ""
    # attributes many spans carry alike (bus/core/spans.py Shared), beside ``attributes``:
    # never the same key in both; a group is encoded once, its bytes kept on it
    shared: Shared | None = None


# -- protobuf, by hand ---------------------------------------------------------------------------

_DOUBLE = struct.Struct("<d").pack


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) of a field number below 16."""
    size = len(payload)
    if size < 0x80:
        return bytes((number << 3 | 2, size)) + payload
    return bytes((number << 3 | 2,)) + _varint(size) + payload


def _any(value: object) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5."""
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, _any(v)) for v in value))
    return _field(1, str(value).encode())


# encoded KeyValue fields by (field number, key, value): most repeat from span to span (the
# node, the context, the slot, outcomes, the system); bounded, emptied when full
_KV: dict[tuple[int, str, object], bytes] = {}
_KV_MAX: Final = 4096
_NAMES: dict[str, bytes] = {}  # a span's name field, by name: a few names, every span


def _attributes(number: int, attributes: Iterable[tuple[str, object]]) -> bytes:
    """``attributes`` (key, value pairs) as repeated KeyValue field ``number`` (1 or 9)."""
    out = []
    for key, value in attributes:
        kept = type(value) is str or type(value) is int  # never a bool: True == 1
        encoded = _KV.get((number, key, value)) if kept else None
        if encoded is None:
            encoded = _field(number, _field(1, key.encode()) + _field(2, _any(value)))
            if kept:
                if len(_KV) >= _KV_MAX:
                    _KV.clear()
                _KV[number, key, value] = encoded
        out.append(encoded)
    return b"".join(out)


def _shared(group: Shared) -> bytes:
    """``group`` (with its base's) as repeated KeyValue field 9, encoded on first use and kept
    on it (a race between two encoders writes the same bytes twice)."""
    encoded = group.encoded
    if not encoded:
        base = group.base
        encoded = (base.encoded or _shared(base)) if base is not None else b""
        encoded = group.encoded = encoded + _attributes(9, group.items)
    return encoded


# a Span's fixed fields, each run packed at once: ids as big-endian bytes (a trace id as two
# 64-bit halves), times and flags as fixed64/fixed32 (little-endian), each after its tag
_M64: Final = (1 << 64) - 1
_IDS = struct.Struct(">HQQHQ").pack  # trace_id (1), span_id (2)
_PARENT = struct.Struct(">HQ").pack  # parent_span_id (4)
_TIMES = struct.Struct("<BBBQBQ").pack  # kind (6), start (7) and end (8) time
_LINK = struct.Struct(">BBHQQHQ").pack  # a Link (13) of 28 bytes: its trace_id and span_id
_FLAGS = struct.Struct("<BBI").pack  # flags (16)


def encode_span(r: Record) -> bytes:
    """One Span message."""
    trace_id = r.trace_id
    parts = [_IDS(0x0A10, trace_id >> 64, trace_id & _M64, 0x1208, r.span_id)]
    if r.trace_state:
        parts.append(_field(3, r.trace_state.encode()))
    if r.parent_id:
        parts.append(_PARENT(0x2208, r.parent_id))
    name = _NAMES.get(r.name)
    if name is None:
        name = _field(5, r.name.encode())
        if len(_NAMES) < 256:  # a name per peer at most: bounded all the same
            _NAMES[r.name] = name
    parts.append(name)
    parts.append(_TIMES(0x30, r.kind, 0x39, r.start_ns, 0x41, r.end_ns))
    if r.attributes:
        parts.append(_attributes(9, r.attributes.items()))
    group = r.shared
    if group is not None:
        parts.append(group.encoded or _shared(group))
    for linked, span_id in r.links:
        parts.append(_LINK(0x6A, 28, 0x0A10, linked >> 64, linked & _M64, 0x1208, span_id))
    if r.status:
        status = (_field(2, r.status_message.encode()) if r.status_message else b"") + bytes(
            (0x18, r.status)
        )
        parts.append(_field(15, status))
    parts.append(_FLAGS(0x85, 0x01, r.flags))
    return b"".join(parts)


def encode_request(resource: Mapping[str, object], records: Iterable[Record]) -> bytes:
    """An ExportTraceServiceRequest of ``records``, one ResourceSpans, one ScopeSpans per
    tracer name."""
    scopes: dict[str, list[bytes]] = {}
    for r in records:
        scopes.setdefault(r.scope, []).append(_field(2, encode_span(r)))
    body = [_field(1, _attributes(1, resource.items()))]  # Resource
    for scope, encoded in scopes.items():
        body.append(_field(2, _field(1, _field(1, scope.encode())) + b"".join(encoded)))
    return _field(1, b"".join(body))


# -- the exporter thread -------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


class Exporter:
    """The queue of finished spans and the thread that sends them (see the module docstring).
    :meth:`add` is all a span's end costs the thread that ends it."""

    def __init__(self, endpoint: str, resource: Mapping[str, object]) -> None:
        self.endpoint, self.resource = endpoint, dict(resource)
        self.delay_s = _env_int("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS) / 1000
        self.max_queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", MAX_QUEUE)
        self.max_batch = min(_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", MAX_BATCH), self.max_queue)
        self.timeout_s = _env_int("OTEL_BSP_EXPORT_TIMEOUT", EXPORT_TIMEOUT_MS) / 1000
        self.queue: collections.deque[Record] = collections.deque()
        self.dropped = 0  # spans dropped: the queue was full, or their send failed
        self.sent = 0
        self._wake = threading.Event()
        self._drained = threading.Event()  # set by the thread each time the queue is empty
        self._stopping = False
        self._conn: http.client.HTTPConnection | None = None
        self._path = urlsplit(endpoint).path or "/"
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, record: Record) -> None:
        """Queue a finished span (dropped when the queue is full)."""
        queue = self.queue
        if len(queue) >= self.max_queue:
            self.dropped += 1
            return
        queue.append(record)
        if len(queue) == self.max_batch:
            self._wake.set()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (within ``timeout_s``) and stop the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Wake the thread to send what is queued; whether it did within ``timeout_s``."""
        self._drained.clear()
        self._wake.set()
        return self._drained.wait(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            stopping = self._stopping
            while self.queue:  # what came meanwhile too, in batches
                batch = self._take()
                try:
                    self._send(batch)
                except Exception as exc:  # noqa: BLE001 - a span is only a span: never the thread
                    self._failed(batch, repr(exc))
            self._drained.set()
            if stopping:
                self._close()
                return

    def _take(self) -> list[Record]:
        queue, batch = self.queue, []
        for _ in range(min(len(queue), self.max_batch)):
            batch.append(queue.popleft())
        return batch

    def _send(self, batch: list[Record]) -> None:
        body = encode_request(self.resource, batch)
        for attempt in (1, 2):  # a kept-alive connection the receiver closed: once more
            try:
                status = self._post(body)
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                if attempt == 2:
                    self._failed(batch, repr(exc))
                continue
            if 200 <= status < 300:
                self.sent += len(batch)
            else:
                self._failed(batch, f"HTTP {status}")
            return

    def _post(self, body: bytes) -> int:
        if self._conn is None:
            url = urlsplit(self.endpoint)
            https = url.scheme == "https"
            kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
            self._conn = kind(url.hostname or "", url.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/x-protobuf"}
        self._conn.request("POST", self._path, body=body, headers=headers)
        response = self._conn.getresponse()
        response.read()
        return response.status

    def _failed(self, batch: list[Record], why: str) -> None:
        self.dropped += len(batch)
        log.warning("tracing: %d spans not exported to %s: %s", len(batch), self.endpoint, why)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
