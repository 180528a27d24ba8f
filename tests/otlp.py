"""A tiny OTLP/HTTP traces receiver for tests: bench/otlp.py's endpoint on 127.0.0.1, every
POSTed body kept (raw, and decoded as an ExportTraceServiceRequest), each span flattened with
the node that exported it (its resource's ``service.instance.id``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.otlp import Sink

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


class Receiver(Sink):
    """bench/otlp.py's endpoint, each body also decoded into :attr:`spans` as it comes."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[Span] = []
        self.changed = trio.Event()

    def received(self, body: bytes) -> None:
        super().received(body)
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
