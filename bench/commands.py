"""Valkey commands and round trips per job, per process (case 5 b): local and cross-node.

Counted on a pair of fresh nodes whose Valkeys are plain TCP valkey-servers (each node pointed at
its own with ``redis_url``, like the backlog case): over TCP every connection has its own port,
which ``/proc/<pid>/fd`` + ``/proc/net/tcp`` map to the process that holds it (the bench client,
a node, that node's runner processes). The embedded Valkey listens on a unix socket only, where
every connection shows the same address.

Three counts per Valkey, each a delta over one throughput run of N jobs:
- ``INFO commandstats``: every command executed, those inside scripts included (the total);
- ``CLIENT LIST tot-cmds`` per connection: the same, split by process (scripts' inner commands
  are counted on the connection that called the script);
- ``MONITOR``: the top-level commands each connection sent (``lua`` lines are a script's inner
  commands): the requests, i.e. an upper bound of round trips (a pipeline is one round trip but
  shows each of its commands).

The measuring connections are the bench's own (redis-py, sync, in threads) and are left out.
MONITOR slows Valkey down, so these runs say nothing about speed.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import trio

from bench.harness import (
    RUNNERS,
    BenchNode,
    Procs,
    Row,
    children_of,
    make_home,
    wait_served,
    wire,
)
from bus.client.api import open_client
from crypto import KeyPair
from node.host.valkey import ValkeyProcess

CLIENT = "bench client"
# commands the measuring connection itself sends between the two INFO snapshots
_OWN = Counter({"info": 1, "client|list": 2, "echo": 1})


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _descendants(pid: int) -> list[int]:
    out, stack = [], children_of(pid)
    while stack:
        child = stack.pop()
        out.append(child)
        stack += children_of(child)
    return out


def port_owners(processes: dict[str, list[int]]) -> dict[int, str]:
    """Local TCP port -> label, for every socket held by the labelled processes."""
    by_inode = {}
    for label, pids in processes.items():
        for pid in pids:
            for inode in _socket_inodes(pid):
                by_inode[inode] = label
    owners: dict[int, str] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            label = by_inode.get(cols[9])
            if label is not None:
                owners[int(cols[1].rsplit(":", 1)[1], 16)] = label
    return owners


def _port(addr: str) -> int:
    try:
        return int(addr.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def call_counts(commandstats: dict[str, Any]) -> Counter[str]:
    """Calls of each command, by lower-case name, from ``INFO commandstats`` as a client
    decodes it (``cmdstat_<name>`` -> its fields): case 5 here, case 9's primary
    (bench/replicated.py), bench/link_ack.py and the durable-ack tests read it alike."""
    out: Counter[str] = Counter()
    for name, value in commandstats.items():
        if isinstance(value, dict) and "calls" in value:
            out[name.removeprefix("cmdstat_")] += int(value["calls"])
    return out


class Watch:
    """One Valkey's counters over a run: commandstats, tot-cmds per connection, MONITOR."""

    def __init__(self, server: ValkeyProcess) -> None:
        self.port = server.spec.port
        self.conn = redis.Redis(port=self.port, decode_responses=True)
        self.own_id = int(self.conn.client_id())
        self.own_port = _port(str(self.conn.client_info().get("addr", "")))
        self.marker = f"bench-monitor-end-{uuid.uuid4().hex}"
        self.top: Counter[int] = Counter()  # client port -> top-level commands (MONITOR)
        self.top_names: Counter[str] = Counter()
        self._ready = threading.Event()
        self.before: Counter[str] = Counter()
        self.conns0: dict[int, tuple[int, int]] = {}

    def _commandstats(self) -> Counter[str]:
        return call_counts(self.conn.info("commandstats"))

    def _conns(self) -> dict[int, tuple[int, int]]:
        """client id -> (client port, tot-cmds), without the measuring connections."""
        out = {}
        for c in self.conn.client_list():
            cid = int(c["id"])
            if cid != self.own_id and c.get("cmd") != "monitor":
                out[cid] = (_port(str(c.get("addr", ""))), int(c.get("tot-cmds", 0)))
        return out

    def monitor(self) -> None:
        """Blocking (a thread): count top-level commands per client port until the marker."""
        conn = redis.Redis(port=self.port, decode_responses=True)
        with conn.monitor() as m:
            self._ready.set()
            for cmd in m.listen():
                if cmd.get("client_type") == "lua":
                    continue
                if self.marker in str(cmd.get("command", "")):
                    return
                self.top[_port(f"x:{cmd.get('client_port', '0')}")] += 1
                self.top_names[str(cmd.get("command", "")).split(" ", 1)[0].lower()] += 1

    def start(self) -> None:
        self._ready.wait(10)
        self.before = self._commandstats()
        self.conns0 = self._conns()

    def stop(self) -> tuple[Counter[str], dict[int, int]]:
        """(commandstats delta, tot-cmds delta by client port)."""
        conns1 = self._conns()
        self.conn.echo(self.marker)
        delta = self._commandstats() - self.before - _OWN
        by_port = {}
        for cid, (port, cmds) in conns1.items():
            by_port[port] = cmds - self.conns0.get(cid, (port, 0))[1]
        return delta, by_port


