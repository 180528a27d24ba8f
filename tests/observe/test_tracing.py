"""Tracing (node/observe/tracing.py, issue 48): a cross-node job's spans, exported over OTLP/HTTP
by two real node processes to a receiver here, form one trace parented on the client's PRODUCER
span, each on its node, with no script, env value or output anywhere in what was exported; a
node with tracing off exports nothing; a malformed trace context is dropped, counted, and the
job runs all the same; the sampler cannot be steered by the sender."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from opentelemetry import context as otel_context
from opentelemetry import trace as otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bus.client.api import open_client
from bus.core.envelope import sign_message
from bus.core.flows import FlowJobPayload
from bus.core.models import FlowStatus, JobStatus, Message, MessageType, RunnerJob
from bus.core.spans import DROPPED, message_attributes, remote_context
from bus.core.tracecontext import parse_traceparent
from bus.store import records
from crypto import read_key_file
from node.config import render_config
from node.config.tracing import TracingConfig, parse_tracing
from node.errors import ConfigError
from node.observe.tracing import KeyedRatioSampler
from tests.intake.test_rejections import job_message, push_in
from tests.nodeproc import NodeProcess
from tests.otlp import Receiver, Span

CANARIES = ("CANARY-SCRIPT-7d1", "CANARY-ENV-5b2", "CANARY-OUT-9c3")
SCRIPT = f"# {CANARIES[0]}\nimport os\nprint('{CANARIES[2]}', os.environ.get('SECRET', ''))\n"
# fails its first attempt (and says so on both outputs), leaving a marker in its work dir
RETRIED = (
    f"# {CANARIES[0]}\nimport os, sys\n"
    "marker = os.path.join(os.environ['HOME'], 'tried-once')\n"
    "if not os.path.exists(marker):\n"
    "    open(marker, 'w').close()\n"
    f"    print('{CANARIES[2]}'); print('{CANARIES[2]}', file=sys.stderr); sys.exit(3)\n"
    f"print('{CANARIES[2]}', os.environ.get('SECRET', ''))\n"
)


def _traced(node: NodeProcess, endpoint: str) -> None:
    node.config = replace(node.config, tracing=TracingConfig(endpoint=endpoint))
    node.config.config_path.write_text(render_config(node.config), encoding="utf-8")


@pytest.fixture
async def nodes(tmp_path: Path):
    made: list[NodeProcess] = []

    def make(name: str, **init: object) -> NodeProcess:
        made.append(NodeProcess(tmp_path / name, name, **init))
        return made[-1]

    yield make
    for node in made:
        await node.close()


@pytest.fixture
def client_tracer(monkeypatch):
    """The test process as an application that set up OpenTelemetry around the client (its
    spans kept in memory); the global provider is put back after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel, "_TRACER_PROVIDER", provider)
    return provider.get_tracer("test"), exporter


async def _wire(a: NodeProcess, b: NodeProcess) -> None:
    """B knows A (which dials it) and A's actor (1) as an executor of its context 1."""
    actor = read_key_file(a.config.actor_key_path)
    async with open_client(a.redis_url) as ca:
        await ca.add_peer(b.node_id, b.ws_url, name="b")
    async with open_client(b.redis_url) as cb:
        await cb.add_peer(a.node_id, "", name="a")
        await cb.register_actor(1, actor.public_hex)
        await cb.register_context(1, admins=[b.config.actor_id], executors=[1])


def _one(spans: list[Span], node: str, name: str, trace_id: str) -> Span | None:
    found = [s for s in spans if s.node == node and s.name == name and s.trace_id == trace_id]
    return found[0] if found else None


