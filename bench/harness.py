"""Bench plumbing: node subprocesses, external Valkeys, /proc readings, stats, the result table.

Nothing here measures anything by itself; ``bench/cases.py`` does.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.client.api import Client  # noqa: E402
from crypto import KeyPair, read_key_file  # noqa: E402
from node.config import DEFAULT_RUNNERS  # noqa: E402
from node.host.home import init_home  # noqa: E402
from node.host.launch import Ready, drain, start_node_process, wire_mesh  # noqa: E402
from node.host.valkey import ValkeyProcess, ValkeySpec, free_port  # noqa: E402

ACTOR_ID = 42
CONTEXT_ID = 2
READY_TIMEOUT_S = 60
STOP_GRACE_S = 15
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- /proc ---------------------------------------------------------------------------------------


def proc_status_kb(pid: int, field_name: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM, ...); 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rss_mb(pid: int) -> float:
    return proc_status_kb(pid, "VmRSS") / 1024


def hwm_mb(pid: int) -> float:
    return proc_status_kb(pid, "VmHWM") / 1024


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(x) for x in text]
    except OSError:
        pass
    return out


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds of a process (self) and of its reaped children (see job_cpu_s)."""

    self_s: float
    children_s: float


def cpu_times(pid: int) -> CpuTimes:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return CpuTimes(0.0, 0.0)
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); utime=14, stime=15, cutime=16, cstime=17 (1-based)
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return CpuTimes((utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK)


def job_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s job processes: every descendant except valkey-server (runner
    processes, the warm python workers, what those start), live or reaped. A live process
    counts itself and its reaped children; a reaped one is in its parent's children time. Taken
    before and after a run, the difference counts a process that lived through the run,
    started in it, or was recycled."""
    return sum(job_cpu_split(pid))


def job_cpu_split(pid: int) -> tuple[float, float]:
    """:func:`job_cpu_s` as (runner processes, sandboxes): a sandbox is a runner's child
    (bwrap, or the worker itself under isolation "none") with everything under it, and a
    runner's reaped children are the sandboxes it retired (node/sandbox/reap.py reaps them up
    the tree); a runner the node replaced counts on the runners' side."""
    runners, boxes = cpu_times(pid).children_s, 0.0
    todo = [(child, False) for child in children_of(pid)]
    while todo:
        child, boxed = todo.pop()
        name = proc_name(child)
        if "valkey" in name or "redis" in name:
            continue
        times = cpu_times(child)
        inside = boxed or name == "bwrap" or b"inner.py" in _cmdline(child)
        if inside:
            boxes += times.self_s + times.children_s
        else:
            runners += times.self_s
            boxes += times.children_s
        todo += [(grandchild, inside) for grandchild in children_of(child)]
    return runners, boxes


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# -- nodes ----------


@dataclass
class BenchNode:
    name: str
    home: Path
    proc: trio.Process
    node_id: str = ""
    ws_url: str = ""
    redis_url: str = ""
    valkey_pid: int = 0  # the embedded valkey-server child (0 with an external Redis)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)


# what a round trip's CPU is split into (bench/trace.py, bench/wakes.py), in lone_cpu_s's order
LONE_CPU_NAMES = ("client", "node", "runners", "sandboxes", "valkey")


def lone_cpu_s(node: BenchNode) -> tuple[float, ...]:
    """CPU seconds so far of this process (the client), of ``node``'s own process, its runner
    processes, their sandboxes, and its Valkey (:data:`LONE_CPU_NAMES`)."""
    runners, boxes = job_cpu_split(node.pid)
    valkey = cpu_times(node.valkey_pid).self_s if node.valkey_pid else 0.0
    return own_cpu_s(), cpu_times(node.pid).self_s, runners, boxes, valkey


def lone_cpu_line(before: tuple[float, ...], after: tuple[float, ...], n: int) -> str:
    """What :func:`lone_cpu_s` counted between ``before`` and ``after``, per one of ``n``
    round trips, in ms (10 ms ticks)."""
    per = ((y - x) * 1000 / n for x, y in zip(before, after, strict=True))
    parts = (f" {name} {ms:.3f}," for name, ms in zip(LONE_CPU_NAMES, per, strict=True))
    return "CPU per round trip, ms (10 ms ticks):" + "".join(parts)


# The nodes' slots: python as a node's default has them (one per core, node/config), so the
# figures are those of a node as `hero-node init` sets it up on this machine; sh, unused, one.
RUNNERS = {"python": DEFAULT_RUNNERS["python"], "sh": 1}


def make_home(
    home: Path, name: str, runners: dict[str, int], redis_url: str = "", actor_id: int = 1
) -> Path:
    init_home(
        home, name=name, listen_port=0, runners=runners, redis_url=redis_url, actor_id=actor_id
    )
    return home


def node_key(home: Path) -> KeyPair:
    return read_key_file(home / "node.key")