@dataclass
class Counts:
    """Per job, summed over the Valkeys watched."""

    n: int
    total: Counter[str] = field(default_factory=Counter)  # by command, scripts' inner included
    by_process: Counter[str] = field(default_factory=Counter)  # tot-cmds
    requests: Counter[str] = field(default_factory=Counter)  # MONITOR top-level
    unowned: int = 0  # commands on connections no watched process held at the end

    def per_job(self, c: Counter[str]) -> dict[str, float]:
        return {k: v / self.n for k, v in c.most_common()}


async def count_run(
    servers: list[ValkeyProcess],
    processes: dict[str, list[int]],
    run: Any,
    n: int,
) -> Counts:
    """Run ``run()`` (N jobs to their results) with every counter of ``servers`` around it."""
    watches = [Watch(s) for s in servers]
    counts = Counts(n)
    async with trio.open_nursery() as nursery:
        for w in watches:
            nursery.start_soon(trio.to_thread.run_sync, w.monitor)
        for w in watches:
            await trio.to_thread.run_sync(w.start)
        await run()
        await trio.sleep(0.3)  # acks and bookkeeping that follow the last result
        owners = port_owners(processes)
        for w in watches:
            delta, by_port = await trio.to_thread.run_sync(w.stop)
            counts.total += delta
            for port, cmds in by_port.items():
                label = owners.get(port)
                if label is None:
                    counts.unowned += cmds
                else:
                    counts.by_process[label] += cmds
    for w in watches:
        for port, calls in w.top.items():
            if port == w.own_port:
                continue
            counts.requests[owners.get(port, "other")] += calls
        w.conn.close()
    return counts


@dataclass
class TcpPair:
    a: BenchNode
    b: BenchNode
    va: ValkeyProcess
    vb: ValkeyProcess

    def processes(self, client_pid: int) -> dict[str, list[int]]:
        return {
            CLIENT: [client_pid],
            "node A": [self.a.pid],
            "runners A": _descendants(self.a.pid),
            "node B": [self.b.pid],
            "runners B": _descendants(self.b.pid),
        }


async def start_tcp_pair(
    procs: Procs, nursery: trio.Nursery, base: Path, actor: KeyPair
) -> TcpPair:
    """Nodes A and B (bench/harness.py ``RUNNERS``), each on its own TCP valkey-server, wired,
    warmed up."""
    servers, nodes = [], []
    for name, actor_id in (("a", 1), ("b", 2)):
        server = procs.start_valkey(base / f"cmd-valkey-{name}", persist=True)
        servers.append(server)
        home = make_home(
            base / f"cmd-{name}",
            f"cmd{name}",
            RUNNERS,
            redis_url=server.url,
            actor_id=actor_id,
        )
        nodes.append(await procs.start_node(nursery, f"cmd{name}", home))
    await wire(nodes, actor)
    async with open_client(nodes[0].redis_url) as client:
        with trio.fail_after(60):
            await wait_served(client, actor, nodes[0].node_id)
            await wait_served(client, actor, nodes[1].node_id)
    return TcpPair(nodes[0], nodes[1], servers[0], servers[1])


def count_rows(case: str, label: str, target: str, samples: list[Counts]) -> list[Row]:
    """Rows for one path (local or cross-node): the total per job with its target, then per
    process the commands (scripts' inner included) and the requests (top-level commands)."""
    n_total = sum(c.n for c in samples)
    total: Counter[str] = sum((c.total for c in samples), Counter())
    shown = [(k, v / n_total) for k, v in total.most_common() if v / n_total >= 0.05]
    top = ", ".join(f"{k} {v:.2f}" for k, v in shown)
    unowned = sum(c.unowned for c in samples)
    runs = len(samples)
    reqs: Counter[str] = sum((c.requests for c in samples), Counter())
    cmds: Counter[str] = sum((c.by_process for c in samples), Counter())
    per_process = ", ".join(
        f"{k} {cmds[k] / n_total:.1f} / {v / n_total:.2f}" for k, v in sorted(reqs.items()) if v
    )
    note = f"per process, commands / requests per job ({runs} runs): {per_process}"
    note += f"; by command: {top}"
    if unowned:
        note += f"; {unowned / n_total:.1f} per job on connections closed before the count"
    rows = [
        Row(
            case,
            f"Valkey commands per {label} job, all connections, scripts' inner included "
            f"(N={samples[0].n})",
            "cmds/job",
            [sum(c.total.values()) / c.n for c in samples],
            target,
            note,
            extra={"per_job_by_command": {k: v / n_total for k, v in total.items()}},
        )
    ]
    # a process that did (almost) nothing per job here (node B of a local run) is left out
    names = sorted(
        {k for c in samples for k, v in (c.by_process + c.requests).items() if v / c.n >= 0.01}
    )
    for name in names:
        rows.append(
            Row(
                case,
                f"  {label}, {name}: commands per job (scripts' inner included)",
                "cmds/job",
                [c.by_process.get(name, 0) / c.n for c in samples],
            )
        )
        rows.append(
            Row(
                case,
                f"  {label}, {name}: requests per job (top-level; round trips <= this)",
                "reqs/job",
                [c.requests.get(name, 0) / c.n for c in samples],
            )
        )
    return rows
