"""The node's own span recorder (node/observe/recorder.py) and OTLP exporter
(node/observe/otlp.py): what it sends decodes, with opentelemetry-proto, to exactly the spans
recorded (ids, parent, kind, times, every attribute type, links, status); a trace the sampler
drops still has a valid context; the exporter's queue is bounded, and a receiver that is down
costs dropped spans, never an exception."""

from __future__ import annotations

import logging
import socket

import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

from bus.core import spans
from bus.core.tracecontext import parse_traceparent
from node.observe.otlp import Exporter, Record, encode_request
from node.observe.recorder import TracerProvider
from node.observe.tracing import KeyedRatioSampler
from tests.otlp import Receiver

RESOURCE = {"service.name": "hero-node", "service.instance.id": "n" * 64}
PARENT = parse_traceparent(f"00-{'ab' * 16}-{'cd' * 8}-01")


def _decoded(body: bytes) -> list:  # noqa: ANN001 - protobuf Span messages
    request = ExportTraceServiceRequest.FromString(body)
    [rs] = request.resource_spans
    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert resource == RESOURCE
    return [(ss.scope.name, s) for ss in rs.scope_spans for s in ss.spans]


def test_a_record_encodes_to_the_otlp_message_of_its_span():
    attributes = {
        "text": "job:7:5",
        "count": 3,
        "negative": -2,
        "flag": True,
        "ratio": 0.5,
        "keys": ["job:7:5", "job:7:6"],
    }
    records = [
        Record(
            "hero.runner",
            "run queue:python",
            5,
            0xAB,
            0x12,
            0xCD,
            0x301,
            "k=v",
            1_000_000_001,
            1_000_000_900,
            attributes,
            [(0xEF, 0x34)],
            2,
            "exit:3",
        ),  # fmt: skip
        # the same keys with other values of other types: nothing is mixed up
        Record("hero.node", "admit msg_out", 1, 0xAB, 0x13, 0, 0x101, "", 5, 6, {"flag": 1}),
        Record("hero.node", "route msg_out", 1, 0xAB, 0x14, 0, 0x101, "", 5, 6, {"count": "3"}),
    ]
    (scope, run), (scope2, admit), (_, route) = _decoded(encode_request(RESOURCE, records))
    assert (scope, scope2) == ("hero.runner", "hero.node")
    assert run.trace_id == (0xAB).to_bytes(16, "big")
    assert (run.span_id.hex(), run.parent_span_id.hex()) == (f"{0x12:016x}", f"{0xCD:016x}")
    assert (run.name, run.kind, run.trace_state, run.flags) == ("run queue:python", 5, "k=v", 0x301)
    assert (run.start_time_unix_nano, run.end_time_unix_nano) == (1_000_000_001, 1_000_000_900)
    got = {}
    for a in run.attributes:
        kind = a.value.WhichOneof("value")
        value = getattr(a.value, kind)
        got[a.key] = [v.string_value for v in value.values] if kind == "array_value" else value
    assert got == attributes
    assert [(ln.trace_id.hex(), ln.span_id.hex()) for ln in run.links] == [
        (f"{0xEF:032x}", f"{0x34:016x}")
    ]
    assert (run.status.code, run.status.message) == (2, "exit:3")
    assert admit.parent_span_id == b""
    assert admit.attributes[0].value.WhichOneof("value") == "int_value"
    assert route.attributes[0].value.string_value == "3"


def _provider(ratio: float) -> tuple[TracerProvider, Exporter]:
    exporter = Exporter("http://127.0.0.1:9/v1/traces", RESOURCE)
    return TracerProvider(KeyedRatioSampler(ratio, b"k" * 32), exporter), exporter


