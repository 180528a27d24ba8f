"""Case 10: what tracing costs (issue 48): off, as every node runs by default, and on, with
every trace recorded (sampling 1.0) and exported over OTLP/HTTP to a receiver in this process;
and on at sampling 0.1, for scale.

Three nodes side by side, each alone, alike but for ``[tracing]``: the same local throughput
run (case 1's) on each, alternated run by run so that a noisy machine hurts all alike. Rows:

- jobs/s of each, and each traced one / off (the target: on 1.0 costs <= 5 %, so >= 95 %);
- tracing **off** against no tracing code at all cannot be run side by side (there is no such
  node), so its cost is measured where it is paid: each hop's off path (one ``recording()``
  check in ``spans.start``, an ``end(None)``) timed here, times the spans a traced job makes
  (counted at the receiver), against the CPU a job costs the node (its process and its job
  processes) in the off runs. Target: <= 1 % (below what any run-to-run spread can show);
- spans exported per job, the CPU per job of each node, and where a traced job's extra CPU
  goes (the node's process, its runner processes, the sandboxes).

The receiver answers every export at once and keeps the bodies, decoded after the runs, so
that it costs the bench client (on the same cores) as little as it can. The traced node is
stopped before the spans are counted: its runners and itself flush what they hold on exit.
Each traced node exports to a receiver of its own.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import trio

from bench.cases import Env, bench_client, roundtrips, run_throughput
from bench.harness import RUNNERS, BenchNode, Row, wait_served, wire
from bench.otlp import Kept, Sink
from bus.core import spans
from node.config import load_config, render_config
from node.config.tracing import TracingConfig
from node.host.home import init_home

CASE = "10 tracing"
OFF, ON = "off", "on 1.0"
RATIOS = {OFF: 0.0, ON: 1.0, "on 0.1": 0.1}  # label -> sampling ratio (0: tracing off)
OFF_CALLS = 200_000  # off-path span calls timed for the per-call cost
ON_JOBS = 5_000  # local jobs' spans recorded and encoded for the per-job cost on
# where a traced job's CPU goes: the node's process, its runner processes, the sandboxes
SPLIT = ("node", "node job processes: runners", "node job processes: sandboxes")


async def _node(env: Env, name: str, endpoint: str, ratio: float) -> BenchNode:
    home = env.base / name
    init_home(home, name=name, listen_port=0, runners=RUNNERS, console_listen="")
    if endpoint:
        tracing = TracingConfig(endpoint=endpoint, sampling_ratio=ratio)
        config = replace(load_config(home), tracing=tracing)
        config.config_path.write_text(render_config(config), encoding="utf-8")
    node = await env.procs.start_node(env.nursery, name, home)
    await wire([node], env.actor)
    return node


def off_call_ns() -> float:
    """The off path of one hop's span, in ns: a start that returns None, an end of None."""
    if spans.recording():  # pragma: no cover - the bench process installs no provider
        raise RuntimeError("a tracer provider is installed in the bench process")
    attributes = {spans.JOB_KEY: "job:1:1", spans.CONTEXT: 1}
    t0 = time.perf_counter_ns()
    for _ in range(OFF_CALLS):
        spans.end(spans.start("bench", "run queue:python", "CONSUMER", attributes=attributes))
    return (time.perf_counter_ns() - t0) / OFF_CALLS


def on_job_us() -> float:
    """The CPU (this process's, in µs) that a local job's 4 spans cost on the node's provider
    (node/observe/recorder.py): the node's two message spans (admit, route) as the supervisor
    starts and ends them, the runner's attempt and sandbox spans as a slot's batch records them
    (node/worker/spans.py ``ran_attempt``, the request's trace context parsed), and their OTLP
    encoding as the exporter's thread does it (node/observe/otlp.py), each 512 let go. In CPU
    time, so that a machine busy with other work inflates it less than the throughput runs.
    The process's heap is frozen first, as the node's and its runners' are at start
    (node/host/heap.py): the collections the spans' objects set off walk what was made since,
    not the bench's own ~100,000 objects (which cost this row 7-8 µs a job)."""
    import gc

    from opentelemetry import trace as otel

    from bus.core.attempts import Outcome
    from bus.core.models import JobStatus, Message, RunnerJob
    from bus.core.tracecontext import message_trace, new_traceparent
    from node.host.heap import freeze_start_heap
    from node.observe.otlp import encode_request
    from node.observe.recorder import TracerProvider
    from node.observe.tracing import KeyedRatioSampler
    from node.slot.spec import RunnerSpec
    from node.worker.spans import ran_attempt

    freeze_start_heap()
    kept = Kept()
    provider = TracerProvider(KeyedRatioSampler(1.0, b"k" * 32), kept)
    node = "n" * 64
    job = RunnerJob(1, 1, 1, "print(1)", "python", message_key="message:1:1")
    spec = RunnerSpec(
        "unix:///bench", 1, "python", 0, [], "g", "t", 1000, "/tmp", 1, 60, node, True, 16,
        sandbox={"mode": "bwrap"},
    )  # fmt: skip
    fields = {"queue": "queue:python"}
    outcome = Outcome(JobStatus.FINISHED, {"exit_code": "0"})
    now = time.time()
    requests = [
        Message(1, 1, 1, job=[job], origin=node, destination=node, traceparent=new_traceparent())
        for _ in range(ON_JOBS)
    ]
    # as the node judged them (with tracing off it checks their form, at the same cost)
    traces = [message_trace(m.traceparent, "") for m in requests]
    saved = otel._TRACER_PROVIDER
    otel._TRACER_PROVIDER = provider
    try:
        t0 = time.process_time()
        for message, trace in zip(requests, traces, strict=True):
            admit = spans.start_message_span(
                "hero.node", "admit msg_out", "CONSUMER", node, 1, message, trace, "msg_out"
            )
            spans.end(admit, "admitted")
            route = spans.start_message_span(
                "hero.node", "route msg_out", "INTERNAL", node, 1, message, trace, "msg_out"
            )
            spans.end(route, "local", attributes={spans.PEER: node})
            times = (now, now + 0.001, now + 0.002)
            ran_attempt(spec, (job, fields, message, 1), outcome, times, "finished")
            if len(kept) >= 512:  # a batch of the exporter's, encoded and let go
                encode_request({"service.name": "hero-node"}, kept)
                kept.clear()
        encode_request({"service.name": "hero-node"}, kept)
        return (time.process_time() - t0) * 1e6 / ON_JOBS
    finally:
        otel._TRACER_PROVIDER = saved
        gc.unfreeze()


