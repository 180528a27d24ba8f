#!/usr/bin/env python3
"""Summarise py-spy collapsed-stack profiles (``bench/run.py --profile DIR`` writes them).

    python bench/profile_report.py DIR/node-local.txt [--top 15]

Prints the functions with the most samples on top of the stack (self) and anywhere in the
stack (inclusive), as % of all samples, and a coarse split by project area (bus/, node/,
crypto/, coredis, trio, trio-websocket, ...). Line numbers are dropped so a function counts once.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

AREAS = (
    ("bus/", "bus/"),
    ("node/", "node/"),
    ("crypto/", "crypto/"),
    ("rfc8785", "rfc8785 (canonical JSON)"),
    ("nacl", "pynacl"),
    ("coredis", "coredis"),
    ("trio_websocket", "trio-websocket"),
    ("wsproto", "wsproto"),
    ("trio", "trio"),
    ("json", "json"),
    ("subprocess", "subprocess"),
)


# Task roots in priority order (the most specific first): which service ("hop") a sample is in.
SERVICES = (
    ("Popen.__init__", "process spawn (fork/exec in a trio worker thread)"),
    ("run_job", "runner: job bookkeeping + result (load, sign, write)"),
    ("run_runner", "runner: pop loop"),
    ("run_supervisor", "supervisor (msg_out: verify, route)"),
    ("run_consumer", "consumer (msg_in: verify, materialise, accept results)"),
    ("run_outbox", "outbox sender (to peer link)"),
    ("_run_link", "link receive (frames -> Valkey, acks)"),
    ("WorkerThread._work", "trio worker threads (idle/bookkeeping)"),
    ("_writer_task", "coredis connection writer tasks (socket sends)"),
    ("_reader_task", "coredis connection reader tasks"),
    ("submitter", "bench client: submit"),
    ("waiter", "bench client: wait results"),
)
SCHEDULER = (
    ("get_events", "trio scheduler: epoll"),
    ("unrolled_run", "trio scheduler: run loop"),
)


# frames of this checkout are shown from its root, wherever it is
_CHECKOUT = str(Path(__file__).resolve().parents[1]) + "/"


def frame_name(raw: str) -> tuple[str, str]:
    m = _FRAME.match(raw.strip())
    if not m:
        return raw.strip(), ""
    path = m.group("file")
    short = path
    for marker in ("site-packages/", _CHECKOUT, "lib/python3.11/"):
        if marker in path:
            short = path.split(marker, 1)[1]
    return f"{m.group('func')} ({short})", short


def area_of(path: str) -> str:
    for needle, label in AREAS:
        if needle in path:
            return label
    return "other (stdlib, interpreter)"


def _service(names: list[tuple[str, str]]) -> str:
    """The most specific recognised task root in the stack; else the innermost frame's role."""
    funcs = [n.split(" (", 1)[0] for n, _ in names]
    for needle, label in SERVICES:
        for func in funcs:
            if func == needle or func.endswith("." + needle):
                return label
    for needle, label in SCHEDULER:
        if funcs[-1].endswith(needle):
            return label
    return "other (trio internals, interpreter)"


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        stacks.append((frames, int(count)))
    return stacks


def report(path: Path, top: int) -> str:
    stacks = load(path)
    total = sum(c for _, c in stacks) or 1
    selfc: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    services: Counter[str] = Counter()
    for frames, count in stacks:
        names = [frame_name(f) for f in frames]
        if not names:
            continue
        services[_service(names)] += count
        selfc[names[-1][0]] += count
        areas[area_of(names[-1][1])] += count
        for name in {n for n, _ in names}:
            incl[name] += count
    out = [f"{path.name}: {total} samples"]
    out.append("\n  self (on top of the stack):")
    out += [f"    {100 * c / total:5.1f}%  {n}" for n, c in selfc.most_common(top)]
    out.append("\n  inclusive (anywhere in the stack), project and library entry points:")
    shown = 0
    for n, c in incl.most_common():
        if any(s in n for s in ("bus/", "node/", "crypto/", "coredis", "trio_websocket", "nacl")):
            out.append(f"    {100 * c / total:5.1f}%  {n}")
            shown += 1
            if shown >= top:
                break
    out.append("\n  by hop (the service whose task the sample is in):")
    out += [f"    {100 * c / total:5.1f}%  {s}" for s, c in services.most_common()]
    out.append("\n  self time by area:")
    out += [f"    {100 * c / total:5.1f}%  {a}" for a, c in areas.most_common()]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profiles", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    for p in args.profiles:
        print(report(p, args.top))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
