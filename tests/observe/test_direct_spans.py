"""The node's provider records the bus's spans directly (node/observe/recorder.py
``TracerProvider.record``: a message's trace context as ints, attributes in shared groups,
each encoded once), not through the OpenTelemetry API. What it exports for a traced job's spans
decodes (tests/otlp.py) to exactly what the API path of the same provider exports for them:
names, kinds, parents, links, attributes, flags, trace state, status, times. A trace the
sampler drops records nothing either way, and a message's group stays that message's."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace as otel
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.otlp import Kept
from bus.core import spans
from bus.core.attempts import Outcome
from bus.core.flows import FlowJobPayload
from bus.core.models import JobStatus, Message, MessageType, RunnerJob
from bus.core.tracecontext import NO_TRACE, message_trace
from node.observe.otlp import encode_request
from node.observe.recorder import TracerProvider
from node.observe.tracing import KeyedRatioSampler
from node.slot.spec import RunnerSpec
from node.worker import spans as worker_spans
from tests.otlp import Receiver

NODE = "n" * 64
RESOURCE = {"service.name": "hero-node", "service.instance.id": NODE}
TRACEPARENT = f"00-{'ab' * 16}-{'cd' * 8}-01"


class ThroughTheApi(TracerProvider):
    """The same provider, its spans started through the API's Tracer.start_span."""

    records_directly = False


