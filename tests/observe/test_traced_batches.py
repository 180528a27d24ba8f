"""A traced node's runners (issue 48): a slot still takes what is queued in batches, and each
job of a batch keeps its own attempt span, in its own message's trace, with its own times; the
trace context an attempt continues comes with the job's start (materialise copies it into the
job hash), so a traced runner reads no message hash per job, as an untraced one reads none."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bus.client.api import Client, new_job, open_client
from bus.core.models import Message
from bus.core.tracecontext import parse_traceparent
from crypto import Signer, read_key_file
from node.config import render_config
from node.config.tracing import TracingConfig
from tests.nodeproc import NodeProcess
from tests.otlp import Receiver, Span
from tests.scripts import announcing, wait_announced

K = 4  # the jobs of the batch, each in a message of its own


async def _prints(client: Client, actor: Signer, to: str, n: int) -> list[Message]:
    """``n`` one-job messages to node ``to``, each its own ``print(i)``, submitted in turn."""
    return [
        await client.submit_job(
            actor, 1, to=to, context_id=1, script_type="python", script=f"print({i})"
        )
        for i in range(n)
    ]


def _traced(node: NodeProcess, endpoint: str) -> None:
    node.config = replace(node.config, tracing=TracingConfig(endpoint=endpoint))
    node.config.config_path.write_text(render_config(node.config), encoding="utf-8")


def _times(receiver: Receiver) -> dict[str, tuple[int, int]]:
    """(start, end) in Unix ns of every span received, by span id."""
    found = {}
    for body in receiver.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found[s.span_id.hex()] = (s.start_time_unix_nano, s.end_time_unix_nano)
    return found


def _attempts(spans: list[Span], msgs: list[Message]) -> list[Span]:
    traces = {parse_traceparent(m.traceparent).trace_id for m in msgs}
    return [s for s in spans if s.name == "run queue:python" and s.trace_id in traces]


@pytest.mark.slow
async def test_each_job_of_a_traced_batch_has_its_own_attempt_span(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the node exports every 0.1 s
    receiver = Receiver()
    node = NodeProcess(tmp_path / "a", "a", runners={"python": 1})
    try:
        async with trio.open_nursery() as nursery:
            _traced(node, await receiver.start(nursery))
            with trio.fail_after(90):
                await node.start()
                actor = read_key_file(node.config.actor_key_path)
                async with open_client(node.redis_url) as client:
                    # the slot's only runner is held by a gate while K messages are queued
                    hold = announcing(node.redis_url, "gate", "import time\ntime.sleep(600)")
                    gate = await client.submit(
                        actor, 1, to=node.node_id, context_id=1,
                        jobs=[new_job(1, 1, "python", hold)],
                    )  # fmt: skip
                    pid = await wait_announced(client.store, "gate")
                    msgs = await _prints(client, actor, node.node_id, K)
                    keys = {m.key for m in msgs}

                    def queued(spans: list[Span]) -> bool:  # routed spans end once materialised
                        routed = [s for s in spans if s.name == "route msg_out"]
                        return keys <= {s.attributes["messaging.message.id"] for s in routed}

                    await receiver.wait_for(queued)
                    os.kill(pid, signal.SIGKILL)  # the gate ends: its end takes all K at once
                    results = [(await client.wait_results(m, timeout_s=60))[0] for m in msgs]
                    await client.wait_results(gate, timeout_s=60)
                    started = {
                        (await client.job_fields(1, m.job[0].key))["stats_started_ms"] for m in msgs
                    }
                await receiver.wait_for(lambda spans: len(_attempts(spans, msgs)) == K)
            nursery.cancel_scope.cancel()
    finally:
        await node.close()
    assert [r.stdout for r in results] == [f"{n}\n" for n in range(K)]
    assert len(started) == 1  # started in one script call: one batch
    times = _times(receiver)
    attempts = _attempts(receiver.spans, msgs)
    for msg in msgs:
        parent = parse_traceparent(msg.traceparent)
        [span] = [s for s in attempts if s.trace_id == parent.trace_id]
        assert span.parent_id == parent.parent_id  # its own message's trace
        assert span.kind == "CONSUMER"
        assert span.attributes["hero.job.key"] == msg.job[0].key
        assert span.attributes["messaging.message.id"] == msg.key
        assert span.attributes["hero.attempt"] == 1
        assert span.attributes["hero.outcome"] == "finished"
        [box] = [s for s in receiver.spans if s.name == "sandbox" and s.parent_id == span.span_id]
        assert box.attributes["hero.exit_code"] == 0
        start, end = times[span.span_id]
        box_start, box_end = times[box.span_id]
        assert start <= box_start <= box_end <= end  # its sandbox run within its attempt
    # each its own run: one after the other in the sandbox, no two alike
    runs = sorted(times[s.span_id] for s in attempts)
    assert len({start for start, _ in runs}) == K


async def _monitor(url: str, seen: list[bytes], ready: trio.Event) -> None:
    """Every command ``url``'s server runs, as MONITOR prints it (a command a script ran is
    marked ``lua]``), into ``seen``, until cancelled."""
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the embedded Valkey's socket, as the node (ACL)
        stream: trio.abc.Stream = await trio.open_unix_socket(parts.path)
    else:
        stream = await trio.open_tcp_stream(parts.hostname or "", parts.port or 6379)
    async with stream:
        if parts.password:
            await stream.send_all(f"AUTH {parts.username} {parts.password}\r\n".encode())
        await stream.send_all(b"MONITOR\r\n")
        data = b""
        while data.count(b"+OK\r\n") < (2 if parts.password else 1):
            data += await stream.receive_some()
        ready.set()
        try:
            while chunk := await stream.receive_some():
                data += chunk
        finally:
            seen.extend(data.split(b"\r\n"))


def _message_reads(seen: list[bytes]) -> tuple[int, int]:
    """The reads of a message hash MONITOR saw: (made by a script, made directly)."""
    verbs = (b'"HGETALL" "message:', b'"HMGET" "message:', b'"HGET" "message:')
    reads = [line for line in seen if any(verb in line for verb in verbs)]
    scripted = sum(b" lua]" in line for line in reads)
    return scripted, len(reads) - scripted


@pytest.mark.slow
async def test_a_traced_runner_reads_no_message_hash_per_job(tmp_path: Path, monkeypatch):
    """No job of a traced node has its message hash read outside a script (MONITOR of each
    node's own Valkey), as on an untraced one: the trace context comes with the job's start.
    The jobs are submitted together, so that the slot takes them in batches too. The message
    hashes the supervisor's pop script reads show that MONITOR saw the jobs go by."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    n = 12
    receiver = Receiver()
    traced, plain = NodeProcess(tmp_path / "t", "t"), NodeProcess(tmp_path / "p", "p")
    reads: dict[str, tuple[int, int]] = {}
    sent: dict[str, list[Message]] = {}
    try:
        async with trio.open_nursery() as nursery:
            _traced(traced, await receiver.start(nursery))
            with trio.fail_after(90):
                await traced.start()
                await plain.start()
                for node in (traced, plain):
                    actor = read_key_file(node.config.actor_key_path)
                    async with open_client(node.redis_url) as client:
                        warm = await client.submit_job(
                            actor, 1, to=node.node_id, context_id=1, script_type="python",
                            script="print('warm')",
                        )  # fmt: skip
                        await client.wait_results(warm, timeout_s=60)
                        seen: list[bytes] = []
                        async with trio.open_nursery() as watch:
                            ready = trio.Event()
                            watch.start_soon(_monitor, node.redis_url, seen, ready)
                            await ready.wait()
                            msgs = await _prints(client, actor, node.node_id, n)
                            for msg in msgs:
                                [result] = await client.wait_results(msg, timeout_s=60)
                                assert result.ok, result
                            watch.cancel_scope.cancel()
                        reads[node.name] = _message_reads(seen)
                        sent[node.name] = msgs
                # the traced node's jobs were traced: an attempt span each
                await receiver.wait_for(lambda spans: len(_attempts(spans, sent["t"])) == n)
            nursery.cancel_scope.cancel()
    finally:
        await traced.close()
        await plain.close()
    # one read of its message per job, by the runner, would show n direct reads
    for name, (scripted, direct) in reads.items():
        assert scripted >= n, (name, reads)
        assert direct == 0, (name, reads)