class Procs:
    """Every process the bench starts, so that a finally can stop them all."""

    def __init__(self) -> None:
        self.nodes: list[BenchNode] = []
        self.valkeys: list[ValkeyProcess] = []

    async def start_node(self, nursery: trio.Nursery, name: str, home: Path) -> BenchNode:
        proc, ready = await start_node_process(
            home, log_level="warning", cwd=ROOT, ready_timeout_s=READY_TIMEOUT_S
        )
        node = BenchNode(name, home, proc, ready.node_id, ready.ws_url, ready.redis_url)
        self.nodes.append(node)
        assert proc.stdout is not None
        nursery.start_soon(drain, proc.stdout)
        for child in children_of(node.pid):
            if "valkey" in proc_name(child) or "redis" in proc_name(child):
                node.valkey_pid = child
        return node

    async def stop_node(self, node: BenchNode) -> None:
        """SIGTERM, wait, SIGKILL; then make sure its embedded valkey-server is gone too."""
        with trio.CancelScope(shield=True):
            if node.proc.returncode is None:
                node.proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE_S):
                    await node.proc.wait()
                if node.proc.returncode is None:
                    node.proc.kill()
                    await node.proc.wait()
            if node.valkey_pid:
                await _reap_pid(node.valkey_pid)
        if node in self.nodes:
            self.nodes.remove(node)

    def start_valkey(self, data_dir: Path, *, persist: bool = True) -> ValkeyProcess:
        """A Valkey with the node's own argv (AOF everysec when ``persist``), on a free port."""
        last: Exception | None = None
        for _ in range(3):
            server = ValkeyProcess(ValkeySpec(port=free_port(), data_dir=data_dir, persist=persist))
            try:
                server.start()
            except Exception as exc:  # noqa: BLE001 - port race: try another
                last = exc
                continue
            self.valkeys.append(server)
            return server
        raise RuntimeError(f"could not start valkey-server: {last}")

    def stop_valkey(self, server: ValkeyProcess) -> None:
        server.stop()
        if server in self.valkeys:
            self.valkeys.remove(server)

    async def stop_all(self) -> None:
        with trio.CancelScope(shield=True):
            for node in list(self.nodes):
                await self.stop_node(node)
            for server in list(self.valkeys):
                self.stop_valkey(server)


async def _reap_pid(pid: int) -> None:
    """Wait for a process we cannot ``wait()`` on (a grandchild) to go; SIGKILL it after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _is_zombie(pid):  # also True once /proc/<pid> is gone
            return
        await trio.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


async def wire(nodes: list[BenchNode], actor: KeyPair) -> None:
    """Every node knows every other (with its address), the bench actor, and context 2."""
    ready = [(n.name, Ready(n.node_id, n.ws_url, n.redis_url)) for n in nodes]
    await wire_mesh(ready, actor, ACTOR_ID, CONTEXT_ID)


async def wait_served(client: Client, actor: KeyPair, to: str, timeout_s: float = 60) -> None:
    """One job through the path ``to`` (the registry picks up contexts/peers asynchronously)."""
    message = await client.submit_job(
        actor,
        ACTOR_ID,
        to=to,
        context_id=CONTEXT_ID,
        script_type="python",
        script="print(1)",
    )
    [result] = await client.wait_results(message, timeout_s=timeout_s)
    if not result.ok:
        raise RuntimeError(f"warm-up job failed: {result.status} {result.reason}")


# -- stats and table ----------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


@dataclass
class Row:
    case: str
    metric: str
    unit: str
    samples: list[float]
    target: str = ""  # e.g. ">= 4000"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def verdict(self) -> str:
        if not self.target or not self.samples:
            return ""
        op, _, num = self.target.partition(" ")
        value, limit = self.median, float(num)
        ok = value >= limit if op == ">=" else value <= limit
        return "ok" if ok else "MISS"

    def as_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "metric": self.metric,
            "unit": self.unit,
            "median": self.median if self.samples else None,
            "min": min(self.samples) if self.samples else None,
            "max": max(self.samples) if self.samples else None,
            "samples": self.samples,
            "target": self.target,
            "verdict": self.verdict,
            "note": self.note,
            **({"extra": self.extra} if self.extra else {}),
        }


def fmt(value: float) -> str:
    if value != value:  # nan
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render_table(rows: list[Row]) -> str:
    header = ("case", "metric", "median", "min", "max", "target", "verdict")
    lines = []
    body = []
    for r in rows:
        lo = fmt(min(r.samples)) if r.samples else "-"
        hi = fmt(max(r.samples)) if r.samples else "-"
        target = f"{r.target} {r.unit}".strip() if r.target else ""
        metric = f"{r.metric} [{r.unit}]" if r.unit else r.metric
        body.append((r.case, metric, fmt(r.median), lo, hi, target, r.verdict))
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)
    ]
    right = {2, 3, 4}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    lines.append(line(header))
    lines.append("  ".join("-" * w for w in widths))
    lines += [line(b) for b in body]
    notes = [(r.case, r.metric, r.note) for r in rows if r.note]
    if notes:
        lines.append("")
        lines += [f"  note [{c} / {m}]: {n}" for c, m, n in notes]
    return "\n".join(lines)
