#!/usr/bin/env python3
"""hero-node benchmarks: real nodes (embedded Valkey, real websocket links), one table.

Cases: 1 local throughput, 2 cross-node throughput, 3 round-trip latency, 4 transport vs raw
websocket, 5 Valkey ceiling and commands per job, 6 memory, 7 scaling (runner slots, backlog),
9 replicated store (WAITAOF-acknowledged promises) against the single Valkey, as ratios, 10
tracing off and on (sampling 1.0, OTLP to a receiver in the bench) on the local throughput run.
With --peers, 8: the peer job queues (SAQ, Celery, Dramatiq, ../shared/peers/compare.sh) measured
in the same invocation, and every speed target as a ratio against them or against our own figures.
Every figure is the median of --runs runs with min and max; targets are printed beside them
(verdict ok/MISS). Nothing asserts: this is an instrument, not a test. Results are also saved
as JSON (bench/results/<timestamp>.json unless --json). See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, peers  # noqa: E402
from bench.harness import RUNNERS, Procs, Row, render_table  # noqa: E402
from bench.replicated import case_replicated  # noqa: E402
from bench.tracing_cost import case_tracing  # noqa: E402
from node.host.valkey import free_port  # noqa: E402

ALL_CASES = (1, 2, 3, 4, 5, 6, 7, 9, 10)


async def main_async(args: argparse.Namespace, base: Path, failed: list[int | str]) -> list[Row]:
    """Every case asked for, then the peers; the number of each case that failed is appended
    to ``failed`` (its row says why)."""
    plan = cases.Plan.make(args.quick, args.runs, args.budget)
    plan.profile_dir = args.profile
    plan.inbox = not args.reply_lists
    procs = Procs()
    rows: list[Row] = []
    async with trio.open_nursery() as nursery:
        env = cases.Env(plan, procs, nursery, base)
        backlogs = cases.Backlogs(env)
        try:
            for number in args.cases:
                rows += await run_listed(number, lambda n: run_case(env, backlogs, n), failed)
        finally:
            await procs.stop_all()
            nursery.cancel_scope.cancel()
    if args.peers:
        found = await run_peers(args, base, rows)
        if any(is_failure(row) for row in found):
            failed.append("peers")
        rows += found
    return rows


async def run_listed(
    number: int, run: Callable[[int], Awaitable[list[Row]]], failed: list[int | str]
) -> list[Row]:
    """Case ``number``'s rows; a case that raises gives one FAILED row saying why, and its
    number is appended to ``failed`` (the next case still runs)."""
    t0 = time.perf_counter()
    print(f"[bench] case {number} ...", file=sys.stderr, flush=True)
    try:
        found = await run(number)
    except Exception as exc:  # noqa: BLE001 - report it, go on with the next case
        print(f"[bench] case {number} FAILED: {exc!r}", file=sys.stderr, flush=True)
        traceback.print_exc()
        found = [Row(f"{number} FAILED", type(exc).__name__, "", [], note=repr(exc)[:300])]
    if any(is_failure(row) for row in found):
        failed.append(number)
    took_s = time.perf_counter() - t0
    print(f"[bench] case {number} done in {took_s:.1f} s", file=sys.stderr, flush=True)
    return found


async def run_peers(args: argparse.Namespace, base: Path, ours: list[Row]) -> list[Row]:
    """The peers, after our cases (so that nothing of ours runs beside them), and the ratios."""
    plan = peers.PeerPlan.make(args.quick)
    print(
        f"[bench] peers (N={plan.n}, {plan.lat_n} round trips, x{plan.repeats}) ...",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        found = await trio.to_thread.run_sync(peers.run_peers, plan, base / "peers", free_port())
    except (RuntimeError, OSError) as exc:
        print(f"[bench] peers FAILED: {exc}", file=sys.stderr, flush=True)
        return [Row(f"{peers.CASE} FAILED", "peers", "", [], note=str(exc)[:300])]
    print(f"[bench] peers done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return peers.peer_rows(found) + peers.ratio_rows(ours, found)


async def run_case(env: cases.Env, backlogs: cases.Backlogs, number: int) -> list[Row]:
    if number == 1:
        found = await cases.case_local_throughput(env)
    elif number == 2:
        found = await cases.case_cross_throughput(env)
    elif number == 3:
        found = await cases.case_latency(env)
    elif number == 4:
        found = await cases.case_transport(env)
    elif number == 5:
        found = await cases.case_valkey(env)
    elif number == 6:
        found = await cases.case_memory(env, backlogs)
    elif number == 7:
        found = await cases.case_scaling(env, backlogs)
    elif number == 9:
        found = await case_replicated(env)
    else:
        found = await case_tracing(env)
    return found


def is_failure(row: Row) -> bool:
    """Whether ``row`` stands for a case that failed (what main_async and run_peers write)."""
    return row.case.endswith(" FAILED")


def exit_status(failed: list[int | str]) -> int:
    """The process's exit status: 1 when any case failed, so that a smoke run that lost a case
    fails (CI runs ``--quick``); a table with a hole is no measurement."""
    if failed:
        print(f"[bench] FAILED: {', '.join(map(str, failed))}", file=sys.stderr, flush=True)
        return 1
    return 0


def parse_cases(text: str) -> list[int]:
    try:
        found = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cases wants numbers like 1,3,5: {text!r}") from None
    if not found or any(c not in ALL_CASES for c in found):
        raise argparse.ArgumentTypeError(f"cases are 1..7, 9 and 10, got {text!r}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="every case small (CI smoke check)")
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per figure (default 3; 1 with --quick)"
    )
    parser.add_argument("--cases", type=parse_cases, default=list(ALL_CASES), help="e.g. 1,3,5")
    parser.add_argument("--json", type=Path, default=None, help="where to save the JSON results")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds per measured run; job counts are capped to fit at the calibrated rate "
        "(default 10; 5 with --quick)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="record py-spy profiles (collapsed stacks) of the nodes and the client during the "
        "first run of cases 1 and 2 into this directory",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run the peer job queues (SAQ, Celery, Dramatiq: ../shared/peers/compare.sh) "
        "after our cases, and print every speed target as a ratio with its verdict "
        "and the kept targets of cases 4, 6 and 7 beside them (the ratios need cases 1, 2, 3 "
        "and 7; first run builds the peers' virtualenvs)",
    )
    parser.add_argument(
        "--reply-lists",
        action="store_true",
        help="bench clients wait on each message's own reply list instead of one reply inbox "
        "(to compare the two)",
    )
    parser.add_argument("--keep-dir", action="store_true", help="keep the node homes (debugging)")
    args = parser.parse_args()
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be >= 1")

    base = Path(tempfile.mkdtemp(prefix="hero-bench-"))
    started = time.strftime("%Y%m%dT%H%M%S")
    t0 = time.perf_counter()
    failed: list[int | str] = []
    try:
        rows = trio.run(main_async, args, base, failed)
    except KeyboardInterrupt:
        return 130
    finally:
        if not args.keep_dir:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    print()
    print(render_table(rows))
    print(f"\n{len(rows)} figures in {elapsed:.0f} s ({'quick' if args.quick else 'full'} run)")
    out = args.json or ROOT / "bench" / "results" / f"{started}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "started_at": started,
        "elapsed_s": elapsed,
        "argv": sys.argv[1:],
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "python_slots": RUNNERS["python"],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "rows": cases.summary_json(rows),
    }
    out.write_text(cases.dumps(report) + "\n")
    print(f"saved {out}")
    return exit_status(failed)


if __name__ == "__main__":
    raise SystemExit(main())