def _node_cpu_ms(cpu: dict[str, float], n: int) -> float:
    """The node's CPU per job (ms): its own process and its job processes."""
    return (cpu.get("node", 0.0) + cpu.get("node job processes", 0.0)) * 1000 / n


async def case_tracing(env: Env) -> list[Row]:
    sinks = {label: Sink() for label, ratio in RATIOS.items() if ratio}
    nodes: dict[str, BenchNode] = {}
    async with trio.open_nursery() as nursery:
        try:
            for label, ratio in RATIOS.items():
                endpoint = await sinks[label].start(nursery) if ratio else ""
                nodes[label] = await _node(env, f"trace-{label.replace(' ', '-')}", endpoint, ratio)
            rows, jobs = await _measure(env, nodes)
        finally:
            for node in nodes.values():
                await env.procs.stop_node(node)  # a traced one flushes its spans
        nursery.cancel_scope.cancel()
    per_job = {label: sink.span_count() / jobs[label] for label, sink in sinks.items()}
    off_ns = off_call_ns()
    off_us = per_job[ON] * off_ns / 1000
    cpu_off = next(r for r in rows if r.metric == f"node CPU per job, {OFF}")
    share = [100 * off_us / (ms * 1000) for ms in cpu_off.samples]
    on_us = on_job_us()
    on_share = [100 * on_us / (ms * 1000) for ms in cpu_off.samples]
    return rows + [
        *(
            Row(CASE, f"spans exported per job, {label}", "spans", [n])
            for label, n in per_job.items()
        ),
        Row(CASE, "off: one hop's span call", "ns", [off_ns]),
        Row(
            CASE,
            "off: span calls per job",
            "us",
            [off_us],
            note=f"each hop's off path times the spans a job makes traced ({ON})",
        ),
        Row(CASE, "off: span calls / node CPU per job", "%", share, target="<= 1"),
        Row(
            CASE,
            "on: a job's 4 spans, recorded and encoded",
            "us",
            [on_us],
            note="CPU time in the bench process, on the node's recorder (node/observe/recorder.py)",
        ),
        Row(CASE, "on: a job's spans / node CPU per job off", "%", on_share, target="<= 5"),
    ]


async def _measure(env: Env, nodes: dict[str, BenchNode]) -> tuple[list[Row], dict[str, int]]:
    """The alternated throughput runs; the rows, and the jobs each node ran (warm-up too)."""
    plan = env.plan
    n_jobs = plan.jobs if plan.quick else min(plan.jobs, 2000)
    rate: dict[str, list[float]] = {label: [] for label in RATIOS}
    cpu: dict[str, list[float]] = {label: [] for label in RATIOS}
    split: dict[str, dict[str, list[float]]] = {label: {} for label in RATIOS}
    warm = 10
    jobs = dict.fromkeys(RATIOS, warm + 1 + plan.runs * n_jobs)
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            label: await stack.enter_async_context(bench_client(env, node.redis_url))
            for label, node in nodes.items()
        }
        for label, client in clients.items():  # served, connections, warm job processes
            with trio.fail_after(60):
                await wait_served(client, env.actor, nodes[label].node_id)
            await roundtrips(client, env.actor, nodes[label].node_id, warm)
        labels = list(RATIOS)
        for run in range(plan.runs):  # alternated, rotated: a noisy machine hurts all alike
            for label in labels[run % len(labels) :] + labels[: run % len(labels)]:
                node = nodes[label]
                done = await run_throughput(
                    clients[label], env.actor, node.node_id, n_jobs, {"node": node.pid}
                )
                rate[label].append(done.rate)
                cpu[label].append(_node_cpu_ms(done.cpu, n_jobs))
                for name in SPLIT:
                    ms = done.cpu.get(name, 0.0) * 1000 / n_jobs
                    split[label].setdefault(name, []).append(ms)
    note = f"N={n_jobs} local jobs per run; OTLP/HTTP to a receiver in the bench process"
    rows = [Row(CASE, f"jobs/s, tracing {label}", "jobs/s", rate[label]) for label in RATIOS]
    rows[0].note = note
    for label in RATIOS:
        if label != OFF:
            ratio = [100 * a / b for a, b in zip(rate[label], rate[OFF], strict=True)]
            target = ">= 95" if label == ON else ""
            rows.append(Row(CASE, f"throughput: {label} / {OFF}", "%", ratio, target=target))
    rows += [Row(CASE, f"node CPU per job, {label}", "ms", cpu[label]) for label in RATIOS]
    rows += [
        Row(CASE, f"CPU per job: {name}: {label} - {OFF}", "ms", _minus(values, split[OFF][name]))
        for label in RATIOS
        if label != OFF
        for name, values in split[label].items()
    ]
    return rows, jobs


def _minus(on: list[float], off: list[float]) -> list[float]:
    return [a - b for a, b in zip(on, off, strict=True)]
