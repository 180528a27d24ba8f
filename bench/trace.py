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
    .venv/bin/python bench/trace.py --rounds 100   # local: median time of each hop

With ``--rounds N`` (local only) it traces N round trips in a row and prints, instead of one
timeline, the median and p90 of each hop of a local job (:data:`HOPS`), from the server's
timestamps: what each process did between two commands it sent, or how long a process took to
wake up once Valkey handed it the job. MONITOR slows every command by a few microseconds: the
hops are comparable between two trees, not the round trip's absolute time.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
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
        label = label.rstrip("*")
        if node and label != node:
            hops.append(f"link {node}->{label}")
        node = label
        hops.append(f"{label}:{target.split(':')[0]}")
    return hops


# The hops of a local round trip, in order, each ending at a marker command of the MONITOR
# timeline (a command sent by a process, not one run inside a script, unless "lua" says so).
HOPS = (
    ("client: build, sign, write the message", "EXEC"),
    ("supervisor wakes, pops", "msg_out"),
    ("supervisor: parse, admit, route", "inflight:supervisor queue:"),
    ("materialise script (Valkey)", "lua LREM inflight:supervisor"),
    ("runner wakes, start script sent", "inflight:runner"),
    ("start script (Valkey)", "lua ZADD running"),
    ("runner: ready, sandbox round trip, outcome, plan", "attempts:job"),
    ("end script up to the reply's push (Valkey)", "lua inbox:"),
    ("client wakes, reads the reply", ""),
)


def _marker(command: str, lua: bool, marker: str) -> bool:
    words = marker.split()
    if words and words[0] == "lua":
        if not lua:
            return False
        words = words[1:]
    elif lua:
        return False
    return all(w in command for w in words)


def hop_times(window: list[tuple[float, str, str]], t0: float, t1: float) -> list[float] | None:
    """The time (ms) of each of :data:`HOPS` in one traced local round trip, or None if a
    marker is missing (the timeline of another shape)."""
    times, at, i = [], t0, 0
    for _, marker in HOPS:
        if not marker:
            times.append((t1 - at) * 1000)
            break
        while i < len(window) and not _marker(window[i][2], window[i][1].endswith("*"), marker):
            i += 1
        if i == len(window):
            return None
        times.append((window[i][0] - at) * 1000)
        at = window[i][0]
        i += 1
    return times


def print_hops(rounds: list[list[float]], round_trips: list[float]) -> None:
    """Median and p90 of each hop over the traced rounds."""
    print(f"{len(rounds)} local round trips traced (MONITOR on); per hop, ms:\n")
    print(f"{'median':>7} {'p90':>7}  hop")
    for n, (name, _) in enumerate(HOPS):
        column = sorted(r[n] for r in rounds)
        p90 = column[int(0.9 * (len(column) - 1))]
        print(f"{statistics.median(column):7.3f} {p90:7.3f}  {name}")
    total = sorted(sum(r) for r in rounds)
    print(f"{statistics.median(total):7.3f} {total[int(0.9 * (len(total) - 1))]:7.3f}  sum")
    rt = sorted(round_trips)
    print(f"{statistics.median(rt):7.3f} {rt[int(0.9 * (len(rt) - 1))]:7.3f}  round trip")


async def monitor(
    url: str, label: str, lines: list[tuple[float, str, str]], ready: trio.Event
) -> None:
    """Record ``(server time, node label, command)`` for every command the server runs; a
    command run inside a script has ``*`` after its label. The socket is read in a thread
    and parsed once the trace ends, so that the traced client, in this process, does not share
    its event loop with the parsing of every command."""
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the embedded Valkey: its socket, as the node (ACL)
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(parts.path)
    else:
        sock = socket.create_connection((parts.hostname or "", parts.port or 6379))
    if parts.password:
        sock.sendall(f"AUTH {parts.username} {parts.password}\r\n".encode())
    sock.sendall(b"MONITOR\r\n")
    chunks: list[bytes] = []

    def read() -> None:
        while data := sock.recv(1 << 20):
            chunks.append(data)

    ready.set()
    try:
        await trio.to_thread.run_sync(read, abandon_on_cancel=True)
    finally:
        sock.shutdown(socket.SHUT_RDWR)  # the abandoned thread's recv returns
        sock.close()
        lines.extend(_parsed(b"".join(chunks), label))


