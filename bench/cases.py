"""The seven bench cases. Each returns table rows; none asserts anything about timing."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import coredis
import trio
from trio_websocket import open_websocket_url, serve_websocket

from bench import commands, workload
from bench.harness import (
    ACTOR_ID,
    CONTEXT_ID,
    RUNNERS,
    BenchNode,
    Procs,
    Row,
    cpu_times,
    hwm_mb,
    job_cpu_split,
    make_home,
    node_key,
    own_cpu_s,
    percentile,
    rss_mb,
    wait_served,
    wire,
)
from bus.client.api import Client, open_client
from bus.client.inbox import new_inbox_name
from bus.core import keys
from bus.core.envelope import verify_message
from bus.core.frames import Frame, encode_msg_item, encode_msgs
from bus.core.models import Message
from bus.wire.transport import Link, Transport, TransportConfig
from crypto import KeyPair
from crypto.tls import make_self_signed, server_context

SUBMITTERS = 8  # concurrent submit tasks sharing one client
WAITERS = 32  # concurrent BLPOP waiters (each holds a pool connection while blocked)
CALIBRATION_JOBS = 200  # enough for the rate to be past the start-up of a run
BATCH = 64  # messages per msgs frame in the batched transport rows (case 4)
RESULT_TIMEOUT_S = 300


@dataclass
class Plan:
    quick: bool
    runs: int
    jobs: int
    roundtrips: int
    budget_s: float  # per measured run; N is capped to what fits at the calibrated rate
    transport_msgs: int
    valkey_jobs: int
    cmdstat_jobs: int
    backlogs: tuple[int, ...]
    memory_backlogs: tuple[int, ...]
    materialised_jobs: int
    slots: tuple[int, ...] = (1, 2, 4)
    profile_dir: Path | None = None
    inbox: bool = True  # bench clients wait on one reply inbox each (False: reply lists)

    @classmethod
    def make(cls, quick: bool, runs: int | None, budget_s: float | None) -> Plan:
        if quick:
            return cls(
                quick=True,
                runs=runs or 1,
                jobs=50,
                roundtrips=20,
                budget_s=budget_s or 5.0,
                transport_msgs=500,
                valkey_jobs=2_000,
                cmdstat_jobs=20,
                backlogs=(100, 1_000),
                memory_backlogs=(1_000,),
                materialised_jobs=1_000,
            )
        return cls(
            quick=False,
            runs=runs or 3,
            jobs=5_000,
            roundtrips=300,
            budget_s=budget_s or 10.0,
            transport_msgs=20_000,
            valkey_jobs=50_000,
            cmdstat_jobs=300,
            backlogs=(1_000, 10_000, 100_000),
            memory_backlogs=(10_000, 100_000),
            materialised_jobs=10_000,
        )


@dataclass
class Env:
    """Shared state of one bench run: processes, a temp dir, the bench actor, lazy node pair."""

    plan: Plan
    procs: Procs
    nursery: trio.Nursery
    base: Path
    actor: KeyPair = field(default_factory=KeyPair.generate)
    pair: tuple[BenchNode, BenchNode] | None = None
    idle: dict[str, list[float]] = field(default_factory=dict)
    calibrated_rate: float = 0.0  # local jobs/s seen by the first calibration

    async def get_pair(self) -> tuple[BenchNode, BenchNode]:
        """Nodes A and B (:data:`~bench.harness.RUNNERS`, embedded Valkey), wired, warmed up both
        ways."""
        if self.pair is None:
            runners = RUNNERS
            a = await self.procs.start_node(
                self.nursery, "a", make_home(self.base / "a", "a", runners, actor_id=1)
            )
            b = await self.procs.start_node(
                self.nursery, "b", make_home(self.base / "b", "b", runners, actor_id=2)
            )
            await wire([a, b], self.actor)
            async with open_client(a.redis_url) as client:
                with trio.fail_after(60):
                    await wait_served(client, self.actor, a.node_id)
                    await wait_served(client, self.actor, b.node_id)
            # idle memory: right after start-up and one warm-up job each way
            await trio.sleep(0.5)
            for _ in range(3):
                for key, value in (
                    ("node", rss_mb(a.pid)),
                    ("valkey", rss_mb(a.valkey_pid)),
                ):
                    self.idle.setdefault(key, []).append(value)
                await trio.sleep(0.3)
            self.pair = (a, b)
        return self.pair


@asynccontextmanager
async def tool_env(plan: Plan, prefix: str) -> AsyncIterator[Env]:
    """An :class:`Env` for a bench tool run outside ``run.py`` (trace.py, wakes.py,
    alternate.py), in a temp dir named with ``prefix``: on the way out, whatever happened,
    every process it started is stopped and the dir removed."""
    procs = Procs()
    base = Path(tempfile.mkdtemp(prefix=prefix))
    async with trio.open_nursery() as nursery:
        try:
            yield Env(plan, procs, nursery, base)
        finally:
            await procs.stop_all()
            shutil.rmtree(base, ignore_errors=True)
            nursery.cancel_scope.cancel()


# -- throughput helpers ----------


@dataclass
class Throughput:
    n: int
    submit_s: float
    total_s: float
    errors: int
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds in the run

    @property
    def rate(self) -> float:
        return self.n / self.total_s

    @property
    def submit_rate(self) -> float:
        return self.n / self.submit_s


async def run_throughput(
    client: Client, actor: KeyPair, to: str, n: int, watch: dict[str, int] | None = None
) -> Throughput:
    """Submit ``n`` one-job messages concurrently, wait for every result (bounded waiters)."""
    send, receive = trio.open_memory_channel[Message](n)
    counter = iter(range(n))
    errors = 0
    submit_done = 0.0
    before = {name: cpu_times(pid) for name, pid in (watch or {}).items()}
    jobs_before = {name: job_cpu_split(pid) for name, pid in (watch or {}).items()}
    bench_cpu0 = own_cpu_s()

    async def submitter() -> None:
        for _ in counter:
            message = await client.submit_job(
                actor,
                ACTOR_ID,
                to=to,
                context_id=CONTEXT_ID,
                script_type="python",
                script=workload.SCRIPT,
            )
            send.send_nowait(message)

    async def waiter() -> None:
        nonlocal errors
        async for message in receive:
            results = await client.wait_results(message, timeout_s=RESULT_TIMEOUT_S)
            errors += sum(1 for r in results if not r.ok)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(WAITERS):
            nursery.start_soon(waiter)
        async with trio.open_nursery() as submitters:
            for _ in range(SUBMITTERS):
                submitters.start_soon(submitter)
        submit_done = time.perf_counter()
        send.close()
    t_end = time.perf_counter()
    cpu: dict[str, float] = {"bench client": own_cpu_s() - bench_cpu0}
    for name, pid in (watch or {}).items():
        after = cpu_times(pid)
        cpu[name] = after.self_s - before[name].self_s
        if name.startswith("node"):
            runners, boxes = job_cpu_split(pid)
            cpu[f"{name} job processes"] = runners + boxes - sum(jobs_before[name])
            cpu[f"{name} job processes: runners"] = runners - jobs_before[name][0]
            cpu[f"{name} job processes: sandboxes"] = boxes - jobs_before[name][1]
    return Throughput(n, submit_done - t0, t_end - t0, errors, cpu)


async def calibrate(env: Env, client: Client, to: str, n_max: int) -> tuple[int, str]:
    """N for one measured run: n_max, or what fits the per-run budget at the calibrated rate."""
    if env.plan.quick:
        return n_max, ""
    probe = await run_throughput(client, env.actor, to, CALIBRATION_JOBS)
    n = max(min(n_max, 200), min(n_max, int(probe.rate * env.plan.budget_s)))
    if not env.calibrated_rate:
        env.calibrated_rate = probe.rate
    note = ""
    if n < n_max:
        note = (
            f"N capped to {n} of {n_max} jobs: calibration ran {probe.rate:.0f} jobs/s and the "
            f"per-run budget is {env.plan.budget_s:g} s (--budget)"
        )
    return n, note


def cpu_rows(case: str, samples: list[Throughput]) -> list[Row]:
    names = sorted({k for t in samples for k in t.cpu})
    return [
        Row(
            case,
            f"CPU per job: {name}",
            "ms",
            [t.cpu.get(name, 0.0) * 1000 / t.n for t in samples],
        )
        for name in names
    ]


async def profile_start(env: Env, label: str, pid: int) -> trio.Process | None:
    if env.plan.profile_dir is None or not shutil.which("py-spy", path=_venv_bin()):
        return None
    env.plan.profile_dir.mkdir(parents=True, exist_ok=True)
    out = env.plan.profile_dir / f"{label}.txt"
    return await trio.lowlevel.open_process(
        [
            str(Path(_venv_bin()) / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def profile_stop(proc: trio.Process | None) -> None:
    if proc is None:
        return
    with trio.CancelScope(shield=True):
        proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        with trio.move_on_after(20):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _venv_bin() -> str:
    import sys

    return str(Path(sys.executable).parent)


async def throughput_case(
    env: Env, case: str, client: Client, to: str, watch: dict[str, int], profile: dict[str, int]
) -> list[Row]:
    n, note = await calibrate(env, client, to, env.plan.jobs)
    samples: list[Throughput] = []
    for i in range(env.plan.runs):
        spies = []
        if i == 0:
            for label, pid in profile.items():
                spies.append(await profile_start(env, label, pid))
        try:
            t = await run_throughput(client, env.actor, to, n, watch)
        finally:
            for spy in spies:
                await profile_stop(spy)
        samples.append(t)
    errors = sum(t.errors for t in samples)
    err_note = f"{errors} jobs ended in error" if errors else ""
    rows = [
        Row(
            case,
            f"jobs/s submit->last result (N={n})",
            "jobs/s",
            [t.rate for t in samples],
            note="; ".join(x for x in (note, err_note) if x),
        ),
        Row(
            case,
            "submit-only rate (while runners work)",
            "msgs/s",
            [t.submit_rate for t in samples],
        ),
    ]
    return rows + cpu_rows(case, samples)


# -- cases ----------


async def case_local_throughput(env: Env) -> list[Row]:
    a, _ = await env.get_pair()
    async with bench_client(env, a.redis_url) as client:
        return await throughput_case(
            env,
            "1 local",
            client,
            a.node_id,
            {"node A": a.pid, "valkey A": a.valkey_pid},
            {"node-local": a.pid, "client-local": _self_pid()} | runner_spies(a.pid, "local"),
        )


async def case_cross_throughput(env: Env) -> list[Row]:
    a, b = await env.get_pair()
    async with bench_client(env, a.redis_url) as client:
        return await throughput_case(
            env,
            "2 cross",
            client,
            b.node_id,
            {
                "node A": a.pid,
                "valkey A": a.valkey_pid,
                "node B": b.pid,
                "valkey B": b.valkey_pid,
            },
            {"node-cross-A": a.pid, "node-cross-B": b.pid} | runner_spies(b.pid, "cross-B"),
        )


def bench_client(env: Env, redis_url: str) -> AbstractAsyncContextManager[Client]:
    """The measuring client of cases 1, 2, 3 and 7: with a reply inbox of its own unless the
    plan says reply lists (``bench/run.py --reply-lists``)."""
    return open_client(redis_url, inbox=new_inbox_name() if env.plan.inbox else "")


def runner_spies(node_pid: int, label: str) -> dict[str, int]:
    """The node's runner processes (node/runners/processes.py), to profile beside the node: the
    built-in runners pop, run and answer jobs in processes of their own."""
    from pathlib import Path

    found: dict[str, int] = {}
    for status in sorted(Path("/proc").glob("[0-9]*/status")):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{node_pid}\n" in text and b"--runner" in cmdline:
            found[f"runner-{label}-{len(found) + 1}"] = int(status.parent.name)
    return found


def _self_pid() -> int:
    import os

    return os.getpid()


async def roundtrips(client: Client, actor: KeyPair, to: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        message = await client.submit_job(
            actor,
            ACTOR_ID,
            to=to,
            context_id=CONTEXT_ID,
            script_type="python",
            script=workload.SCRIPT,
        )
        [result] = await client.wait_results(message, timeout_s=RESULT_TIMEOUT_S)
        out.append((time.perf_counter() - t0) * 1000)
        if not result.ok:
            raise RuntimeError(f"round-trip job failed: {result.status} {result.reason}")
    return out


async def case_latency(env: Env) -> list[Row]:
    a, b = await env.get_pair()
    rows: list[Row] = []
    async with bench_client(env, a.redis_url) as client:
        for label, to, percentiles in (
            ("local", a.node_id, ("p50", "p90", "p99")),
            ("cross", b.node_id, ("p50", "p90", "p99")),
        ):
            await roundtrips(client, env.actor, to, 10)  # connections, caches, workers
            warm = await roundtrips(client, env.actor, to, 10)
            n = env.plan.roundtrips
            note = ""
            if not env.plan.quick:
                fit = int(env.plan.budget_s * 1000 / statistics.median(warm))
                if fit < n:
                    n = max(50, fit)
                    note = (
                        f"capped to {n} of {env.plan.roundtrips} round trips by the "
                        f"{env.plan.budget_s:g} s per-run budget"
                    )
            runs = [await roundtrips(client, env.actor, to, n) for _ in range(env.plan.runs)]
            for p in percentiles:
                pv = float(p[1:])
                rows.append(
                    Row(
                        "3 round trip",
                        f"{label} {p} (n={n} sequential)",
                        "ms",
                        [percentile(r, pv) for r in runs],
                        note=note if p == "p50" else "",
                    )
                )
    return rows


# -- transport ----------


class _Counter:
    def __init__(self, n: int, verify_key: str = "") -> None:
        self.n = n
        self.got = 0
        self.done = trio.Event()
        self.verify_key = verify_key
        self.bad = 0
        self.acks_frames = 0

    async def on_msg(self, link: Link, frame: Frame) -> None:
        """Receiver side: what a node must do at least per delivery (ack it), nothing stored."""
        if frame.type == "msgs":  # answered as LinkHandler does: posted to the link's writer
            for item in frame.body["msgs"]:
                self._check(item["fields"])
            acks = [{"ctx": item["ctx"], "key": item["key"]} for item in frame.body["msgs"]]
            link.post_answers(acks, [])

    def _check(self, fields: dict[str, str]) -> None:
        if self.verify_key:
            message = Message.from_hash(fields)
            if not verify_message(message, self.verify_key).ok:
                self.bad += 1

    async def on_ack(self, link: Link, frame: Frame) -> None:
        if frame.type == "acks":
            self.acks_frames += 1
            self.got += len(frame.body["acks"])
            if self.got >= self.n:
                self.done.set()

    async def on_bad(self, link: Link, detail: str) -> None:
        raise RuntimeError(f"bad frame in transport bench: {detail}")


def _link_configs(encrypted: bool, home: Path) -> tuple[TransportConfig, TransportConfig]:
    """The dialler's and the listener's transport settings, as a node's default gives them
    (TLS 1.3, node/links/encryption.py) or with ``link_encryption = "none"``."""
    if not encrypted:
        return TransportConfig(), TransportConfig()
    cert, key = home / "tls.crt", home / "tls.key"
    fp = make_self_signed(cert, key, "bench")
    listener = TransportConfig(
        ssl_server=server_context(cert, key), tls_fingerprint=fp, require_tls=True
    )
    return TransportConfig(require_tls=True), listener


@dataclass(frozen=True)
class LinkRun:
    """One transport run: msgs/s over the link and over the raw echo, by the wall clock and
    per CPU-second of this process (both ends run in it: steadier on a shared machine), and
    the acks frames the link's receiver sent per msgs frame."""

    rate: float
    raw: float
    rate_cpu: float
    raw_cpu: float
    acks_per_frame: float


