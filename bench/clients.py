#!/usr/bin/env python3
"""Redis client micro-benchmark under trio: coredis (the store's client) vs valkey-glide.

Starts its own valkey-server (the embedded binary, same argv as the node, no persistence) on a
free 127.0.0.1 port, then measures, for every client library that is importable here:

  seq-*        sequential awaited HSET (small hash) / LPUSH / EVALSHA (tiny Lua) from one task
  8tasks-*     the same from 8 concurrent tasks sharing one client
  pipe10/100   non-transactional pipelines of 10 / 100 commands (HSET, LPUSH, EVALSHA in turn)
  multi10      MULTI/EXEC transactions of 10 commands
  blmove-wake  a BLMOVE (with timeout) woken by an LPUSH from another client: latency p50/p99

CPU is time.process_time() of this python process (all its threads: glide's Rust runtime
threads count too); the server's CPU is not included. Every case is repeated --repeat times
(interleaved between clients, to spread the noise of a shared machine); the table shows the
median and the spread (min-max) of the CPU figure.

Besides the numbers it checks the behaviours the node depends on (reported as notes):
  * a command on the same client while a BLMOVE of that client is blocked (glide multiplexes
    one connection per client: the command waits behind the BLMOVE);
  * cancelling a blocked BLMOVE from trio (the node cancels its blocked pops on shutdown):
    how fast the await returns, whether the pop stays blocked on the server, and whether it
    then still moves an item that nobody receives;
  * RSS per process: baseline, after import, with one client, with a second client (the one a
    blocking pop would need), measured in fresh subprocesses.

valkey-glide is not a project dependency: run this with an interpreter that has it installed
(a throwaway venv) to include it; without it, it is skipped with a note.

    python bench/clients.py [--repeat 3] [--scale 1.0] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from node.host.valkey import ValkeyProcess, ValkeySpec, free_port, process_gone  # noqa: E402

LUA = "return redis.call('INCR', KEYS[1])"
HASH = {"state": "queued", "node": "a" * 64, "at": "1763800000000", "tries": "0"}
LIST = "bench:list"
COUNTER = "bench:counter"
SRC = "bench:src"
DST = "bench:dst"
N_HASH_KEYS = 64
CONCURRENCY = 8
KINDS = ("hset", "lpush", "evalsha")

Op = tuple[str, str]  # (kind, key)


def _ops(n: int) -> list[Op]:
    """n commands cycling HSET, LPUSH, EVALSHA (built outside the timed region)."""
    return [(KINDS[i % 3], _key(KINDS[i % 3], i)) for i in range(n)]


# -- client adapters --------------------------------------------------------------------------


class CoredisAdapter:
    """coredis as bus/store/connection.py uses it: decode_responses, client entered by a parent
    task."""

    name = "coredis"

    def __init__(self, client: Any) -> None:
        self.c = client
        self.sha = ""

    @staticmethod
    def version() -> str:
        import coredis

        return str(coredis.__version__)

    @staticmethod
    @asynccontextmanager
    async def open(url: str) -> AsyncIterator[CoredisAdapter]:
        import coredis

        client = coredis.Redis.from_url(url, decode_responses=True)
        async with client:
            a = CoredisAdapter(client)
            a.sha = str(await client.script_load(LUA))
            yield a

    async def hset(self, key: str) -> Any:
        return await self.c.hset(key, HASH)

    async def lpush(self, key: str) -> Any:
        return await self.c.lpush(key, ["v"])

    async def evalsha(self, key: str) -> Any:
        return await self.c.evalsha(self.sha, keys=[key])

    async def batch(self, ops: list[Op], transaction: bool) -> list[Any]:
        async with self.c.pipeline(transaction=transaction) as pipe:
            pending = [
                pipe.hset(k, HASH)
                if kind == "hset"
                else pipe.lpush(k, ["v"])
                if kind == "lpush"
                else pipe.evalsha(self.sha, keys=[k])
                for kind, k in ops
            ]
        return [await p for p in pending]

    async def blmove(self, timeout_s: float) -> str | None:
        from coredis.tokens import PureToken

        v = await self.c.blmove(SRC, DST, PureToken.RIGHT, PureToken.LEFT, timeout_s)
        return None if v is None else str(v)

    async def push_src(self, value: str) -> None:
        await self.c.lpush(SRC, [value])

    async def ping(self) -> None:
        await self.c.ping()

    async def llen(self, key: str) -> int:
        return int(await self.c.llen(key))

    async def blocked_clients(self) -> int:
        info = await self.c.info("clients")
        return int(info["blocked_clients"])

    async def reset(self) -> None:
        await self.c.flushdb()


class GlideAdapter:
    """valkey-glide's async client (trio via anyio). One GlideClient = one multiplexed
    connection; request_timeout raised from its 250 ms default so a loaded machine does not
    turn into timeouts."""

    name = "glide"

    def __init__(self, client: Any) -> None:
        self.c = client
        self.script: Any = None
        self.sha = ""

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("valkey-glide")

    @staticmethod
    @asynccontextmanager
    async def open(url: str) -> AsyncIterator[GlideAdapter]:
        from glide import GlideClient, GlideClientConfiguration, Logger, LogLevel, NodeAddress
        from glide import Script as GlideScript

        Logger.set_logger_config(LogLevel.ERROR)
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        cfg = GlideClientConfiguration([NodeAddress(host, int(port))], request_timeout=5000)
        client = await GlideClient.create(cfg)
        try:
            a = GlideAdapter(client)
            a.script = GlideScript(LUA)
            a.sha = str(a.script.get_hash())
            await client.invoke_script(a.script, keys=[COUNTER])  # loads it
            yield a
        finally:
            with trio.CancelScope(shield=True):
                await client.close()

    async def hset(self, key: str) -> Any:
        return await self.c.hset(key, HASH)

    async def lpush(self, key: str) -> Any:
        return await self.c.lpush(key, ["v"])

    async def evalsha(self, key: str) -> Any:
        return await self.c.invoke_script(self.script, keys=[key])

    async def batch(self, ops: list[Op], transaction: bool) -> list[Any]:
        from glide import Batch

        b = Batch(is_atomic=transaction)
        for kind, k in ops:
            if kind == "hset":
                b.hset(k, HASH)
            elif kind == "lpush":
                b.lpush(k, ["v"])
            else:  # bare EVALSHA, as Store.scripts sends it (the script is loaded)
                b.custom_command(["EVALSHA", self.sha, "1", k])
        return list(await self.c.exec(b, raise_on_error=True) or [])

    async def blmove(self, timeout_s: float) -> str | None:
        from glide import ListDirection

        v = await self.c.blmove(SRC, DST, ListDirection.RIGHT, ListDirection.LEFT, timeout_s)
        return None if v is None else v.decode()

    async def push_src(self, value: str) -> None:
        await self.c.lpush(SRC, [value])

    async def ping(self) -> None:
        await self.c.ping()

    async def llen(self, key: str) -> int:
        return int(await self.c.llen(key))

    async def blocked_clients(self) -> int:
        raw = await self.c.custom_command(["INFO", "clients"])
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.splitlines():
            if line.startswith("blocked_clients:"):
                return int(line.split(":", 1)[1])
        raise RuntimeError("INFO clients without blocked_clients")

    async def reset(self) -> None:
        await self.c.custom_command(["FLUSHDB"])

    async def client_id(self) -> int:
        return int(await self.c.custom_command(["CLIENT", "ID"]))

    async def unblock(self, client_id: int) -> int:
        return int(await self.c.custom_command(["CLIENT", "UNBLOCK", str(client_id)]))


ADAPTERS: dict[str, tuple[str, Any]] = {
    "coredis": ("coredis", CoredisAdapter),
    "glide": ("glide", GlideAdapter),
}


def available() -> tuple[dict[str, Any], list[str]]:
    found: dict[str, Any] = {}
    notes: list[str] = []
    for name, (module, adapter) in ADAPTERS.items():
        if importlib.util.find_spec(module) is None:
            notes.append(f"{name}: not importable with {sys.executable}, skipped")
        else:
            found[name] = adapter
    return found, notes


# -- measurements -----------------------------------------------------------------------------


def _cmd(a: Any, kind: str) -> Callable[[str], Awaitable[Any]]:
    return {"hset": a.hset, "lpush": a.lpush, "evalsha": a.evalsha}[kind]


def _key(kind: str, i: int) -> str:
    return f"bench:h:{i % N_HASH_KEYS}" if kind == "hset" else LIST if kind == "lpush" else COUNTER


async def seq(a: Any, kind: str, n: int) -> tuple[float, float]:
    """(commands/s, CPU us/command) of n sequential awaited commands from one task."""
    fn = _cmd(a, kind)
    keys = [_key(kind, i) for i in range(n)]
    for k in keys[:50]:
        await fn(k)
    w0, c0 = time.perf_counter(), time.process_time()
    for k in keys:
        await fn(k)
    w, c = time.perf_counter() - w0, time.process_time() - c0
    return n / w, c / n * 1e6


async def concurrent(a: Any, kind: str, n: int) -> tuple[float, float]:
    """The same, from CONCURRENCY tasks sharing the client (n commands in all)."""
    fn = _cmd(a, kind)
    per = n // CONCURRENCY
    keys = [_key(kind, i) for i in range(per)]

    async def worker() -> None:
        for k in keys:
            await fn(k)

    for k in keys[:50]:
        await fn(k)
    w0, c0 = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    w, c = time.perf_counter() - w0, time.process_time() - c0
    total = per * CONCURRENCY
    return total / w, c / total * 1e6


async def batches(a: Any, size: int, rounds: int, transaction: bool) -> tuple[float, float]:
    """(commands/s, CPU us/command) of `rounds` pipelines (or MULTI/EXEC) of `size` commands."""
    ops = _ops(size)
    for _ in range(5):
        await a.batch(ops, transaction)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        res = await a.batch(ops, transaction)
    w, c = time.perf_counter() - w0, time.process_time() - c0
    assert len(res) == size, res
    total = size * rounds
    return total / w, c / total * 1e6


async def _until_blocked(probe: Any, want: int, limit_s: float = 5.0) -> bool:
    with trio.move_on_after(limit_s):
        while await probe.blocked_clients() < want:  # noqa: ASYNC110 - polls the server
            await trio.sleep(0.0005)
        return True
    return False


async def wake_latency(popper: Any, pusher: Any, tries: int) -> tuple[float, float]:
    """p50/p99 (us) from issuing an LPUSH on `pusher` to the BLMOVE on `popper` returning it.
    The push is sent only once the server reports the pop as blocked."""
    await pusher.reset()
    lat: list[float] = []
    for i in range(tries):
        box: dict[str, Any] = {}

        async def pop() -> None:
            box["v"] = await popper.blmove(5.0)  # noqa: B023 - awaited within this iteration
            box["t"] = time.perf_counter()  # noqa: B023

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pop)
            if not await _until_blocked(pusher, 1):
                raise RuntimeError("BLMOVE never blocked")
            t0 = time.perf_counter()
            await pusher.push_src(f"x{i}")
        if box["v"] != f"x{i}":
            raise RuntimeError(f"popped {box['v']!r}, expected x{i}")
        lat.append((box["t"] - t0) * 1e6)
    lat.sort()
    return statistics.median(lat), lat[min(len(lat) - 1, int(len(lat) * 0.99))]


async def same_client_during_block(a: Any, probe: Any) -> float:
    """ms a PING on client `a` takes while a 1 s BLMOVE of the same client is blocked."""
    await probe.reset()
    took = 0.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.blmove, 1.0)
        await _until_blocked(probe, 1)
        t0 = time.perf_counter()
        with trio.move_on_after(5):
            await a.ping()
        took = (time.perf_counter() - t0) * 1e3
    return took


async def cancel_blocked(a: Any, probe: Any) -> dict[str, Any]:
    """Cancel a blocked 3 s BLMOVE of client `a` from trio; what happens afterwards?"""
    await probe.reset()
    out: dict[str, Any] = {}
    done = trio.Event()
    scope = trio.CancelScope()
    ended: list[float] = []

    async def pop() -> None:
        with scope:
            await a.blmove(3.0)
        ended.append(time.perf_counter())
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop)
        await _until_blocked(probe, 1)
        t0 = time.perf_counter()
        scope.cancel()
        await done.wait()
        out["cancel_returns_ms"] = round((ended[0] - t0) * 1e3, 3)
        await trio.sleep(0.05)
        out["server_blocked_clients_50ms_after"] = await probe.blocked_clients()
        t1 = time.perf_counter()
        with trio.move_on_after(5):
            await a.ping()
        out["same_client_ping_after_cancel_ms"] = round((time.perf_counter() - t1) * 1e3, 1)
    # the pop is now either gone or timed out on the server: check whether an abandoned one
    # still takes an item (fresh block, cancel, then push)
    await probe.reset()
    scope2 = trio.CancelScope()
    done2 = trio.Event()

    async def pop2() -> None:
        with scope2:
            await a.blmove(3.0)
        done2.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop2)
        await _until_blocked(probe, 1)
        scope2.cancel()
        await done2.wait()
        await trio.sleep(0.05)
        await probe.push_src("orphan")
        await trio.sleep(0.1)
        out["pushed_item_left_in_source"] = await probe.llen(SRC)
        out["pushed_item_moved_by_cancelled_pop"] = await probe.llen(DST)
    with trio.move_on_after(5):
        await a.ping()  # let the client settle before the next case
    if hasattr(a, "unblock"):
        # workaround for a multiplexed client: on cancellation, CLIENT UNBLOCK the popper's
        # connection from another client (the server then answers the BLMOVE with nil)
        await probe.reset()
        popper_id = await a.client_id()
        scope3 = trio.CancelScope()
        done3 = trio.Event()

        async def pop3() -> None:
            try:
                with scope3:
                    await a.blmove(3.0)
            finally:
                with trio.CancelScope(shield=True):
                    await probe.unblock(popper_id)
                done3.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pop3)
            await _until_blocked(probe, 1)
            scope3.cancel()
            await done3.wait()
            t2 = time.perf_counter()
            with trio.move_on_after(5):
                await a.ping()
            out["with_client_unblock: same_client_ping_ms"] = round(
                (time.perf_counter() - t2) * 1e3, 1
            )
            await probe.push_src("orphan")
            await trio.sleep(0.1)
            out["with_client_unblock: item_left_in_source"] = await probe.llen(SRC)
    return out


# -- RSS probe (subprocess) -------------------------------------------------------------------


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_probe(name: str, url: str) -> None:
    """Child mode: print RSS (kB) and thread count at each step as one JSON line."""
    out: dict[str, Any] = {"base_kb": _rss_kb()}
    if name != "none":
        adapter = ADAPTERS[name][1]
        __import__(ADAPTERS[name][0])
        out["import_kb"] = _rss_kb()

        async def run() -> None:
            async with adapter.open(url) as a:
                for op in _ops(999):
                    await _cmd(a, op[0])(op[1])
                out["one_client_kb"] = _rss_kb()
                async with adapter.open(url) as b:
                    for op in _ops(99):
                        await _cmd(b, op[0])(op[1])
                    out["two_clients_kb"] = _rss_kb()
                    out["threads"] = len(os.listdir("/proc/self/task"))

        trio.run(run)
    else:
        trio.run(trio.sleep, 0)
        out["threads"] = len(os.listdir("/proc/self/task"))
    print(json.dumps(out))


def rss_of(name: str, url: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--rss-probe", name, "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def package_mb(module: str) -> float:
    """Disk size of a module's package directory (not its dependencies)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return 0.0
    total = 0
    for loc in spec.submodule_search_locations:
        for dirpath, _dirs, files in os.walk(loc):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total / 1e6