def _parsed(data: bytes, label: str) -> list[tuple[float, str, str]]:
    out = []
    for raw in data.split(b"\r\n"):
        text = raw.decode(errors="replace").lstrip("+")
        stamp, _, rest = text.partition(" ")
        source, _, command = rest.partition("]")
        tag = label + ("*" if source.endswith(" lua") else "")
        try:
            out.append((float(stamp), tag, command.strip()))
        except ValueError:
            continue  # the +OK answering MONITOR itself, a line cut at the end
    return out


async def trace(cross: bool, reply_lists: bool, rounds: int) -> None:
    async with cases.tool_env(cases.Plan.make(True, 1, None), "hero-trace-") as env:
        a, b = await env.get_pair()
        to = b.node_id if cross else a.node_id
        inbox = "" if reply_lists else new_inbox_name()
        lines: list[tuple[float, str, str]] = []
        async with open_client(a.redis_url, inbox=inbox) as client:
            async with trio.open_nursery() as watch:
                for node, label in ((a, "A"), (b, "B")):
                    ready = trio.Event()
                    watch.start_soon(monitor, node.redis_url, label, lines, ready)
                    await ready.wait()
                # the traced round trips follow the warm-up at once: after an idle pause
                # the first one is slower (caches, CPU wake-up), which is not what this
                # is about
                await cases.roundtrips(client, env.actor, to, WARM_UP)
                spans = []
                before = harness.lone_cpu_s(a)
                for _ in range(rounds or 1):
                    t0 = time.time()
                    [ms] = await cases.roundtrips(client, env.actor, to, 1)
                    spans.append((t0, time.time(), ms))
                    # the runner's re-armed pop and its statistics land before the next
                    await trio.sleep(0.005)
                cpu = harness.lone_cpu_line(before, harness.lone_cpu_s(a), len(spans))
                await trio.sleep(0.2)
                watch.cancel_scope.cancel()
        timeline = sorted(lines)
        if rounds:
            print_rounds(timeline, spans)
            print("\n" + cpu)
        else:
            print_timeline(timeline, *spans[0], cross)


def print_timeline(
    timeline: list[tuple[float, str, str]], t0: float, t1: float, ms: float, cross: bool
) -> None:
    """One round trip's commands in time order, then its hand-offs."""
    print(f"{'cross-node' if cross else 'local'} round trip: {ms:.2f} ms\n")
    print(f"{'t (ms)':>8} {'gap':>7}  node  command")
    prev = t0
    window = [x for x in timeline if t0 - 0.0005 <= x[0] <= t1 + 0.0005]
    for stamp, label, command in window:
        print(
            f"{(stamp - t0) * 1000:8.3f} {(stamp - prev) * 1000:+7.3f}  {label:4}  "
            f"{command[:WIDTH]}"
        )
        prev = stamp
    print(f"{(t1 - t0) * 1000:8.3f} {(t1 - prev) * 1000:+7.3f}  client has the result")
    hops = hand_offs(window)
    print(f"\n{len(window)} commands, {len(hops)} hops: {' -> '.join(hops)}")


def print_rounds(
    timeline: list[tuple[float, str, str]], spans: list[tuple[float, float, float]]
) -> None:
    """Each hop's median and p90 over the traced round trips."""
    rounds, round_trips = [], []
    for t0, t1, ms in spans:
        window = [x for x in timeline if t0 <= x[0] <= t1 + 0.0005]
        times = hop_times(window, t0, t1)
        if times is not None:
            rounds.append(times)
            round_trips.append(ms)
    if not rounds:
        print("no round trip had the expected shape; trace one without --rounds")
        return
    print_hops(rounds, round_trips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cross", action="store_true", help="trace a job from node A to node B")
    parser.add_argument(
        "--reply-lists",
        action="store_true",
        help="the client waits on the message's own reply list instead of a reply inbox",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="trace this many local round trips and print each hop's median and p90",
    )
    args = parser.parse_args()
    if args.rounds and args.cross:
        parser.error("--rounds profiles a local round trip only")
    trio.run(trace, args.cross, args.reply_lists, args.rounds)


if __name__ == "__main__":
    main()
