"""Case 9: what "acknowledged means durable on two machines" costs, and why.

Nodes side by side, each alone:

- ``unix``: its embedded single Valkey over a unix socket (AOF everysec, promises given at once);
- ``tcp``: the same single Valkey (same argv) reached over TCP on 127.0.0.1, as the replicated
  store is: the transport's share of the gap;
- ``repl``: a replicated store (a primary, two replicas with ``appendfsync always``, three
  Sentinels: node/host/replicated.py); its client's submits wait for ``WAITAOF 1 1``;
- ``repl-nowait``: the same node, measured through a second client whose URL asks
  ``waitaof=0,0`` (a bench-only switch, never a default): the replication's share without the
  wait.

The same local round trips (submit -> result, sequential) and the same concurrent throughput
run on each, alternated run by run so that a noisy machine hurts all alike; the rows give each
figure, the differences that separate the causes, and the replicated one against the single
unix-socket one (p50: the difference in ms; throughput: the ratio) with the issue's targets.
The primary's ``INFO commandstats`` counts the ``WAITAOF`` calls per job (nudges too), and the
CPU each process spends per job in the concurrent runs of ``unix``, ``tcp`` and ``repl`` says
where the replicated store's throughput goes (the node, its job processes, the primary, the
replicas, the Sentinels: on one machine they share its cores; ``tcp`` separates the transport's
share), and what that leaves the ratio on this machine and with the replicas elsewhere
(:func:`cpu_bounds`).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import coredis
import trio

from bench import workload
from bench.cases import RESULT_TIMEOUT_S, Env, Throughput, bench_client, roundtrips, run_throughput
from bench.commands import call_counts
from bench.harness import (
    ACTOR_ID,
    CONTEXT_ID,
    RUNNERS,
    BenchNode,
    Row,
    percentile,
    wait_served,
    wire,
)
from bus.client.api import Client
from node.config.store import StoreConfig
from node.host.acl import ensure_secrets
from node.host.home import init_home
from node.host.replicated import SENTINEL, SET_ROLES, ReplicatedSet

CASE = "9 replicated"
LABELS = ("unix", "tcp", "repl-nowait", "repl")


async def _node(
    env: Env, name: str, servers: ReplicatedSet | None, redis_url: str = ""
) -> BenchNode:
    home = env.base / name
    store = None
    if servers is not None:
        store = StoreConfig(sentinels=servers.sentinel_addresses)
    init_home(
        home,
        name=name,
        listen_port=0,
        runners=RUNNERS,
        console_listen="",
        store=store,
        redis_url=redis_url,
    )
    node = await env.procs.start_node(env.nursery, name, home)
    await wire([node], env.actor)
    async with bench_client(env, node.redis_url) as client:
        with trio.fail_after(60):
            await wait_served(client, env.actor, node.node_id)
    return node


def no_wait(url: str) -> str:
    """``url`` (``redis+sentinel://``) with ``waitaof=0,0``: promises given at once."""
    parts = urlsplit(url)
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("waitaof="))
    return urlunsplit(parts._replace(query="&".join(filter(None, [query, "waitaof=0,0"]))))


async def timed_roundtrips(
    client: Client, env: Env, to: str, n: int
) -> tuple[list[float], list[float]]:
    """Sequential local round trips: (submit -> result, submit call alone), in ms each. The
    submit returns once its write is durable; the node routes the message meanwhile."""
    total, submit = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        message = await client.submit_job(
            env.actor,
            ACTOR_ID,
            to=to,
            context_id=CONTEXT_ID,
            script_type="python",
            script=workload.SCRIPT,
        )
        t1 = time.perf_counter()
        [result] = await client.wait_results(message, timeout_s=RESULT_TIMEOUT_S)
        total.append((time.perf_counter() - t0) * 1000)
        submit.append((t1 - t0) * 1000)
        if not result.ok:
            raise RuntimeError(f"round-trip job failed: {result.status} {result.reason}")
    return total, submit


async def primary_calls(servers: ReplicatedSet) -> Counter[str]:
    """Calls of each command the set's first data server (its primary until a failover) has
    served so far, by lower-case name (the durable-ack tests count ``waitaof`` with it too)."""
    primary = coredis.Redis(
        host="127.0.0.1",
        port=servers.data_ports[0],
        username=SENTINEL,
        password=servers.passwords[SENTINEL],
        decode_responses=True,
    )
    async with primary:
        return call_counts(dict(await primary.info("commandstats")))