# -- driver -----------------------------------------------------------------------------------


async def one_round(name: str, adapter: Any, url: str, scale: float, tries: int) -> dict:
    """All throughput/CPU cases and the wake-up latency for one client; {case: (rate, cpu)}."""
    res: dict[str, Any] = {}
    n_seq = max(300, int(3000 * scale))
    async with adapter.open(url) as a:
        await a.reset()
        for kind in KINDS:
            res[f"seq-{kind}"] = await seq(a, kind, n_seq)
        for kind in KINDS:
            res[f"8tasks-{kind}"] = await concurrent(a, kind, n_seq * 2)
        await a.reset()
        await a.evalsha(COUNTER)  # the script survives FLUSHDB; keep the key warm
        res["pipe10"] = await batches(a, 10, max(30, int(300 * scale)), False)
        res["pipe100"] = await batches(a, 100, max(5, int(50 * scale)), False)
        res["multi10"] = await batches(a, 10, max(30, int(300 * scale)), True)
        await a.reset()
        # blocking pop: coredis takes a pool connection of its own for it (as the store does),
        # glide needs a second client (a BLMOVE holds the multiplexed connection)
        if name == "glide":
            async with adapter.open(url) as popper:
                res["blmove-wake"] = await wake_latency(popper, a, tries)
        else:
            res["blmove-wake"] = await wake_latency(a, a, tries)
    return res