@pytest.mark.slow
async def test_a_cross_node_job_is_one_trace_across_both_nodes(nodes, client_tracer, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the nodes export every 0.1 s
    tracer, exported = client_tracer
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        endpoint = await receiver.start(nursery)
        a, b = nodes("a"), nodes("b", actor_id=2)
        _traced(a, endpoint)
        _traced(b, endpoint)
        with trio.fail_after(120):
            await a.start()
            await b.start()
            await _wire(a, b)
            actor = read_key_file(a.config.actor_key_path)
            caller = tracer.start_span("caller")
            token = otel_context.attach(otel.set_span_in_context(caller))
            try:
                async with open_client(a.redis_url) as client:
                    msg = await client.submit_job(
                        actor,
                        1,
                        to=b.node_id,
                        context_id=1,
                        script_type="python",
                        script=RETRIED,
                        env_vars={"SECRET": CANARIES[1]},
                        retries=1,
                    )
                    [result] = await client.wait_results(msg, timeout_s=60)
            finally:
                otel_context.detach(token)
                caller.end()
            assert result.status is JobStatus.FINISHED, result
            assert result.result["attempts"] == "2"  # failed once, retried
            assert CANARIES[2] in result.stdout
            assert CANARIES[1] in result.stdout  # the canaries did reach the job

            # the client's PRODUCER span, a child of its caller's, is the message's parent
            [producer] = [s for s in exported.get_finished_spans() if s.name == "submit msg_out"]
            assert producer.kind is otel.SpanKind.PRODUCER
            assert producer.parent.span_id == caller.get_span_context().span_id
            parent = parse_traceparent(msg.traceparent)
            assert int(parent.parent_id, 16) == producer.context.span_id
            trace_id = parent.trace_id

            hops = {
                (a.node_id, "admit msg_out"): ("CONSUMER", True),
                (a.node_id, "route msg_out"): ("INTERNAL", True),
                (a.node_id, f"send {b.node_id[:16]}"): ("PRODUCER", False),
                (b.node_id, f"receive {a.node_id[:16]}"): ("CONSUMER", False),
                (b.node_id, "verify msg_in"): ("CONSUMER", True),
                (b.node_id, "materialise msg_in"): ("INTERNAL", True),
            }

            def complete(spans: list[Span]) -> bool:
                named = {(s.node, s.name) for s in spans}
                parented = {(s.node, s.name) for s in spans if s.trace_id == trace_id}
                ran = [s for s in spans if s.name == "run queue:python" and s.trace_id == trace_id]
                boxes = [s for s in spans if s.name == "sandbox" and s.trace_id == trace_id]
                return (
                    all(
                        (hop in parented) if child else (hop in named)
                        for hop, (_, child) in hops.items()
                    )
                    and len(ran) == 2
                    and len(boxes) == 2
                    and (a.node_id, "apply msg_in") in parented
                )

            await receiver.wait_for(complete)

        for (node_id, name), (kind, child) in hops.items():
            spans = [s for s in receiver.spans if s.node == node_id and s.name == name]
            if child:  # a child of the client's span, on the node that did the hop
                span = _one(receiver.spans, node_id, name, trace_id)
                assert span is not None, name
                assert span.parent_id == parent.parent_id, name
                assert span.attributes["messaging.message.id"] == msg.key
                assert span.attributes["hero.node.id"] == node_id
                assert span.attributes["hero.job.keys"] == [msg.job[0].key]
            else:  # a frame's span, linked to the message it carried
                span = next(s for s in spans if (trace_id, parent.parent_id) in s.links)
                assert span.attributes["messaging.batch.message_count"] >= 1
            assert span.kind == kind, name
        admitted = _one(receiver.spans, a.node_id, "admit msg_out", trace_id)
        assert admitted is not None
        assert admitted.attributes["hero.outcome"] == "admitted"
        routed = _one(receiver.spans, a.node_id, "route msg_out", trace_id)
        assert routed is not None
        assert routed.attributes["hero.outcome"] == "outbox"
        _check_attempts(receiver.spans, b.node_id, trace_id, parent.parent_id, msg)
        # the result's way back: applied at the origin, in the request's trace
        applied = _one(receiver.spans, a.node_id, "apply msg_in", trace_id)
        assert applied is not None
        assert applied.parent_id == parent.parent_id
        assert applied.attributes["hero.job.key"] == msg.job[0].key
        assert applied.attributes["hero.outcome"] == "applied"
        # the client's wait, a child of its PRODUCER span, in the test process
        [wait] = [s for s in exported.get_finished_spans() if s.name == "wait reply"]
        assert wait.parent.span_id == producer.context.span_id
        assert wait.context.trace_id == int(trace_id, 16)
        assert wait.attributes["hero.outcome"] == "answered"
        assert wait.attributes["messaging.message.id"] == msg.key
        # nothing a job carries or makes is in any span, attribute or resource exported
        for body in receiver.bodies:
            for canary in CANARIES:
                assert canary.encode() not in body
        client_side = repr([dict(s.attributes or {}) for s in exported.get_finished_spans()])
        assert not any(canary in client_side for canary in CANARIES)
        nursery.cancel_scope.cancel()


def _check_attempts(
    spans: list[Span], node_id: str, trace_id: str, producer_id: str, msg: Message
) -> None:
    """Two attempt spans on the node that ran them, children of the message's trace, the
    retry linked to the first; each with its sandbox run as a child."""
    ran = sorted(
        (s for s in spans if s.name == "run queue:python" and s.trace_id == trace_id),
        key=lambda s: int(s.attributes["hero.attempt"]),  # type: ignore[call-overload]
    )
    assert [s.attributes["hero.attempt"] for s in ran] == [1, 2]
    first, second = ran
    for span in ran:
        assert span.node == node_id
        assert span.kind == "CONSUMER"
        assert span.parent_id == producer_id
        assert span.attributes["hero.job.key"] == msg.job[0].key
        assert span.attributes["messaging.message.id"] == msg.key
        assert span.attributes["hero.node.id"] == node_id
        assert span.attributes["hero.caller.id"] == 1
        assert span.attributes["hero.context.id"] == 1
        [box] = [s for s in spans if s.name == "sandbox" and s.parent_id == span.span_id]
        assert box.node == node_id
        assert box.trace_id == trace_id
    assert first.attributes["hero.outcome"] == "retry"
    assert first.attributes["hero.reason"] == "exit:3"
    assert second.attributes["hero.outcome"] == "finished"
    assert first.links == []
    assert second.links == [(trace_id, first.span_id)]  # a new span, linked, not collapsed


@pytest.mark.slow
async def test_a_node_with_tracing_off_exports_nothing(nodes, monkeypatch):
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        endpoint = await receiver.start(nursery)
        # even with the SDK's own variables pointing at the receiver: off is off
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        a = nodes("a")
        with trio.fail_after(90):
            await a.start()
            actor = read_key_file(a.config.actor_key_path)
            async with open_client(a.redis_url) as client:
                msg = await client.submit_job(
                    actor,
                    1,
                    to="self",
                    context_id=1,
                    script_type="python",
                    script=RETRIED,
                    retries=1,
                )
                [result] = await client.wait_results(msg, timeout_s=60)
            assert result.status is JobStatus.FINISHED
            assert result.result["attempts"] == "2"  # the runner's retry path ran, untraced
            assert msg.traceparent  # the message is traced by its client all the same
            assert await a.signal_and_wait() == 0  # a stopping node flushes what it has
        assert receiver.bodies == []
        assert "tracing:" not in a.log.read_text()
        nursery.cancel_scope.cancel()


async def test_a_malformed_trace_context_is_dropped_counted_and_the_job_runs(node_factory, caplog):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    caplog.set_level(logging.WARNING, logger="bus.core.spans")
    bad = {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "tracestate": "k=v"}
    for queue, fields in (("msg_out", bad), ("msg_in", {"traceparent": "x" * 300})):
        msg = job_message(actor, 1, alice.node_id, alice.node_id, "print('ran')")
        msg = sign_message(replace(msg, **fields), actor)  # signed as the actor wrote it
        await push_in(alice, msg, queue=queue)
        with trio.fail_after(30):
            [result] = await alice.client.wait_results(msg, timeout_s=30)
        assert result.status is JobStatus.FINISHED, result
        assert result.stdout == "ran\n"
    counters = alice.info.state.counters.metrics
    assert counters[DROPPED + "bad_traceparent"] == 2
    assert DROPPED + "bad_tracestate" not in counters  # dropped with its traceparent, once
    dropped = [r for r in caplog.records if "trace context dropped" in r.getMessage()]
    assert len(dropped) == 2
    assert "trace id is all zeros" in dropped[0].getMessage()
    assert await alice.store.dead_letters(1) == []


def test_the_sampler_is_the_node_s_not_the_sender_s():
    key = b"k" * 32
    every, none, half = (KeyedRatioSampler(r, key) for r in (1.0, 0.0, 0.5))
    ids = [int.from_bytes(bytes([i]) * 16, "big") for i in range(1, 200)]
    assert all(every.records(t) for t in ids)
    assert not any(none.records(t) for t in ids)
    assert 40 < sum(half.records(t) for t in ids) < 160
    # the trace ids a TraceIdRatioBased sampler would keep at 0.5 (low 64 bits small) are not
    # the ones kept here, and another key keeps others: choosing an id forces nothing
    low = [t for t in ids if t & (2**64 - 1) < 2**63]
    assert not all(half.records(t) for t in low)
    other = KeyedRatioSampler(0.5, b"o" * 32)
    assert [half.records(t) for t in ids] != [other.records(t) for t in ids]
    # the sender's sampled flag decides nothing
    for flags in ("00", "01"):
        parent = parse_traceparent(f"00-{'ab' * 16}-{'cd' * 8}-{flags}")
        verdict = none.should_sample(remote_context(parent), int(parent.trace_id, 16), "x")
        assert not verdict.decision.is_sampled()


def test_the_tracing_table_is_off_by_default_and_checked():
    assert not parse_tracing({}).enabled
    on = parse_tracing({"endpoint": "http://127.0.0.1:4318/v1/traces", "sampling_ratio": 0.25})
    assert on.enabled
    assert on.sampling_ratio == 0.25
    for bad in (
        {"sampling_ratio": 1.5},
        {"sampling_ratio": True},
        {"endpoint": "udp://x"},
        {"service_name": ""},
        {"exporter": "zipkin"},
    ):
        with pytest.raises(ConfigError):
            parse_tracing(bad)


async def test_every_job_of_a_flow_and_a_stop_continue_the_caller_s_trace(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    caller = TracerProvider().get_tracer("test").start_span("caller")  # not installed: the
    # client reads the caller's current span all the same
    expected = caller.get_span_context()
    token = otel_context.attach(otel.set_span_in_context(caller))
    try:
        spec = {
            "jobs": [
                {"id": "A", "node": "self", "context": 1, "type": "python", "script": "print(1)"},
                {
                    "id": "B",
                    "node": "self",
                    "context": 1,
                    "type": "python",
                    "script": "print(2)",
                    "depends": ["A"],
                },
            ]
        }
        with trio.fail_after(60):
            flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
            state = await alice.client.wait_flow(flow_id, 1, timeout_s=55)
            msg = await alice.client.submit_job(
                actor, 1, to="self", context_id=1, script_type="python", script="print(3)"
            )
            await alice.client.wait_results(msg, timeout_s=30)
            stop = await alice.client.stop_job(actor, 1, msg.job[0].key, 1)
    finally:
        otel_context.detach(token)
    assert state.status is FlowStatus.FINISHED
    for flow_job in state.jobs:  # each released flow_job message, signed by the node
        fields = await alice.client.job_fields(1, flow_job.job_key)
        carried = await records.read_message(alice.store, 1, fields["message_key"])
        assert carried["message_type"] == "flow_job"
        parent = parse_traceparent(carried["traceparent"])
        assert int(parent.trace_id, 16) == expected.trace_id
        assert int(parent.parent_id, 16) == expected.span_id
    assert parse_traceparent(msg.traceparent).trace_id == f"{expected.trace_id:032x}"
    assert stop.traceparent == msg.traceparent  # the stop joins its job's trace
    assert not any(k.startswith(DROPPED) for k in alice.info.state.counters.metrics)


def test_a_message_span_names_keys_and_ids_never_content():
    job = RunnerJob(
        id=5,
        caller_id=7,
        context_id=1,
        script=CANARIES[0],
        script_type="python",
        env_vars={"SECRET": CANARIES[1]},
    )
    doc = {"id": 99, "jobs": [{"id": "A", "script": CANARIES[0]}], "env_vars": {"K": CANARIES[1]}}
    payload = FlowJobPayload(doc, [], "A", {"B": {"stdout": CANARIES[2]}})
    message = Message(
        id=3,
        caller_id=7,
        context_id=1,
        message=payload.encode(),
        message_type=MessageType.FLOW_JOB,
        job=[job],
        origin="a" * 64,
        destination="b" * 64,
    )
    attributes = message_attributes("n" * 64, 1, message)
    assert attributes["messaging.message.id"] == "message:7:3"
    assert attributes["hero.job.keys"] == ["job:7:5"]
    assert attributes["hero.flow.id"] == "99"
    assert attributes["hero.node.id"] == "n" * 64
    assert not any(c in repr(attributes) for c in CANARIES)