def _watched(
    label: str, node: BenchNode, servers: ReplicatedSet, tcp_valkey: int
) -> dict[str, int]:
    """The processes whose CPU a concurrent run of ``label`` counts (run_throughput's
    ``watch``): the node (with its job processes) and its store's servers (``tcp_valkey``:
    the single Valkey the ``tcp`` node reaches over TCP)."""
    if label == "unix":
        return {"node": node.pid, "valkey": node.valkey_pid}
    if label == "tcp":
        return {"node": node.pid, "valkey": tcp_valkey}
    if label != "repl":
        return {}
    primary, *replicas = (c.proc.pid for c in servers.data if c.proc is not None)
    watch = {"node": node.pid, "valkey primary": primary}
    watch |= {f"valkey replica {i}": pid for i, pid in enumerate(replicas, 1)}
    sentinels = [c.proc.pid for c in servers.watchers if c.proc is not None]
    return watch | {f"sentinel {i}": pid for i, pid in enumerate(sentinels, 1)}


def _cpu_ms(done: Throughput) -> dict[str, float]:
    """CPU per job (ms) by process, the replicas and the Sentinels each summed, the total
    of every process (the bench client included), and the node's job processes by kind
    (runners, sandboxes: outside the total, which counts them once as the node's)."""
    out: dict[str, float] = {}
    split: dict[str, float] = {}  # "node job processes" by kind, already counted in it
    for name, seconds in done.cpu.items():
        ms = seconds * 1000 / done.n
        if name.startswith("node job processes:"):
            split[name] = ms
            continue
        group = "valkey replicas" if name.startswith("valkey replica") else name
        group = "sentinels" if name.startswith("sentinel") else group
        out[group] = out.get(group, 0.0) + ms
    out["total"] = sum(out.values())
    return out | split


def cpu_bounds(
    unix: dict[str, float], tcp: dict[str, float], repl: dict[str, float]
) -> tuple[float, float]:
    """What one run's CPU per job (:func:`_cpu_ms` of the concurrent ``unix``, ``tcp`` and
    ``repl`` runs) allows the throughput ratio to the single Valkey over a unix socket, on
    cores every process shares:

    - the ceiling with the replicas on these cores: ``unix`` over ``tcp`` plus the replicas'
      CPU alone, i.e. the ratio if replication cost the node, its job processes, the primary
      and the client nothing beyond reaching the store over TCP (as the Sentinels name it).
      Each of them costs more (``WAITAOF``s, the replication stream), so no change of the
      node can pass it while the replicas apply and fsync every write on the same cores;
    - the ratio with the replicas and Sentinels on other machines, as a deployment runs them:
      ``unix`` over the replicated CPU per job without theirs.

    A saturated run's jobs/s is the cores over the CPU per job, so both read as throughput
    ratios (case 9 measures the real one beside them)."""
    replicas = repl.get("valkey replicas", 0.0)
    ceiling = unix["total"] / (tcp["total"] + replicas)
    return ceiling, unix["total"] / (repl["total"] - replicas - repl.get("sentinels", 0.0))


async def case_replicated(env: Env) -> list[Row]:
    home = env.base / "repl"
    home.mkdir(parents=True, exist_ok=True)
    servers = ReplicatedSet(env.base / "repl-store", ensure_secrets(home, SET_ROLES))
    single_tcp = None
    try:
        await trio.to_thread.run_sync(servers.start)
        single_tcp = env.procs.start_valkey(env.base / "tcp-store")
        unix = await _node(env, "unix", None)
        tcp = await _node(env, "tcp", None, redis_url=single_tcp.spec.url)
        repl = await _node(env, "repl", servers)
        nodes = {"unix": unix, "tcp": tcp, "repl": repl}
        return await _measure(env, nodes, servers, single_tcp.pid)
    finally:
        for node in [n for n in env.procs.nodes if n.name in ("unix", "tcp", "repl")]:
            await env.procs.stop_node(node)
        if single_tcp is not None:
            env.procs.stop_valkey(single_tcp)
        await trio.to_thread.run_sync(servers.stop)