def test_a_span_is_recorded_as_started_and_ended_and_a_dropped_one_stays_in_its_trace():
    provider, exporter = _provider(1.0)
    tracer = provider.get_tracer("hero.test")
    assert provider.get_tracer("hero.test") is tracer
    context = spans.remote_context(PARENT)
    span = tracer.start_span("verify msg_in", context, SpanKind.CONSUMER, {"a": 1}, start_time=7)
    assert span.is_recording()
    span.set_attribute("hero.outcome", "rejected")
    span.set_status(Status(StatusCode.ERROR, "bad_signature"))
    span.end(9)
    span.set_attribute("late", 1)  # after its end: not recorded
    span.end()  # a second end: nothing
    [record] = list(exporter.queue)
    assert f"{record.trace_id:032x}" == PARENT.trace_id
    assert f"{record.parent_id:016x}" == PARENT.parent_id
    assert (record.kind, record.start_ns, record.end_ns) == (5, 7, 9)
    assert record.attributes == {"a": 1, "hero.outcome": "rejected"}
    assert (record.status, record.status_message) == (2, "bad_signature")
    assert record.flags == 0x301  # sampled, its parent remote
    # a root of its own: a new trace
    root = tracer.start_span("send", None)
    assert root.get_span_context().trace_id != int(PARENT.trace_id, 16)
    exporter.shutdown()

    provider, exporter = _provider(0.0)
    dropped = provider.get_tracer("hero.test").start_span("admit msg_out", context)
    assert isinstance(dropped, NonRecordingSpan)
    ctx = dropped.get_span_context()
    assert ctx.is_valid  # a child of it, or the trace context passed on, stays in the trace
    assert ctx.trace_id == int(PARENT.trace_id, 16)
    assert not ctx.trace_flags.sampled
    dropped.end()
    assert not exporter.queue
    exporter.shutdown()


async def test_the_exporter_sends_batches_bounds_its_queue_and_survives_a_dead_receiver(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "3")
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        endpoint = await receiver.start(nursery)
        exporter = Exporter(endpoint, RESOURCE)
        for i in range(5):  # two past the queue's bound
            exporter.add(Record("hero.test", f"s{i}", 1, 1, i + 1, 0, 0x101, "", 1, 2, {}))
        assert exporter.dropped == 2
        with trio.fail_after(20):
            assert await trio.to_thread.run_sync(exporter.force_flush)
            await receiver.wait_for(lambda got: len(got) == 3)
        assert [s.name for s in receiver.spans] == ["s0", "s1", "s2"]
        assert exporter.sent == 3
        await trio.to_thread.run_sync(exporter.shutdown)
        nursery.cancel_scope.cancel()

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="node.observe.otlp")
    exporter = Exporter(f"http://127.0.0.1:{port}/v1/traces", RESOURCE)
    exporter.add(Record("hero.test", "lost", 1, 1, 1, 0, 0x101, "", 1, 2, {}))
    with trio.fail_after(20):
        assert await trio.to_thread.run_sync(exporter.force_flush)
    assert exporter.dropped == 1
    assert "1 spans not exported" in caplog.text
    await trio.to_thread.run_sync(exporter.shutdown)


async def test_a_span_that_cannot_be_encoded_is_dropped_and_the_exporter_goes_on():
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        exporter = Exporter(await receiver.start(nursery), RESOURCE)
        # a lone surrogate is no UTF-8: its batch fails to encode
        exporter.add(Record("hero.test", "bad", 1, 1, 1, 0, 0x101, "", 1, 2, {"k": "\udc80"}))
        with trio.fail_after(20):
            assert await trio.to_thread.run_sync(exporter.force_flush)
        assert exporter.dropped == 1
        exporter.add(Record("hero.test", "next", 1, 1, 2, 0, 0x101, "", 1, 2, {}))
        with trio.fail_after(20):
            assert await trio.to_thread.run_sync(exporter.force_flush)
            await receiver.wait_for(lambda got: [s.name for s in got] == ["next"])
        await trio.to_thread.run_sync(exporter.shutdown)
        nursery.cancel_scope.cancel()