async def transport_run(
    n: int,
    messages: list[Message],
    actor: KeyPair,
    verify: bool,
    batch: int = 1,
    *,
    encrypted: bool = True,
) -> LinkRun:
    """Signed msgs over an authenticated Transport link with acks, and over a raw echo.
    Messages travel in ``msgs`` frames of ``batch`` (as the outbox sends what it holds: one
    when idle, more under load), answered in ``acks`` frames as a node answers (those read
    together, together); the raw echo carries the same frames back, without encryption, so
    that the ratio shows what the link costs, encryption included. The link is TLS 1.3 as
    between nodes, unless not ``encrypted``."""
    ka, kb = KeyPair.generate(), KeyPair.generate()
    n = max(batch, n - n % batch)  # whole frames
    counter = _Counter(n, actor.public_hex if verify else "")
    # what the outbox sends: the stored message hash
    items = [encode_msg_item(CONTEXT_ID, m.key, m.to_hash()) for m in messages]
    batch_payloads = [
        encode_msgs([items[(i + j) % len(items)] for j in range(batch)])
        for i in range(0, len(items), batch)
    ]
    with tempfile.TemporaryDirectory() as home:
        config_a, config_b = _link_configs(encrypted, Path(home))
    async with trio.open_nursery() as nursery:
        ta = Transport(ka, lambda: {kb.public_hex}, counter.on_ack, counter.on_bad, config_a)
        tb = Transport(kb, lambda: {ka.public_hex}, counter.on_msg, counter.on_bad, config_b)
        port = await nursery.start(tb.serve, "127.0.0.1", 0)
        nursery.start_soon(ta.dial_forever, kb.public_hex, f"ws://127.0.0.1:{port}")
        with trio.fail_after(30):
            link = await ta.wait_link(kb.public_hex)
        if link.encryption.startswith("TLSv1.3") != encrypted:
            raise RuntimeError(f"transport bench link is {link.encryption or 'cleartext'}")
        t0, c0 = time.perf_counter(), time.process_time()
        with trio.fail_after(300):
            for i in range(0, n, batch):
                await link.send_raw(batch_payloads[(i // batch) % len(batch_payloads)])
            await counter.done.wait()
        transport_rate = n / (time.perf_counter() - t0)
        transport_cpu = n / (time.process_time() - c0)
        nursery.cancel_scope.cancel()
    if counter.bad:
        raise RuntimeError(f"{counter.bad} signatures failed in the transport bench")

    payloads = batch_payloads

    async def echo(request: Any) -> None:
        ws = await request.accept()
        try:
            while True:
                await ws.send_message(await ws.get_message())
        except Exception:  # noqa: BLE001 - connection closed by the client
            return

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, echo, "127.0.0.1", 0, None)
        async with open_websocket_url(f"ws://127.0.0.1:{server.port}") as ws:
            got = 0
            done = trio.Event()

            async def reader() -> None:
                nonlocal got
                while got < n:
                    await ws.get_message()
                    got += batch
                done.set()

            t0, c0 = time.perf_counter(), time.process_time()
            with trio.fail_after(300):
                nursery.start_soon(reader)
                for i in range(n // batch):
                    await ws.send_message(payloads[i % len(payloads)])
                await done.wait()
            raw_rate = n / (time.perf_counter() - t0)
            raw_cpu = n / (time.process_time() - c0)
        nursery.cancel_scope.cancel()
    acks_per_frame = counter.acks_frames / (n // batch)
    return LinkRun(transport_rate, raw_rate, transport_cpu, raw_cpu, acks_per_frame)


async def case_transport(env: Env) -> list[Row]:
    origin, dest = KeyPair.generate().public_hex, KeyPair.generate().public_hex
    messages = [
        workload.signed_job_message(env.actor, ACTOR_ID, CONTEXT_ID, origin, dest)
        for _ in range(200)
    ]
    size = len(encode_msgs([encode_msg_item(CONTEXT_ID, messages[0].key, messages[0].to_hash())]))
    n = env.plan.transport_msgs
    plain: list[LinkRun] = []
    cleartext: list[LinkRun] = []
    batched: list[LinkRun] = []
    verified: list[LinkRun] = []
    for _ in range(env.plan.runs):
        plain.append(await transport_run(n, messages, env.actor, verify=False))
        cleartext.append(await transport_run(n, messages, env.actor, verify=False, encrypted=False))
        batched.append(await transport_run(n, messages, env.actor, verify=False, batch=BATCH))
        verified.append(await transport_run(max(100, n // 4), messages, env.actor, verify=True))
    case = "4 transport"
    return [
        Row(
            case,
            f"signed msgs/s over one TLS 1.3 link, msg+ack ({size} B frame)",
            "msgs/s",
            [r.rate for r in plain],
        ),
        Row(
            case,
            'same over a cleartext link (link_encryption = "none")',
            "msgs/s",
            [r.rate for r in cleartext],
        ),
        Row(
            case,
            "raw trio-websocket echo, same payload, no encryption",
            "msgs/s",
            [r.raw for r in plain],
        ),
        Row(
            case,
            "transport / raw echo (link TLS 1.3, echo cleartext)",
            "%",
            [100 * r.rate / r.raw for r in plain],
            ">= 70",
            note="what a link costs over a bare websocket, encryption included",
        ),
        Row(
            case,
            "the same per CPU-second of this process (both ends run in it)",
            "%",
            [100 * r.rate_cpu / r.raw_cpu for r in plain],
            note="steadier than the wall clock on a busy machine",
        ),
        Row(
            case,
            "acks frames per msgs frame (single frames, TLS 1.3)",
            "ratio",
            [r.acks_per_frame for r in plain],
            note="a receiver answers frames it read together in one acks frame; the echo "
            "answers each",
        ),
        Row(
            case,
            "encryption's cost: TLS 1.3 / cleartext transport",
            "%",
            [100 * t.rate / c.rate for t, c in zip(plain, cleartext, strict=True)],
        ),
        Row(
            case,
            f"signed msgs/s in msgs frames of {BATCH} + one acks frame each",
            "msgs/s",
            [r.rate for r in batched],
            note="what the outbox sends when it holds that many; single msg frames are what "
            "a lone message travels in",
        ),
        Row(
            case,
            "raw echo of the same msgs frames (cleartext)",
            "msgs/s",
            [r.raw for r in batched],
        ),
        Row(case, "batched TLS transport / raw echo", "%", [100 * r.rate / r.raw for r in batched]),
        Row(
            case,
            "same (single frames), receiver parses + verifies signature",
            "msgs/s",
            [r.rate for r in verified],
            note="the node's link handler does not verify on delivery; the consumer does, later",
        ),
    ]


# -- valkey ----------


async def case_valkey(env: Env) -> list[Row]:
    case = "5 valkey"
    rows: list[Row] = []
    # (a) the ceiling: a fresh Valkey with the node's own argv (AOF everysec), driven from trio
    server = env.procs.start_valkey(env.base / "valkey-ceiling", persist=True)
    messages = [
        workload.signed_job_message(env.actor, ACTOR_ID, CONTEXT_ID, "o" * 64, "d" * 64)
        for _ in range(100)
    ]
    hashes = [(m.job[0].key, m.job[0].to_hash() | {"message_key": m.key}) for m in messages]
    pipelined: list[float] = []
    sequential: list[float] = []
    try:
        r: Any = coredis.Redis.from_url(server.url, db=CONTEXT_ID, decode_responses=True)
        async with r:
            n = env.plan.valkey_jobs
            for run in range(env.plan.runs):
                t0 = time.perf_counter()
                for start in range(0, n, 100):
                    async with r.pipeline(transaction=False) as pipe:
                        for i in range(start, min(n, start + 100)):
                            key, h = hashes[i % len(hashes)]
                            k = f"{key}:{run}:{i}"
                            pipe.hset(k, h)
                            pipe.lpush("queue:python", [k])
                pipelined.append(2 * n / (time.perf_counter() - t0))
                m = max(200, n // 20)
                t0 = time.perf_counter()
                for i in range(m):
                    key, h = hashes[i % len(hashes)]
                    k = f"{key}:s{run}:{i}"
                    await r.hset(k, h)
                    await r.lpush("queue:python", [k])
                sequential.append(2 * m / (time.perf_counter() - t0))
                await r.flushdb()
    finally:
        env.procs.stop_valkey(server)
    rows.append(Row(case, "raw pipelined HSET+LPUSH (100 jobs/pipeline)", "cmds/s", pipelined))
    rows.append(Row(case, "raw sequential awaited HSET, LPUSH (1 task)", "cmds/s", sequential))

    # (b) commands and requests per job, per process, local and cross-node (bench/commands.py),
    # counted on the client cases 1, 2, 3 and 7 measure (a reply inbox unless --reply-lists),
    # so that the count describes the jobs whose rate and CPU those cases give; with an inbox,
    # the local count on a client waiting on each message's own reply list (open_client's
    # default) follows for comparison, no target
    pair = await commands.start_tcp_pair(env.procs, env.nursery, env.base, env.actor)
    node_side: list[float] = []
    clients = [(env.plan.inbox, [("local", "<= 15"), ("cross-node", "<= 30")])]
    if env.plan.inbox:
        clients.append((False, [("reply-list local", "")]))
    try:
        for inbox, paths in clients:
            reply_to = new_inbox_name() if inbox else ""
            async with open_client(pair.a.redis_url, inbox=reply_to) as client:
                for label, target in paths:
                    to = pair.b.node_id if label == "cross-node" else pair.a.node_id
                    samples = []
                    for _ in range(env.plan.runs):
                        n = env.plan.cmdstat_jobs

                        async def one_run(to: str = to, n: int = n) -> None:
                            await run_throughput(client, env.actor, to, n)

                        samples.append(
                            await commands.count_run(
                                [pair.va, pair.vb], pair.processes(_self_pid()), one_run, n
                            )
                        )
                        if label == "local":
                            c = samples[-1]
                            node_side.append(
                                sum(v for k, v in c.requests.items() if k != commands.CLIENT) / c.n
                            )
                    rows += commands.count_rows(case, label, target, samples)
    finally:
        for node in (pair.a, pair.b):
            await env.procs.stop_node(node)
        for server in (pair.va, pair.vb):
            env.procs.stop_valkey(server)
    ceiling = [s / c for s, c in zip(sequential, node_side, strict=False) if c]
    rows.append(
        Row(
            case,
            "implied ceiling: sequential cmds/s / node-side requests per local job",
            "jobs/s",
            ceiling,
            note="rough: each process awaits its requests in turn; node and runner processes "
            "overlap",
        )
    )
    return rows


# -- backlog (memory and scaling) ----------


@dataclass
class BacklogResult:
    backlog: int
    window: int
    rate: float  # jobs/s executed over the window
    submitted_bytes_per_job: float
    node_rss_mb: float
    node_hwm_mb: float
    valkey_rss_mb: float
    replies_in_window: int
    load_s: float
    rewrite_s: float  # waited for an AOF rewrite the bulk load triggered
    # CPU ms per window job, from the release to the window's last job, by process (node,
    # runners, sandboxes, valkey): what each depth costs, which a shared machine's load leaves
    # readable when jobs/s is not; jobs past the window that ended meanwhile count too
    cpu_ms_per_job: dict[str, float]


class Backlogs:
    """Signs the backlog once (max size) and replays it into a fresh Valkey per run."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.prepared: list[workload.Prepared] = []
        self.home: Path | None = None
        self.results: dict[int, list[BacklogResult]] = {}
        self.window = 0
        self.window_note = ""

    def prepare(self, count: int) -> None:
        if self.home is None:
            self.home = make_home(
                self.env.base / "backlog",
                "backlog",
                RUNNERS,
                redis_url="redis://127.0.0.1:1",  # replaced per run (config.toml rewritten)
            )
        node_id = node_key(self.home).public_hex
        while len(self.prepared) < count:
            m = workload.signed_job_message(self.env.actor, ACTOR_ID, CONTEXT_ID, node_id, node_id)
            self.prepared.append(workload.submitted_form(m))

    async def run_all(self) -> None:
        plan = self.env.plan
        biggest = max(plan.backlogs + plan.memory_backlogs)
        if not self.prepared:
            await trio.to_thread.run_sync(self.prepare, biggest)
        smallest = min(plan.backlogs + plan.memory_backlogs)
        if not plan.quick and not self.env.calibrated_rate:
            a, _ = await self.env.get_pair()
            async with open_client(a.redis_url) as client:
                await calibrate(self.env, client, a.node_id, plan.jobs)
        rate = self.env.calibrated_rate
        window = smallest
        if not plan.quick and rate:
            window = min(smallest, max(200, int(rate * plan.budget_s)))
        elif not plan.quick:
            window = min(smallest, 1000)
        self.window = window
        if window < smallest:
            self.window_note = (
                f"each backlog run measures the first {window} jobs executed (same window for "
                f"every backlog; at ~{rate:.0f} jobs/s draining 100k would take "
                f"{100_000 / max(rate, 1):.0f} s per run)"
            )
        for _ in range(plan.runs):
            for b in sorted(set(plan.backlogs + plan.memory_backlogs)):
                self.results.setdefault(b, []).append(await self.run_one(b, window))

    async def run_one(self, backlog: int, window: int) -> BacklogResult:
        env = self.env
        assert self.home is not None
        data = env.base / f"backlog-valkey-{backlog}"
        shutil.rmtree(data, ignore_errors=True)
        server = env.procs.start_valkey(data, persist=True)
        node: BenchNode | None = None
        try:
            _point_home_at(self.home, server.url)
            async with open_client(server.url) as client:
                await client.register_actor(ACTOR_ID, env.actor.public_hex)
                await client.register_context(CONTEXT_ID, admins=[ACTOR_ID])
                r: Any = await client.store.db(CONTEXT_ID)
                mem0 = int((await r.info("memory"))["used_memory"])
                items = self.prepared[:backlog]
                t0 = time.perf_counter()
                await trio.to_thread.run_sync(
                    workload.send_resp,
                    server.spec.port,
                    CONTEXT_ID,
                    list(workload.chunked([p.resp for p in items], workload.SUBMITTED_CMDS)),
                )
                load_s = time.perf_counter() - t0
                mem1 = int((await r.info("memory"))["used_memory"])
                # the bulk load can trigger an AOF rewrite (a fork writing the whole data set);
                # let it finish first, or it competes with the node for the 2 cores
                rewrite_s = await _settle_aof(r)
                # the backlog waits under another name until the node is ready: a node started
                # on it runs the window during its own start-up, its runner processes coming
                # up one by one, and the rate would time that (bench/HISTORY.md#flat-cost-2)
                await r.rename(keys.MSG_OUT, STAGED)
                node = await env.procs.start_node(env.nursery, f"backlog{backlog}", self.home)
                keys_ = [p.job_key for p in items[:window]]
                cpu0 = _backlog_cpu(node.pid, server.pid)
                released_ms = await _release(r)
                rate = await _drain_rate(r, keys_)
                cpu1 = _backlog_cpu(node.pid, server.pid)
                await _queued_after(r, keys_, released_ms)
                replies = await _count_replies(r, [p.message_key for p in items[:window]])
                result = BacklogResult(
                    backlog,
                    window,
                    rate,
                    (mem1 - mem0) / backlog,
                    rss_mb(node.pid),
                    hwm_mb(node.pid),
                    rss_mb(server.pid),
                    replies,
                    load_s,
                    rewrite_s,
                    {k: (cpu1[k] - cpu0[k]) * 1000 / window for k in cpu0},
                )
        finally:
            if node is not None:
                await env.procs.stop_node(node)
            env.procs.stop_valkey(server)
            shutil.rmtree(data, ignore_errors=True)
        return result


def _aof_note(results: list[BacklogResult]) -> str:
    waited = max(x.rewrite_s for x in results)
    if waited < 0.5:
        return ""
    return (
        f"the bulk load triggered an AOF rewrite; the node started after it ended (waited up to "
        f"{waited:.1f} s), so the rate is the node's, not the rewrite's"
    )


async def _settle_aof(r: Any) -> float:
    """Wait until no AOF rewrite is running or scheduled; the seconds waited."""
    t0 = time.perf_counter()
    with trio.fail_after(300):
        while True:
            info = await r.info("persistence")
            if not int(info.get("aof_rewrite_in_progress", 0)) and not int(
                info.get("aof_rewrite_scheduled", 0)
            ):
                return time.perf_counter() - t0
            await trio.sleep(0.2)


def _backlog_cpu(node_pid: int, valkey_pid: int) -> dict[str, float]:
    """CPU seconds so far of a backlog run's processes (see BacklogResult.cpu_ms_per_job)."""
    runners, boxes = job_cpu_split(node_pid)
    node, valkey = cpu_times(node_pid).self_s, cpu_times(valkey_pid).self_s
    return {"node": node, "runners": runners, "sandboxes": boxes, "valkey": valkey}


STAGED = "bench:backlog"  # where a backlog waits until the node is ready (Backlogs.run_one)


async def _release(r: Any) -> int:
    """Move the staged backlog onto msg_out whole, in one O(1) step (a RENAME, which wakes the
    supervisor blocked on msg_out at once); Valkey's clock (ms) just before it."""
    clock = await r.time()  # coredis: a datetime
    await r.rename(STAGED, keys.MSG_OUT)
    return int(clock.timestamp() * 1000)


async def _queued_after(r: Any, job_keys: list[str], released_ms: int) -> None:
    """Raise RuntimeError unless every job of ``job_keys`` was queued (``stats_queued_ms``,
    Valkey's clock, as ``released_ms``) once the backlog was released: a job queued before
    would be one the rate did not time from the same start as the others."""
    async with r.pipeline(transaction=False) as pipe:
        for k in job_keys:
            pipe.hget(k, "stats_queued_ms")
    stamps = [int(s) if s else 0 for s in pipe.results or ()]
    early = [k for k, ms in zip(job_keys, stamps, strict=True) if ms < released_ms]
    if early:
        raise RuntimeError(
            f"{len(early)} of {len(job_keys)} backlog jobs were queued before the backlog was "
            f"released (first: {early[0]}): the window is not the node's steady drain"
        )


def _point_home_at(home: Path, url: str) -> None:
    path = home / "config.toml"
    lines = path.read_text().splitlines()
    out = [f'redis_url = "{url}"' if ln.startswith("redis_url") else ln for ln in lines]
    path.write_text("\n".join(out) + "\n")


async def _drain_rate(r: Any, job_keys: list[str]) -> float:
    """Executed jobs/s over ``job_keys`` (FIFO order): poll their status until all finished.

    Timed from the first finished job seen to the last, so node start-up is not counted.
    Results are not used here: they queue behind the backlog in msg_out
    (bench/HISTORY.md#before-performance-work).
    """
    done_prefix = 0
    first_t = 0.0
    first_done = 0
    with trio.fail_after(RESULT_TIMEOUT_S * 4):
        while done_prefix < len(job_keys):
            window = job_keys[done_prefix : done_prefix + 256]
            async with r.pipeline(transaction=False) as pipe:
                for k in window:
                    pipe.hget(k, "status")
            statuses = pipe.results or ()
            finished = [s in ("finished", "error") for s in statuses]
            advance = 0
            for f in finished:
                if not f:
                    break
                advance += 1
            done_prefix += advance
            beyond = sum(finished[advance:])
            if not first_t and done_prefix + beyond > 0:
                first_t = time.perf_counter()
                first_done = done_prefix + beyond
            if done_prefix < len(job_keys):
                await trio.sleep(0.05)
    elapsed = time.perf_counter() - first_t
    if first_done < len(job_keys) and elapsed > 0:
        return (len(job_keys) - first_done) / elapsed
    # the whole window ran between two looks (a quick run's 100 jobs): no interval was seen, so
    # the rate is read from the stamps Valkey's clock put on each start instead
    return await _start_rate(r, job_keys)


async def _start_rate(r: Any, job_keys: list[str]) -> float:
    """Started jobs/s over ``job_keys``, from their ``stats_started_ms`` stamps (Valkey's
    clock). Raises RuntimeError when the stamps span no time: a rate of 0 or infinity would be
    a figure that is not one."""
    async with r.pipeline(transaction=False) as pipe:
        for k in job_keys:
            pipe.hget(k, "stats_started_ms")
    stamps = [int(s) for s in pipe.results or () if s and str(s).isdigit()]
    if len(stamps) < 2 or max(stamps) == min(stamps):
        raise RuntimeError(f"no drain rate: {len(stamps)} start stamps over {len(job_keys)} jobs")
    return (len(stamps) - 1) / ((max(stamps) - min(stamps)) / 1000)


async def _count_replies(r: Any, message_keys: list[str]) -> int:
    n = 0
    for start in range(0, len(message_keys), 500):
        async with r.pipeline(transaction=False) as pipe:
            for k in message_keys[start : start + 500]:
                pipe.exists([f"reply:{k}"])
        n += sum(int(x) for x in pipe.results or ())
    return n


async def case_memory(env: Env, backlogs: Backlogs) -> list[Row]:
    case = "6 memory"
    await env.get_pair()
    rows = [
        Row(case, "node RSS idle (python process)", "MB", env.idle["node"], "<= 80"),
        Row(case, "embedded valkey-server RSS idle", "MB", env.idle["valkey"]),
    ]
    if not backlogs.results:
        await backlogs.run_all()
    for b in env.plan.memory_backlogs:
        res = backlogs.results[b]
        rows.append(
            Row(
                case,
                f"node RSS peak, {b:,} jobs queued",
                "MB",
                [x.node_hwm_mb for x in res],
                note="VmHWM of the node process while it drained the first "
                f"{backlogs.window} jobs of the backlog",
            )
        )
        rows.append(
            Row(case, f"valkey RSS, {b:,} jobs queued", "MB", [x.valkey_rss_mb for x in res])
        )
        rows.append(
            Row(
                case,
                f"valkey bytes per job as submitted ({b:,} in msg_out)",
                "B/job",
                [x.submitted_bytes_per_job for x in res],
                f"<= {1024 + len(workload.SCRIPT)}",
                note="signed message hash (it embeds the job) + msg_out entry, as Client.submit "
                "writes them; the node writes the job hash when it routes the message",
            )
        )
    # materialised form, written directly into a fresh Valkey
    samples = []
    n = env.plan.materialised_jobs
    origin = KeyPair.generate().public_hex
    prepared = [
        workload.materialised_form(
            workload.signed_job_message(env.actor, ACTOR_ID, CONTEXT_ID, origin, origin)
        )
        for _ in range(n)
    ]
    for i in range(env.plan.runs):
        server = env.procs.start_valkey(env.base / f"valkey-mem-{i}", persist=False)
        try:
            r: Any = coredis.Redis.from_url(server.url, db=CONTEXT_ID, decode_responses=True)
            async with r:
                mem0 = int((await r.info("memory"))["used_memory"])
                await trio.to_thread.run_sync(
                    workload.send_resp,
                    server.spec.port,
                    CONTEXT_ID,
                    list(workload.chunked(prepared, workload.MATERIALISED_CMDS)),
                )
                mem1 = int((await r.info("memory"))["used_memory"])
                samples.append((mem1 - mem0) / n)
        finally:
            env.procs.stop_valkey(server)
    rows.append(
        Row(
            case,
            f"valkey bytes per job as materialised ({n:,} in queue:python)",
            "B/job",
            samples,
            f"<= {1024 + len(workload.SCRIPT)}",
            note="job hash + signed message hash + queue entry + seen marker, as the consumer "
            f"leaves a local job; script is {len(workload.SCRIPT)} B, target 1 KiB + script",
        )
    )
    return rows


async def case_scaling(env: Env, backlogs: Backlogs) -> list[Row]:
    case = "7 scaling"
    rows: list[Row] = []
    for slots in env.plan.slots:
        home = make_home(env.base / f"slots{slots}", f"slots{slots}", {"python": slots, "sh": 1})
        node = await env.procs.start_node(env.nursery, f"slots{slots}", home)
        try:
            await wire([node], env.actor)
            async with bench_client(env, node.redis_url) as client:
                with trio.fail_after(60):
                    await wait_served(client, env.actor, node.node_id)
                n, note = await calibrate(env, client, node.node_id, env.plan.jobs)
                samples = [
                    await run_throughput(client, env.actor, node.node_id, n)
                    for _ in range(env.plan.runs)
                ]
        finally:
            await env.procs.stop_node(node)
        rows.append(
            Row(
                case,
                f"python runner slots={slots}, jobs/s (N={n})",
                "jobs/s",
                [t.rate for t in samples],
                note=note,
            )
        )
    if not backlogs.results:
        await backlogs.run_all()
    base: list[float] = []
    for b in env.plan.backlogs:
        res = backlogs.results[b]
        rates = [x.rate for x in res]
        if not base:
            base = rates
        rows.append(
            Row(
                case,
                f"{b:,} queued up front: executed jobs/s (first {backlogs.window})",
                "jobs/s",
                rates,
                note=backlogs.window_note if b == env.plan.backlogs[0] else _aof_note(res),
                extra={
                    "replies_delivered_in_window": [x.replies_in_window for x in res],
                    "load_s": [x.load_s for x in res],
                    "aof_rewrite_wait_s": [x.rewrite_s for x in res],
                    "cpu_ms_per_job": [x.cpu_ms_per_job for x in res],
                },
            )
        )
        rows.append(
            Row(
                case,
                f"{b:,} queued: CPU per job, every process (first {backlogs.window})",
                "ms",
                [sum(x.cpu_ms_per_job.values()) for x in res],
                note=""
                if b != env.plan.backlogs[-1]
                else "from the backlog's release to the window's last job: node, runner "
                "processes, sandboxes, Valkey (by process in the JSON: cpu_ms_per_job)",
            )
        )
        if b != env.plan.backlogs[0]:
            ratio = [100 * x / _positive(statistics.median(base), "base rate") for x in rates]
            rows.append(
                Row(
                    case,
                    f"{b:,} vs {env.plan.backlogs[0]:,} queued",
                    "%",
                    ratio,
                    ">= 80",
                )
            )
        replies = [x.replies_in_window for x in res]
        rows.append(
            Row(
                case,
                f"{b:,} queued: results delivered for the first {backlogs.window}",
                "jobs",
                [float(x) for x in replies],
                note=""
                if b != env.plan.backlogs[-1]
                else "a job submitted and run on the same node is answered by its runner directly "
                "(no result message), so results do not wait behind the msg_out backlog",
            )
        )
    return rows


def _positive(value: float, what: str) -> float:
    """``value`` if it can divide: a ratio over 0 or NaN fails its case instead of printing
    a figure that is not one."""
    if not value > 0:
        raise ValueError(f"{what} is {value}: no ratio")
    return value


def summary_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [r.as_json() for r in rows]


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
