"""Where a lone job's time goes, from the kernel's scheduler: each process's turn on the path.

``bench/trace.py`` times a round trip from a Valkey MONITOR, which slows every command it
sees. This reads the scheduler instead, which nothing in the bench slows: it starts node A
as case 3 does (nodes A and B, a client with a reply inbox), runs sequential local round
trips of the bench's job while ``perf sched record`` records every wake-up on the machine,
and follows each round trip along the processes that wake each other:

    client -> Valkey -> node -> Valkey -> runner -> sandbox -> runner -> Valkey -> client

A segment runs from one wake-up to the next: the woken process's wait for a core, its work,
and its write that wakes the next one (Valkey's segments hold its scripts). Only round trips
whose every hand-off woke a sleeping process can be followed (the count is printed). It says
which turn a change moved; the machine moves every turn together from run to run, so compare
alternated runs. It also prints the CPU each process spent per round trip: the work off the
path (a process's bookkeeping after its write) competes with the next process for the two
cores.

Needs ``perf`` (Debian: ``linux-perf``) and the right to trace the scheduler (root, or
``kernel.perf_event_paranoid`` <= 1). Diagnostic only.

    .venv/bin/python bench/wakes.py              # 3 s of round trips
    .venv/bin/python bench/wakes.py --seconds 5
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, harness  # noqa: E402
from bus.client.api import open_client  # noqa: E402
from bus.client.inbox import new_inbox_name  # noqa: E402

WARM_UP = 50

# a line of `perf sched timehist -w`: "<time> [<cpu>] <comm>[<tid>/<pid>] awakened: <comm>[..]"
# (a thread shows as tid/pid, a process's main thread as its pid alone)
_WAKE = re.compile(
    r"^\s*(?P<t>\d+\.\d+)\s+\[\d+\]\s+(?P<a>.+?)\[(?P<a1>\d+)(?:/(?P<a2>\d+))?\]"
    r"\s+awakened: (?P<b>.+?)\[(?P<b1>\d+)(?:/(?P<b2>\d+))?\]\s*$"
)

# the path of a lone local job, as wake-ups: (segment, from, to); C client, V Valkey, N node,
# R the runner that ran the job, S its sandbox's job process
SEGMENTS = (
    ("client's write -> node woken (EXEC, the pop script)", "CV", "VN"),
    ("node: judged, materialise sent", "VN", "NV"),
    ("Valkey: materialise, start -> runner woken", "NV", "VR"),
    ("runner: request sent to its sandbox", "VR", "RS"),
    ("sandbox: the job run, answered", "RS", "SR"),
    ("runner: end script sent", "SR", "RV"),
    ("Valkey: end script -> client woken", "RV", "VC"),
    ("client: reply read, next message written", "VC", "CV2"),
)


@dataclass(frozen=True)
class Wake:
    """One wake-up: at ``t_us``, process ``waker`` made process ``wakee`` runnable."""

    t_us: float
    waker: int
    wakee: int
    waker_comm: str
    wakee_comm: str


def parse_wakes(lines: Iterable[str]) -> list[Wake]:
    """The wake-ups of ``perf sched timehist -w`` output, by process (a thread counts as its
    process); other lines are skipped."""
    out = []
    for line in lines:
        m = _WAKE.match(line)
        if m is None:
            continue
        out.append(
            Wake(
                float(m["t"]) * 1e6,
                int(m["a2"] or m["a1"]),
                int(m["b2"] or m["b1"]),
                m["a"],
                m["b"],
            )
        )
    return out


def role(pid: int, comm: str, known: Mapping[int, str]) -> str:
    """``known``'s role of ``pid``; a python process it does not name is a sandbox's job
    process (the only other python processes a round trip wakes); "" for anything else."""
    if pid in known:
        return known[pid]
    return "S" if comm.startswith("python") else ""


def chains(wakes: Iterable[Wake], known: Mapping[int, str]) -> list[dict[str, float]]:
    """Each complete round trip's wake-up times, by the names of :data:`SEGMENTS`.

    A round trip begins with the client's write (C -> V), then the node woken (V -> N), its
    materialise (N -> V); the runner that ran the job is the one that sends its sandbox a
    request (R -> S) after that, woken by Valkey (its last V -> R before the request); the
    sandbox's answer is its last wake-up of that runner before the runner's end script (a
    job's output can wake the runner before); the client is woken (V -> C) and writes the next
    message (C -> V). A hand-off that found the next process awake (Valkey still busy with
    another client's command) has no wake-up: that round trip is not followed (its runner seen
    woken before the materialise, or a later step taken for the missing one), nor is anything
    between round trips. So the followed ones are those whose every hand-off woke a sleeper:
    their segments, not a sample of all round trips."""
    trips: list[dict[str, float]] = []
    cur: dict[str, float] = {}
    state, runner, answered = 0, 0, 0.0
    woke_runner: dict[int, float] = {}
    for w in wakes:
        a, b = role(w.waker, w.waker_comm, known), role(w.wakee, w.wakee_comm, known)
        if not (a and b):
            continue
        if (a, b) == ("V", "R"):
            woke_runner[w.wakee] = w.t_us
        if state == 0 and (a, b) == ("C", "V"):
            cur, state = {"CV": w.t_us}, 1
        elif state == 1 and (a, b) == ("V", "N"):
            cur["VN"], state = w.t_us, 2
        elif state == 2 and (a, b) == ("N", "V"):
            cur["NV"], state = w.t_us, 3
        elif state == 3 and (a, b) == ("R", "S"):
            runner = w.waker
            if woke_runner.get(runner, 0.0) > cur["NV"]:
                cur["VR"], cur["RS"], answered, state = woke_runner[runner], w.t_us, 0.0, 4
            else:
                state = 0
        elif state == 4 and (a, b) == ("S", "R") and w.wakee == runner:
            answered = w.t_us
        elif state == 4 and (a, b) == ("R", "V") and w.waker == runner and answered:
            cur["SR"], cur["RV"], state = answered, w.t_us, 5
        elif state == 5 and (a, b) == ("V", "C"):
            cur["VC"], state = w.t_us, 6
        elif state == 6 and (a, b) == ("C", "V"):
            cur["CV2"] = w.t_us
            trips.append(cur)
            cur, state = {"CV": w.t_us}, 1
    return trips


def segment_rows(trips: list[dict[str, float]]) -> list[tuple[str, float, float, float]]:
    """Per segment of :data:`SEGMENTS`: (name, p25, p50, p75) in µs over ``trips``, nearest
    rank as the bench's rows take them (:func:`bench.harness.percentile`); last, the whole
    round trip's."""
    rows = []
    for name, start, end in (*SEGMENTS, ("round trip, wake-up to wake-up", "CV", "CV2")):
        d = [t[end] - t[start] for t in trips]
        rows.append((name, *(harness.percentile(d, p) for p in (25, 50, 75))))
    return rows


async def record(seconds: float) -> str:
    """Round trips for ``seconds`` under ``perf sched record``; prints the segments. Returns
    why it could not ("" if it did)."""
    perf = shutil.which("perf")
    if perf is None:
        return "bench/wakes.py needs perf (Debian: apt-get install linux-perf)"
    async with cases.tool_env(cases.Plan.make(True, 1, None), "hero-wakes-") as env:
        data = env.base / "sched.data"
        a, _ = await env.get_pair()
        async with open_client(a.redis_url, inbox=new_inbox_name()) as client:
            await cases.roundtrips(client, env.actor, a.node_id, WARM_UP)
            known = {os.getpid(): "C", a.pid: "N"}
            if a.valkey_pid:
                known[a.valkey_pid] = "V"
            known |= {pid: "R" for pid in cases.runner_spies(a.pid, "a").values()}
            done = trio.Event()
            count = 0
            recorded: list[subprocess.CompletedProcess[bytes]] = []

            async def perf_record() -> None:
                try:
                    recorded.append(
                        await trio.run_process(
                            [
                                perf,
                                "sched",
                                "record",
                                "-o",
                                str(data),
                                "--",
                                "sleep",
                                str(seconds),
                            ],
                            capture_stdout=True,
                            capture_stderr=True,
                            check=False,
                        )
                    )
                finally:
                    done.set()

            env.nursery.start_soon(perf_record)
            await trio.sleep(0.5)  # perf's own start, off the record
            before = harness.lone_cpu_s(a)
            while not done.is_set():
                await cases.roundtrips(client, env.actor, a.node_id, 1)
                count += 1
            cpu = harness.lone_cpu_line(before, harness.lone_cpu_s(a), count)
        if not recorded or recorded[0].returncode:
            why = recorded[0].stderr.decode(errors="replace").strip() if recorded else ""
            return f"perf sched record failed (root, or kernel.perf_event_paranoid <= 1?): {why}"
        timehist = await trio.run_process(
            [perf, "sched", "timehist", "-w", "-i", str(data)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if timehist.returncode:
            return f"perf sched timehist failed: {timehist.stderr.decode(errors='replace')}"
        trips = chains(parse_wakes(timehist.stdout.decode().splitlines()), known)
        print_segments(trips, count, cpu)
        return ""


def print_segments(trips: list[dict[str, float]], count: int, cpu: str) -> None:
    if not trips:
        print(f"{count} round trips, none followed from end to end")
        return
    print(f"{len(trips)} of {count} local round trips followed from wake-up to wake-up; µs:\n")
    print(f"{'p25':>7} {'p50':>7} {'p75':>7}  segment")
    for name, p25, p50, p75 in segment_rows(trips):
        print(f"{p25:7.0f} {p50:7.0f} {p75:7.0f}  {name}")
    print("\n" + cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="how long perf records round trips"
    )
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds must be above 0")
    why = trio.run(record, args.seconds)
    if why:
        sys.exit(why)


if __name__ == "__main__":
    main()