async def behaviours(adapter: Any, url: str) -> dict[str, Any]:
    async with adapter.open(url) as a, adapter.open(url) as probe:
        out: dict[str, Any] = {}
        out["same_client_ping_during_blocked_blmove_1s_ms"] = round(
            await same_client_during_block(a, probe), 1
        )
        out.update(await cancel_blocked(a, probe))
        if adapter is GlideAdapter:
            try:
                async with await a.c.scoped_connection(timeout=2.0) as sc:
                    await sc.ping()
                out["scoped_connection_under_trio"] = "works"
            except Exception as exc:  # noqa: BLE001 - reporting what happens
                out["scoped_connection_under_trio"] = f"{type(exc).__name__}: {exc}"
        await probe.reset()
    return out


def fmt_rows(name: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case in runs[0]:
        vals = [r[case] for r in runs]
        a = [v[0] for v in vals]
        b = [v[1] for v in vals]
        if case == "blmove-wake":
            rows.append(
                {
                    "client": name,
                    "case": case,
                    "p50_us": statistics.median(a),
                    "p99_us": statistics.median(b),
                    "p50_range": [min(a), max(a)],
                    "p99_range": [min(b), max(b)],
                }
            )
        else:
            rows.append(
                {
                    "client": name,
                    "case": case,
                    "rate": statistics.median(a),
                    "cpu_us": statistics.median(b),
                    "rate_range": [min(a), max(a)],
                    "cpu_range": [min(b), max(b)],
                }
            )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"| {'client':<8} | {'case':<14} | {'rate cmd/s':>11} | {'CPU us/cmd':>10} "
        "| spread (min-max of the repeats) |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        if r["case"] == "blmove-wake":
            p50 = f"p50 {r['p50_us']:.0f} us"
            p99 = f"p99 {r['p99_us']:.0f}"
            lo50, hi50 = r["p50_range"]
            lo99, hi99 = r["p99_range"]
            lines.append(
                f"| {r['client']:<8} | {r['case']:<14} | {p50:>11} | {p99:>10} "
                f"| p50 {lo50:.0f}-{hi50:.0f}, p99 {lo99:.0f}-{hi99:.0f} us |"
            )
        else:
            lines.append(
                f"| {r['client']:<8} | {r['case']:<14} | {r['rate']:>11,.0f} "
                f"| {r['cpu_us']:>10.1f} "
                f"| CPU {r['cpu_range'][0]:.1f}-{r['cpu_range'][1]:.1f}, "
                f"rate {r['rate_range'][0]:,.0f}-{r['rate_range'][1]:,.0f} |"
            )
    return "\n".join(lines)


async def bench(url: str, clients: dict[str, Any], repeat: int, scale: float, tries: int) -> dict:
    per_client: dict[str, list[dict[str, Any]]] = {n: [] for n in clients}
    for i in range(repeat):
        for name, adapter in clients.items():
            print(f"  round {i + 1}/{repeat}: {name}", file=sys.stderr, flush=True)
            per_client[name].append(await one_round(name, adapter, url, scale, tries))
    beh = {}
    for name, adapter in clients.items():
        beh[name] = await behaviours(adapter, url)
    return {"runs": per_client, "behaviours": beh}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the command counts")
    ap.add_argument("--tries", type=int, default=300, help="BLMOVE wake-ups per round")
    ap.add_argument("--only", choices=sorted(ADAPTERS), action="append", help="client(s) to run")
    ap.add_argument("--json", type=Path, help="also save the results here")
    ap.add_argument("--rss-probe", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_probe:
        rss_probe(args.rss_probe, args.url)
        return 0

    clients, notes = available()
    if args.only:
        clients = {k: v for k, v in clients.items() if k in args.only}
    if not clients:
        print("no client library importable", file=sys.stderr)
        return 1
    for n in notes:
        print(f"note: {n}", file=sys.stderr)

    data_dir = Path(tempfile.mkdtemp(prefix="bench-clients-"))
    server = ValkeyProcess(
        ValkeySpec(port=free_port(), data_dir=data_dir, persist=False, databases=16)
    )
    server.start()
    pid = server.pid
    print(f"valkey-server pid {pid} on {server.url}", file=sys.stderr)
    try:
        out = trio.run(bench, server.url, clients, args.repeat, args.scale, args.tries)
        rss = {"none": rss_of("none", server.url)}
        for name in clients:
            rss[name] = rss_of(name, server.url)
    finally:
        server.stop()  # SIGTERM to its pid, SIGKILL after a grace period
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)

    rows: list[dict[str, Any]] = []
    for name in clients:
        rows += fmt_rows(name, out["runs"][name])
    versions = {name: adapter.version() for name, adapter in clients.items()}
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, trio "
        f"{trio.__version__}, {os.cpu_count()} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; median of {args.repeat}"
    )
    print(render(rows))
    print("\nbehaviours (blocking pops, cancellation):")
    for name, b in out["behaviours"].items():
        for k, v in b.items():
            print(f"  {name:<8} {k}: {v}")
    print("\nRSS per process (kB; fresh subprocess, trio + client lib, 1 then 2 clients):")
    for name, r in rss.items():
        print(f"  {name:<8} {r}")
    print(
        "\npackage size on disk (MB, without dependencies): "
        + ", ".join(
            f"{m} {package_mb(m):.1f}"
            for m in ("coredis", "glide", "glide_shared")
            if importlib.util.find_spec(m) is not None
        )
    )
    for n in notes:
        print(f"note: {n}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "python": sys.version,
                    "versions": versions,
                    "rows": rows,
                    "runs": out["runs"],
                    "behaviours": out["behaviours"],
                    "rss_kb": rss,
                    "notes": notes,
                    "repeat": args.repeat,
                    "scale": args.scale,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
