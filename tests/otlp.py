"""A tiny OTLP/HTTP traces receiver for tests: HTTP/1.1 on 127.0.0.1, every POSTed body kept
(raw, and decoded as an ExportTraceServiceRequest), each span flattened with the node that
exported it (its resource's ``service.instance.id``)."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")
_GZIP = re.compile(rb"(?im)^content-encoding:\s*gzip\s*$")
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class Span:
    node: str  # service.instance.id of the exporting resource
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]
    links: list[tuple[str, str]]  # (trace id, span id)


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    bodies: list[bytes] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)
    url: str = ""

    async def start(self, nursery: trio.Nursery) -> str:
        serve = partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        return self.url

    async def _serve(self, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                match = _LENGTH.search(head)
                length = int(match.group(1)) if match else 0
                while len(buf) < length:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                self._record(gzip.decompress(body) if _GZIP.search(head) else body)
                await stream.send_all(_OK)
        except trio.BrokenResourceError:
            return

    def _record(self, body: bytes) -> None:
        self.bodies.append(body)
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            node=str(resource.get("service.instance.id", "")),
                            name=s.name,
                            kind=KINDS.get(s.kind, str(s.kind)),
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=[(ln.trace_id.hex(), ln.span_id.hex()) for ln in s.links],
                        )
                    )
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, found: Callable[[list[Span]], bool]) -> None:
        """Return once ``found(spans)`` holds, woken by each export (bound it by fail_after)."""
        while not found(self.spans):
            await self.changed.wait()