@contextmanager
def installed(provider: TracerProvider, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(otel, "_TRACER_PROVIDER", provider)
        yield


def spec() -> RunnerSpec:
    return RunnerSpec(
        "unix:///nowhere", 1, "python", 2, [], "g", "t", 1000, "/tmp", 100, 60, NODE, True, 16,
        sandbox={"mode": "bwrap"},
    )  # fmt: skip


def messages() -> list[Message]:
    jobs = [RunnerJob(5, 7, 1, "print(1)", "python", message_key="message:7:3")]
    jobs.append(RunnerJob(6, 7, 1, "print(2)", "python", message_key="message:7:3"))
    flow = FlowJobPayload({"id": 99, "jobs": [{"id": "A", "script": "x"}]}, [], "A", {})
    return [
        Message(3, 7, 1, job=jobs, origin=NODE, destination=NODE, traceparent=TRACEPARENT,
                tracestate="b=2, a=1"),
        Message(4, 7, 1, message=flow.encode(), message_type=MessageType.FLOW_JOB, job=jobs[:1],
                origin=NODE, destination="p" * 64),
    ]  # fmt: skip


def job_spans() -> None:
    """A traced job's spans, as the services start and end them (fixed times where the
    services give one)."""
    for message in messages():
        trace = message_trace(message.traceparent, message.tracestate)
        admit = spans.start_message_span(
            "hero.node", "admit msg_out", "CONSUMER", NODE, 1, message, trace, "msg_out"
        )
        spans.end(admit, "admitted")
        route = spans.start_message_span(
            "hero.node", "route msg_out", "INTERNAL", NODE, 1, message, trace, "msg_out"
        )
        spans.end(route, "local", attributes={spans.PEER: message.destination})
    failed = spans.start_message_span(
        "hero.node", "verify msg_in", "CONSUMER", NODE, 1, message, NO_TRACE, "msg_in"
    )
    spans.end_error(failed, type("Refused", (Exception,), {"reason": "bad_signature"})())
    message = messages()[0]
    fields = {"queue": "queue:python"}
    outcomes = (
        (1, Outcome(JobStatus.ERROR, {}, "timeout")),
        (2, Outcome(JobStatus.FINISHED, {"exit_code": "0"})),
    )
    for attempt, outcome in outcomes:
        times = (1000.0 + attempt, 1000.5 + attempt, 1000.75 + attempt)
        ended = "retry" if attempt == 1 else "finished"
        job = message.job[0]
        worker_spans.ran_attempt(spec(), (job, fields, message, attempt), outcome, times, ended)
    # an attempt the node ended (node/observe/ended_spans.py): its attributes a plain dict
    trace = message_trace(message.traceparent, message.tracestate)
    node_ended = {spans.CONTEXT: 1, spans.NODE: NODE, "hero.ended_by": "node"}
    span = spans.start_attempt(
        "hero.node", message.job[1], 1, trace, "queue:python", node_ended, 1234.5
    )
    spans.end(span, "error", "runner_lost", end_time_s=1240.0)


def exported(provider_type: type[TracerProvider], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    kept = Kept()
    with installed(provider_type(KeyedRatioSampler(1.0, b"k" * 32), kept), monkeypatch):
        random.seed(48)
        job_spans()
    # the direct path is the one taken when the provider offers it: its records share groups
    assert all(bool(r.shared) == provider_type.records_directly for r in kept)
    body = encode_request(RESOURCE, kept)
    receiver = Receiver()
    receiver.received(body)
    request = ExportTraceServiceRequest.FromString(body)
    raw = [s for ss in request.resource_spans[0].scope_spans for s in ss.spans]
    names = {s.span_id: s.name for s in receiver.spans}  # random ids: named by their span
    out = []
    for decoded, span in zip(receiver.spans, raw, strict=True):
        assert span.name == decoded.name
        times = (span.start_time_unix_nano, span.end_time_unix_nano)
        fixed = decoded.name.startswith(("run ", "sandbox"))
        out.append(
            (
                decoded.name,
                decoded.kind,
                decoded.trace_id if decoded.trace_id.startswith("abab") else "new",
                names.get(decoded.parent_id, decoded.parent_id),
                decoded.span_id if decoded.name.startswith("run ") else "",  # derived ids
                decoded.attributes,
                decoded.links,
                (span.flags, span.trace_state, span.status.code, span.status.message),
                times if fixed else (),
            )
        )
    return sorted(out, key=repr)


def test_the_direct_path_exports_what_the_api_path_does(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = exported(TracerProvider, monkeypatch)
    assert direct == exported(ThroughTheApi, monkeypatch)
    # what both record: each span named, parented, linked, attributed as the services mean
    by = {(s[0], s[3], s[5].get("hero.job.key"), s[5].get("hero.attempt")): s for s in direct}
    assert len(direct) == 10  # admit, route x2; a refused verify; 2 attempts + 2 sandboxes; 1
    admit = by["admit msg_out", "cdcdcdcdcdcdcdcd", None, None]
    assert admit[5]["hero.job.keys"] == ["job:7:5", "job:7:6"]
    assert admit[5]["messaging.system"] == "hero-bus"
    assert admit[7][:2] == (0x301, "b=2,a=1")  # sampled, its parent remote; the state as given
    flow_route = next(s for s in direct if s[0] == "route msg_out" and s[2] == "new")
    assert (flow_route[5]["hero.flow.id"], flow_route[5]["hero.peer.id"]) == ("99", "p" * 64)
    assert by["verify msg_in", "", None, None][7][2:] == (2, "bad_signature")
    second = by["run queue:python", "cdcdcdcdcdcdcdcd", "job:7:5", 2]
    first = by["run queue:python", "cdcdcdcdcdcdcdcd", "job:7:5", 1]
    assert second[6] == [(first[2], first[4])]  # a retry links to the first attempt
    assert (first[5]["hero.reason"], first[5]["hero.slot"]) == ("timeout", "python:2")
    sandbox = next(s for s in direct if s[0] == "sandbox" and s[5]["hero.outcome"] == "exited")
    assert (sandbox[3], sandbox[5]["hero.exit_code"]) == ("run queue:python", 0)
    ended = by["run queue:python", "cdcdcdcdcdcdcdcd", "job:7:6", 1]
    assert (ended[5]["hero.ended_by"], ended[5]["hero.reason"]) == ("node", "runner_lost")


def test_a_dropped_trace_records_nothing_and_stays_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = Kept()
    with installed(TracerProvider(KeyedRatioSampler(0.0, b"k" * 32), kept), monkeypatch):
        message = messages()[0]
        trace = message_trace(message.traceparent, message.tracestate)
        admit = spans.start_message_span(
            "hero.node", "admit msg_out", "CONSUMER", NODE, 1, message, trace, "msg_out"
        )
        job = message.job[0]
        attempt = worker_spans.attempt_span(spec(), job, {}, message, 1)
        sandbox = worker_spans.sandbox_span(spec(), attempt, job.key)
        for span in (admit, attempt, sandbox):
            assert not span.is_recording()
            context = span.get_span_context()
            assert (f"{context.trace_id:032x}", context.is_valid) == ("ab" * 16, True)
            assert context.trace_state.to_header() == "b=2,a=1"
            spans.end(span, "done")
        assert sandbox.get_span_context().span_id != attempt.get_span_context().span_id
    assert kept == []


def test_a_message_group_is_its_own_message_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two messages of one key alive at once (one key in two contexts, a refused copy) never
    share what their spans say: the group is the message object's."""
    kept = Kept()
    with installed(TracerProvider(KeyedRatioSampler(1.0, b"k" * 32), kept), monkeypatch):
        one = messages()[0]
        other = Message(3, 7, 1, job=one.job[:1], origin=NODE, destination=NODE)
        for message in (one, other):
            span = spans.start_message_span(
                "hero.node", "admit msg_out", "CONSUMER", NODE, 1, message, NO_TRACE, "msg_out"
            )
            spans.end(span, "admitted")
    receiver = Receiver()
    receiver.received(encode_request(RESOURCE, kept))
    got = [s.attributes["hero.job.keys"] for s in receiver.spans]
    assert got == [["job:7:5", "job:7:6"], ["job:7:5"]]