async def _measure(
    env: Env, nodes: dict[str, BenchNode], servers: ReplicatedSet, tcp_valkey: int
) -> list[Row]:
    plan = env.plan
    n_rt = plan.roundtrips if plan.quick else min(plan.roundtrips, 200)
    n_jobs = plan.jobs if plan.quick else min(plan.jobs, 1000)
    p50: dict[str, list[float]] = {label: [] for label in LABELS}
    submit_p50: dict[str, list[float]] = {label: [] for label in LABELS}
    rate: dict[str, list[float]] = {label: [] for label in LABELS}
    per_job: list[float] = []
    cpu: dict[str, dict[str, list[float]]] = {"unix": {}, "tcp": {}, "repl": {}}
    repl_url = nodes["repl"].redis_url
    async with (
        bench_client(env, nodes["unix"].redis_url) as cu,
        bench_client(env, nodes["tcp"].redis_url) as ct,
        bench_client(env, repl_url) as cr,
        bench_client(env, no_wait(repl_url)) as cn,
    ):
        clients: dict[str, tuple[Client, BenchNode]] = {
            "unix": (cu, nodes["unix"]),
            "tcp": (ct, nodes["tcp"]),
            "repl-nowait": (cn, nodes["repl"]),
            "repl": (cr, nodes["repl"]),
        }
        for client, node in clients.values():
            await roundtrips(client, env.actor, node.node_id, 10)  # connections, workers
        for run in range(plan.runs):  # alternated (and rotated): a noisy machine hurts all alike
            order = LABELS[run % len(LABELS) :] + LABELS[: run % len(LABELS)]
            for label in order:
                client, node = clients[label]
                times, submits = await timed_roundtrips(client, env, node.node_id, n_rt)
                p50[label].append(percentile(times, 50))
                submit_p50[label].append(percentile(submits, 50))
                before = await primary_calls(servers) if label == "repl" else {}
                watch = _watched(label, node, servers, tcp_valkey)
                done = await run_throughput(client, env.actor, node.node_id, n_jobs, watch)
                rate[label].append(done.rate)
                for name, ms in _cpu_ms(done).items() if label in cpu else ():
                    cpu[label].setdefault(name, []).append(ms)
                if label == "repl":
                    after = await primary_calls(servers)
                    waits = after.get("waitaof", 0) - before.get("waitaof", 0)
                    per_job.append(waits / n_jobs)

    def delta(a: str, b: str) -> list[float]:
        return [x - y for x, y in zip(p50[a], p50[b], strict=True)]

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(rate[a], rate[b], strict=True)]

    note = f"WAITAOF 1 1; n={n_rt} round trips, N={n_jobs} jobs per run"
    rows = [Row(CASE, f"local p50, {label}", "ms", p50[label]) for label in LABELS]
    rows[-1].note = note
    rows += [Row(CASE, f"submit call p50, {label}", "ms", submit_p50[label]) for label in LABELS]
    rows += [
        Row(CASE, "p50: tcp - unix (transport)", "ms", delta("tcp", "unix")),
        Row(CASE, "p50: repl-nowait - tcp (replication)", "ms", delta("repl-nowait", "tcp")),
        Row(CASE, "p50: repl - repl-nowait (WAITAOF)", "ms", delta("repl", "repl-nowait")),
        Row(CASE, "durable-ack p50 cost (repl - unix)", "ms", delta("repl", "unix"), target="<= 2"),
    ]
    rows += [Row(CASE, f"jobs/s, {label}", "jobs/s", rate[label]) for label in LABELS]
    rows += [
        Row(CASE, "throughput: tcp / unix", "x", ratio("tcp", "unix")),
        Row(CASE, "throughput: repl-nowait / tcp", "x", ratio("repl-nowait", "tcp")),
        Row(CASE, "throughput: repl / repl-nowait", "x", ratio("repl", "repl-nowait")),
        Row(CASE, "throughput ratio (repl / unix)", "x", ratio("repl", "unix"), target=">= 0.8"),
        Row(
            CASE,
            "WAITAOF calls per job (repl, concurrent)",
            "calls",
            per_job,
            # a WAITAOF unanswered 1 ms is nudged by another (bus/store/durable.py): counted too
            note=f"median {statistics.median(per_job):.3g}, nudges included" if per_job else "",
        ),
    ]
    bounds = [
        cpu_bounds(
            *({name: v[i] for name, v in cpu[label].items()} for label in ("unix", "tcp", "repl"))
        )
        for i in range(len(cpu["unix"].get("total", [])))
    ]
    rows += [
        Row(
            CASE,
            "throughput ceiling, replicas on these cores (CPU)",
            "x",
            [ceiling for ceiling, _ in bounds],
            note="unix / (tcp + replicas), CPU per job: no node change passes it here",
        ),
        Row(
            CASE,
            "throughput ratio, replicas on other machines (CPU)",
            "x",
            [off for _, off in bounds],
            note="unix / (repl - replicas - Sentinels), CPU per job",
        ),
    ]
    rows += [
        Row(CASE, f"CPU per job, {label}: {name}", "ms", values)
        for label, by_name in cpu.items()
        for name, values in by_name.items()
    ]
    return rows
