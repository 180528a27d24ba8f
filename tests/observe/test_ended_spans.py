"""Attempts the node ends itself have their spans (node/observe/ended_spans.py), exported by a
real node process to an OTLP receiver here: an external runner's attempts, answered by the
node's results service, and an attempt whose runner process was killed under it, ended by the
node's recovery of the slot (node/runners/recovery.py ``conclude``, which also concludes what
it adopts at start). Each is a CONSUMER span in the message's trace, with the id a runner's span
of that attempt would have had, the retry linked to the first; no script in any of it."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import trio

from bus.client.api import open_client
from bus.core.models import JobStatus
from bus.core.spans import attempt_span_id
from bus.core.tracecontext import parse_traceparent
from crypto import KeyPair, read_key_file
from node.config import render_config
from node.config.tracing import TracingConfig
from tests.nodeproc import NodeProcess
from tests.otlp import Receiver, Span
from tests.runners.test_runners import External

CANARY = "CANARY-EXTERNAL-SCRIPT-4e1"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Receiver:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the node exports every 0.1 s
    return Receiver()


@asynccontextmanager
async def exporting(node: NodeProcess, receiver: Receiver) -> AsyncIterator[KeyPair]:
    """``node`` started, exporting its spans to ``receiver``; yields its actor's key. The
    node is closed on the way out, whatever happened (shielded: a test's deadline may be
    what ends it; close bounds itself)."""
    try:
        async with trio.open_nursery() as nursery:
            endpoint = await receiver.start(nursery)
            node.config = replace(node.config, tracing=TracingConfig(endpoint=endpoint))
            node.config.config_path.write_text(render_config(node.config), encoding="utf-8")
            await node.start()
            yield read_key_file(node.config.actor_key_path)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await node.close()


@pytest.mark.slow
async def test_an_external_runner_s_attempts_are_spans_of_the_node(
    tmp_path: Path, receiver: Receiver
) -> None:
    node = NodeProcess(tmp_path / "a", "a", runners={"python": 1, "ext": 0})
    with trio.fail_after(90):
        async with exporting(node, receiver) as actor:
            async with open_client(node.redis_url) as client:
                ext = External(client.store, "ext-1", "ext")
                await ext.register()
                msg = await client.submit_job(
                    actor, 1, to="self", context_id=1, script_type="ext",
                    script=f"say {CANARY}", retries=1,
                )  # fmt: skip
                job, attempt = await ext.take()
                failed = {"stdout": CANARY, "exit_code": "3"}
                assert await ext.finish(job, attempt, "error", failed, "exit code 3") == 1
                job, attempt = await ext.take()  # the node's retry
                assert await ext.finish(job, attempt, "finished", {"stdout": "ok"}) == 1
                [result] = await client.wait_results(msg, timeout_s=30)
            assert (result.status, result.result["attempts"]) == (JobStatus.FINISHED, "2")
            trace = parse_traceparent(msg.traceparent)

            def ran(spans: list[Span]) -> list[Span]:
                return [
                    s for s in spans if s.name == "run queue:ext" and s.trace_id == trace.trace_id
                ]

            await receiver.wait_for(lambda spans: len(ran(spans)) == 2)
    first, second = sorted(ran(receiver.spans), key=lambda s: s.attributes["hero.attempt"])
    key = msg.job[0].key
    for number, span in enumerate((first, second), start=1):
        assert (span.node, span.kind, span.parent_id) == (node.node_id, "CONSUMER", trace.parent_id)
        assert span.span_id == f"{attempt_span_id(trace.trace_id, key, number):016x}"
        assert span.attributes["hero.job.key"] == key
        assert span.attributes["hero.ended_by"] == "node"
    assert (first.attributes["hero.outcome"], first.attributes["hero.reason"]) == (
        "retry",
        "exit:3",
    )
    assert second.attributes["hero.outcome"] == "finished"
    assert second.links == [(trace.trace_id, first.span_id)]  # a new span, linked to the first
    assert not any(CANARY.encode() in body for body in receiver.bodies)


def runner_pids(node_pid: int) -> list[int]:
    """The node's runner processes (``python -m node.worker``), from /proc."""
    found = []
    for task in Path(f"/proc/{node_pid}/task").iterdir():
        try:  # a thread or a child may end between the listing and its read
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"node.worker" in cmdline:
                found.append(int(child))
    return found


@pytest.mark.slow
async def test_an_attempt_its_runner_never_ended_is_a_span_of_the_node(
    tmp_path: Path, receiver: Receiver
) -> None:
    """The runner process killed while its job runs: the node recovers the slot, ends the
    attempt (``runner_lost``) and writes its span, which the runner never ended."""
    node = NodeProcess(tmp_path / "a", "a", runners={"python": 1, "sh": 0})
    work = node.config.home / "work" / "1"  # the job's work dir, the one place it sees
    work.mkdir(parents=True, exist_ok=True)
    fifo = work / "release"
    os.mkfifo(fifo, 0o666)
    script = f"# {CANARY}\nprint(open('release').read().strip())\n"
    with trio.fail_after(120):
        async with exporting(node, receiver) as actor:
            async with open_client(node.redis_url) as client:
                msg = await client.submit_job(
                    actor, 1, to="self", context_id=1, script_type="python", script=script
                )
                # opening the fifo returns once the job opened it: the job runs now
                writer = await trio.to_thread.run_sync(partial(open, fifo, "w"))
                assert node.proc is not None
                [runner] = runner_pids(node.proc.pid)
                os.kill(runner, signal.SIGKILL)
                [result] = await client.wait_results(msg, timeout_s=60)
                await trio.to_thread.run_sync(writer.close)
            assert result.status is JobStatus.ERROR, result
            assert result.reason.startswith("runner_lost"), result
            trace = parse_traceparent(msg.traceparent)

            def ended(spans: list[Span]) -> list[Span]:
                ours = (s for s in spans if s.trace_id == trace.trace_id)
                return [s for s in ours if s.name == "run queue:python"]

            await receiver.wait_for(lambda spans: bool(ended(spans)))
    [span] = ended(receiver.spans)
    key = msg.job[0].key
    assert (span.node, span.parent_id) == (node.node_id, trace.parent_id)
    assert span.span_id == f"{attempt_span_id(trace.trace_id, key, 1):016x}"
    assert span.attributes["hero.ended_by"] == "node"
    assert (span.attributes["hero.outcome"], span.attributes["hero.reason"]) == (
        "error",
        "runner_lost",
    )
    assert not any(CANARY.encode() in body for body in receiver.bodies)
