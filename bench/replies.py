#!/usr/bin/env python3
"""The waiting client's cost per answer: one reply list per message vs one reply inbox.

Starts its own valkey-server (the embedded binary, no persistence) on a free 127.0.0.1 port,
pushes N answers as a node does (on ``reply:<message key>`` each, or all on one
``inbox:<name>``), then lets N concurrent ``Client.wait_results`` (``--waiters`` at a time, as
bench/cases.py's throughput cases do) collect them, and reports per answer: this process's CPU
(``time.process_time``), the wall time, and the blocking pops the server ran (commandstats).
The answers are queued up front, so the figures are the client's own cost with no node
running: a shared machine's load changes the wall time, far less the CPU and not the pops.
Repeated ``--repeat`` times, interleaved, median shown.

    python bench/replies.py [--n 5000] [--waiters 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus.client.api import Client, new_job  # noqa: E402
from bus.client.inbox import new_inbox_name  # noqa: E402
from bus.core import keys  # noqa: E402
from bus.core.models import Message  # noqa: E402
from bus.store.connection import Store, open_store  # noqa: E402
from node.host.valkey import ValkeyProcess, ValkeySpec, free_port, process_gone  # noqa: E402

CTX = 1
PUSH_CHUNK = 1000


def _messages(n: int, inbox: str) -> list[Message]:
    return [
        Message(id=i + 1, caller_id=1, context_id=CTX, job=[new_job(1, CTX, "python", "")],
                reply_to=inbox)
        for i in range(n)
    ]  # fmt: skip


def _answer(message: Message) -> str:
    job = message.job[0]
    body = {"in_reply_to": message.key, "job_key": job.key, "status": "finished"}
    return json.dumps(body | {"result": {"stdout": "42\n", "stderr": "", "exit_code": "0"}})


async def _pops(store: Store) -> int:
    stats: Any = await store.call(CTX, lambda r: r.info("commandstats"))
    found = [stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("blpop", "blmpop")]
    return sum(int(x) for x in found)


async def _push_all(store: Store, messages: list[Message], inbox: str) -> None:
    async def push(r: object) -> None:
        async with r.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
            for m in chunk:
                pipe.lpush(keys.reply_list(m.key, inbox), [_answer(m)])

    for start in range(0, len(messages), PUSH_CHUNK):
        chunk = messages[start : start + PUSH_CHUNK]
        await store.call(CTX, push)


async def one_run(url: str, n: int, waiters: int, inbox: bool) -> dict[str, float]:
    """Collect n queued answers with ``waiters`` concurrent waiters; figures per answer."""
    name = new_inbox_name() if inbox else ""
    async with open_store(url) as store:
        await store.call(CTX, lambda r: r.flushdb())
        client = Client(store, inbox=name)
        messages = _messages(n, name)
        await _push_all(store, messages, name)
        send, receive = trio.open_memory_channel[Message](n)
        for m in messages:
            send.send_nowait(m)
        send.close()

        async def waiter() -> None:
            async for message in receive:
                [result] = await client.wait_results(message, timeout_s=30)
                assert result.ok, result

        pops0, cpu0, t0 = await _pops(store), time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(waiters):
                nursery.start_soon(waiter)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        pops = await _pops(store) - pops0
    return {"cpu_ms": 1000 * cpu / n, "wall_ms": 1000 * wall / n, "pops": pops / n}


async def bench(url: str, n: int, waiters: int, repeat: int) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {"reply lists": [], "one inbox": []}
    for _ in range(repeat):
        out["reply lists"].append(await one_run(url, n, waiters, inbox=False))
        out["one inbox"].append(await one_run(url, n, waiters, inbox=True))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=5000, help="answers per run (default 5000)")
    parser.add_argument("--waiters", type=int, default=32, help="concurrent waiters (32)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per way, interleaved (3)")
    args = parser.parse_args()
    if min(args.n, args.waiters, args.repeat) < 1:
        parser.error("--n, --waiters and --repeat must be >= 1")
    data_dir = Path(tempfile.mkdtemp(prefix="bench-replies-"))
    server = ValkeyProcess(ValkeySpec(port=free_port(), data_dir=data_dir, persist=False))
    server.start()
    pid = server.pid
    try:
        out = trio.run(bench, server.url, args.n, args.waiters, args.repeat)
    finally:
        server.stop()
        if not process_gone(pid):
            print(f"valkey-server {pid} still running", file=sys.stderr)
    print(f"{args.n} answers, {args.waiters} waiters, median of {args.repeat} runs")
    print(f"{'way':<12} {'client CPU ms/answer':>21} {'wall ms/answer':>15} {'pops/answer':>12}")
    for way, runs in out.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{way:<12} {med['cpu_ms']:>21.4f} {med['wall_ms']:>15.4f} {med['pops']:>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
