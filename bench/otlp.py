"""An OTLP/HTTP traces endpoint on 127.0.0.1 that answers every export 200 at once and keeps
its body: the receiver of bench case 10 (bench/tracing_cost.py) and, decoding what it keeps,
of the tracing tests (tests/otlp.py); and :class:`Kept`, an exporter's queue that keeps the
spans to be encoded by the caller. Here rather than in tests/ because tests import bench,
never the other way round.

HTTP/1.1 with keep-alive, bodies by Content-Length (a gzip-encoded one is kept decompressed);
nothing else of HTTP, which is all an OTLP exporter sends.
"""

from __future__ import annotations

import gzip
import re
from functools import partial

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from node.observe.otlp import Record

_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")
_GZIP = re.compile(rb"(?im)^content-encoding:\s*gzip\s*$")
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
_CHUNK = 65536


class Kept(list[Record]):
    """Where a node's span recorder (node/observe/recorder.py) puts its spans instead of an
    exporter's queue: kept, to be encoded by whoever holds it."""

    def add(self, record: Record) -> None:
        self.append(record)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        pass


class Sink:
    """An OTLP/HTTP traces endpoint that keeps each body (``bodies``) and answers 200;
    :meth:`received` is called with each body as it comes."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> str:
        """Listen on a free port of 127.0.0.1 in ``nursery``; returns the traces URL."""
        serve = partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1/traces"
        return self.url

    def received(self, body: bytes) -> None:
        self.bodies.append(body)

    def span_count(self) -> int:
        """Spans in every body received."""
        total = 0
        for body in self.bodies:
            request = ExportTraceServiceRequest.FromString(body)
            total += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return total

    async def _serve(self, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some(_CHUNK)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                match = _LENGTH.search(head)
                length = int(match.group(1)) if match else 0
                while len(buf) < length:
                    chunk = await stream.receive_some(_CHUNK)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                self.received(gzip.decompress(body) if _GZIP.search(head) else body)
                await stream.send_all(_OK)
        except trio.BrokenResourceError:
            return
