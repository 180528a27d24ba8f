"""Case 9: what "acknowledged means durable on two machines" costs.

Two nodes side by side, each alone: one on its embedded single Valkey (AOF everysec, promises
given at once), one on a replicated store (a primary, two replicas with ``appendfsync always``,
three Sentinels: node/host/replicated.py) whose promises wait for ``WAITAOF 1 1``. The same
local round trips (submit -> result, sequential) and the same concurrent throughput run on each,
alternated run by run so that a noisy machine hurts both alike; the rows give each figure and the
replicated one as a ratio (p50: the difference in ms) with the issue's targets.
"""

from __future__ import annotations

import trio

from bench.cases import Env, bench_client, roundtrips, run_throughput
from bench.harness import BenchNode, Row, percentile, wait_served, wire
from node.config.store import StoreConfig
from node.host.acl import ensure_secrets
from node.host.home import init_home
from node.host.replicated import SET_ROLES, ReplicatedSet

CASE = "9 replicated"
RUNNERS = {"python": 4, "sh": 1}


async def _node(env: Env, name: str, servers: ReplicatedSet | None) -> BenchNode:
    home = env.base / name
    store = None
    if servers is not None:
        store = StoreConfig(sentinels=servers.sentinel_addresses)
    init_home(home, name=name, listen_port=0, runners=RUNNERS, console_listen="", store=store)
    node = await env.procs.start_node(env.nursery, name, home)
    await wire([node], env.actor)
    async with bench_client(env, node.redis_url) as client:
        with trio.fail_after(60):
            await wait_served(client, env.actor, node.node_id)
    return node


async def case_replicated(env: Env) -> list[Row]:
    home = env.base / "repl"
    home.mkdir(parents=True, exist_ok=True)
    servers = ReplicatedSet(env.base / "repl-store", ensure_secrets(home, SET_ROLES))
    try:
        await trio.to_thread.run_sync(servers.start)
        single = await _node(env, "single", None)
        repl = await _node(env, "repl", servers)
        return await _measure(env, single, repl)
    finally:
        for node in [n for n in env.procs.nodes if n.name in ("single", "repl")]:
            await env.procs.stop_node(node)
        await trio.to_thread.run_sync(servers.stop)


async def _measure(env: Env, single: BenchNode, repl: BenchNode) -> list[Row]:
    plan = env.plan
    n_rt = plan.roundtrips if plan.quick else min(plan.roundtrips, 200)
    n_jobs = plan.jobs if plan.quick else min(plan.jobs, 1000)
    p50: dict[str, list[float]] = {"single": [], "repl": []}
    rate: dict[str, list[float]] = {"single": [], "repl": []}
    async with (
        bench_client(env, single.redis_url) as cs,
        bench_client(env, repl.redis_url) as cr,
    ):
        for client, node in ((cs, single), (cr, repl)):
            await roundtrips(client, env.actor, node.node_id, 10)  # connections, workers
        for _ in range(plan.runs):  # alternated: a noisy machine hurts both alike
            for label, client, node in (("single", cs, single), ("repl", cr, repl)):
                times = await roundtrips(client, env.actor, node.node_id, n_rt)
                p50[label].append(percentile(times, 50))
                done = await run_throughput(client, env.actor, node.node_id, n_jobs)
                rate[label].append(done.rate)
    delta = [r - s for r, s in zip(p50["repl"], p50["single"], strict=True)]
    ratio = [r / s for r, s in zip(rate["repl"], rate["single"], strict=True)]
    note = f"WAITAOF 1 1; n={n_rt} round trips, N={n_jobs} jobs per run"
    return [
        Row(CASE, "local p50, single Valkey", "ms", p50["single"]),
        Row(CASE, "local p50, replicated + WAITAOF", "ms", p50["repl"], note=note),
        Row(CASE, "durable-ack p50 cost (replicated - single)", "ms", delta, target="<= 2"),
        Row(CASE, "jobs/s, single Valkey", "jobs/s", rate["single"]),
        Row(CASE, "jobs/s, replicated + WAITAOF", "jobs/s", rate["repl"]),
        Row(CASE, "throughput ratio (replicated / single)", "x", ratio, target=">= 0.8"),
    ]
