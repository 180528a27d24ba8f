"""Where one job's time goes, hop by hop: a Valkey MONITOR timeline of a single round trip.

Starts nodes A and B as `bench/run.py` does (embedded Valkey, real link), warms them up, then
runs one `submit_job` + `wait_results` (local on A, or A -> B with ``--cross``) while a MONITOR
connection on each node's Valkey records every command with the server's timestamp. Prints the
commands of that round trip in time order, with the gap since the previous one: a gap is time
spent outside Valkey (the client or a node service computing, or waking up). Then the hop
count: every hand-off of the job from one service to the next (a push onto a list the next one
waits on, or a link crossed), with the path. Diagnostic only.

    .venv/bin/python bench/trace.py            # local round trip
    .venv/bin/python bench/trace.py --cross    # A -> B -> A
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, harness  # noqa: E402
from bus.client.api import open_client  # noqa: E402
from bus.client.inbox import new_inbox_name  # noqa: E402

WARM_UP = 30
WIDTH = 140
PUSHES = ("LPUSH", "RPUSH")
# lists a service (or the waiting client) blocks on: a push there hands the job to the next one
WAITED = ("msg_out", "msg_in", "queue:", "outbox:", "reply:", "inbox:", "results", "stop:")
_WORDS = re.compile(r'"((?:[^"\\]|\\.)*)"')


def hand_offs(lines: list[tuple[float, str, str]]) -> list[str]:
    """The hops of a round trip, in order: each push onto a list another service (or the
    client) waits on, and each crossing of a link (a push on the other node than the last)."""
    hops: list[str] = []
    node = ""
    for _, label, command in lines:
        words = _WORDS.findall(command)
        if len(words) < 2 or words[0].upper() not in PUSHES:
            continue
        target = words[1]
        if not target.startswith(WAITED):
            continue
        if node and label != node:
            hops.append(f"link {node}->{label}")
        node = label
        hops.append(f"{label}:{target.split(':')[0]}")
    return hops


async def monitor(
    url: str, label: str, lines: list[tuple[float, str, str]], ready: trio.Event
) -> None:
    """Record ``(server time, node label, command)`` for every command the server runs."""
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the embedded Valkey: its socket, as the node (ACL)
        sock = trio.socket.socket(trio.socket.AF_UNIX)
        await sock.connect(parts.path)
    else:
        sock = trio.socket.socket()
        await sock.connect((parts.hostname, parts.port))
    if parts.password:
        await sock.send(f"AUTH {parts.username} {parts.password}\r\n".encode())
    await sock.send(b"MONITOR\r\n")
    ready.set()
    buffer = b""
    while True:
        data = await sock.recv(65536)
        if not data:
            return
        buffer += data
        *complete, buffer = buffer.split(b"\r\n")
        for raw in complete:
            text = raw.decode(errors="replace").lstrip("+")
            stamp, _, rest = text.partition(" ")
            try:
                lines.append((float(stamp), label, rest.split("]", 1)[-1].strip()))
            except ValueError:
                continue  # the +OK answering MONITOR itself


async def trace(cross: bool, reply_lists: bool) -> None:
    procs = harness.Procs()
    base = Path(tempfile.mkdtemp(prefix="hero-trace-"))
    async with trio.open_nursery() as nursery:
        try:
            env = cases.Env(cases.Plan.make(True, 1, None), procs, nursery, base)
            a, b = await env.get_pair()
            to = b.node_id if cross else a.node_id
            inbox = "" if reply_lists else new_inbox_name()
            async with open_client(a.redis_url, inbox=inbox) as client:
                lines: list[tuple[float, str, str]] = []
                for node, label in ((a, "A"), (b, "B")):
                    ready = trio.Event()
                    nursery.start_soon(monitor, node.redis_url, label, lines, ready)
                    await ready.wait()
                # the traced round trip follows the warm-up at once: after an idle pause the
                # first one is slower (caches, CPU wake-up), which is not what this is about
                await cases.roundtrips(client, env.actor, to, WARM_UP)
                t0 = time.time()
                [ms] = await cases.roundtrips(client, env.actor, to, 1)
                t1 = time.time()
                await trio.sleep(0.2)
            print(f"{'cross-node' if cross else 'local'} round trip: {ms:.2f} ms\n")
            print(f"{'t (ms)':>8} {'gap':>7}  node  command")
            prev = t0
            window = [x for x in sorted(lines) if t0 - 0.0005 <= x[0] <= t1 + 0.0005]
            for stamp, label, command in window:
                print(
                    f"{(stamp - t0) * 1000:8.3f} {(stamp - prev) * 1000:+7.3f}  {label:4}  "
                    f"{command[:WIDTH]}"
                )
                prev = stamp
            print(f"{(t1 - t0) * 1000:8.3f} {(t1 - prev) * 1000:+7.3f}  client has the result")
            hops = hand_offs(window)
            print(f"\n{len(window)} commands, {len(hops)} hops: {' -> '.join(hops)}")
        finally:
            await procs.stop_all()
            nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cross", action="store_true", help="trace a job from node A to node B")
    parser.add_argument(
        "--reply-lists",
        action="store_true",
        help="the client waits on the message's own reply list instead of a reply inbox",
    )
    args = parser.parse_args()
    trio.run(trace, args.cross, args.reply_lists)


if __name__ == "__main__":
    main()
