"""Stalls and orphans on real node processes: a frozen node, a frozen Valkey, nodes killed under
running jobs.

Three `hero-node run` subprocesses A, B and C, each on its own external Valkey. A dials B and C;
B and C know A's actor as actor 1, executor of their context 1. Python jobs go from A to B, to
C and to A itself: 150 up front, then a steady trickle while the faults happen. Each
job appends ``S <tag> <pid> <start time>`` to one execution log when it starts and ``E ...`` when
it ends, so every execution, completed or not, is counted, in order.

Two cases, the faults at moments from a fixed seed:

* **stalls**: B frozen (SIGSTOP of the node) for longer than the runners' lease TTL and the
  messages' ack deadline, then SIGCONT. B's job processes go on meanwhile: they finish while
  their node sleeps, their leases lapse; messages A sends meanwhile reach B's socket but are not
  acked in time, so A tells their clients ``timeout_ack``. Then C's valkey-server frozen as
  long: C's leases expire in a store that C cannot reach.
* **orphans**: C, B and A killed (-9) in turn while jobs run there, each restarted 1-2 s later.
  Their job processes outlive them (orphans) and finish; the restarted node must adopt what
  they did, not run it again.

Then every job must be final at A within RECOVERY_BOUND_S of the last fault, and the report's
counters must all be 0: lost, stuck, told-failed-but-ran, finished-then-run-again, silent
duplicates, processes left (see :func:`judge` and :func:`processes_left`).
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from bus.client.api import Client, JobResult, open_client
from bus.core.models import JobStatus, Message
from crypto import read_key_file
from node.config import NodeConfig
from node.host.valkey import ValkeyProcess, ValkeySpec
from node.runners import recovery as runner
from tests.faults.test_faults import (
    alive,
    attempts_of,
    dead_letter_reasons,
    exceptions_in,
    job_states,
    log_tail,
    wait_all,
)
from tests.nodeproc import NodeProcess, stable_port

# The long fault suites run one after another on one test worker (README "Run the tests"):
# two of them side by side on a 2-core machine would stretch the timings they inject.
pytestmark = pytest.mark.xdist_group("faults")

SEED = 20261123
UP_FRONT = 150  # every node has a backlog when the first fault comes
TRICKLE_EVERY_S = 0.5  # one job to each of A, B, C per tick while the faults happen
RETRIES = 2
RUNNERS = {"python": 4}  # python jobs only: no slot of another type to start
NAMES = ("a", "b", "c")
LEASE_TTL_MS = 6_000  # where the node lets it be configured (else its fixed TTL)
ACK_S = 8  # timeout_ack of every message: B's freeze outlasts it
# The allowed clock skew. All nodes share one clock, but the origin's margin past an ack
# deadline must also cover an ack's way to it and its turn to be read there (docs/guarantees/
# fencing.md, timeout_ack): seconds, with two workers' tests on a 2-core machine. Still short of a
# stall, so a frozen node resumes after its messages were failed at their origin.
MAX_SKEW_S = 4
RECOVERY_BOUND_S = 60.0
ORPHANS = 3  # jobs running at a node when it is killed (if they do within 10 s)

# Start and end lines are separate O_APPEND writes, each well under PIPE_BUF: never interleaved.
# The log is in the job's work dir (its $HOME: the one place a sandboxed job may write), which
# the test reads from the node's home; the process names itself after its tag, so that the
# test finds it from outside its pid namespace (processes_left).
SCRIPT = """\
import ctypes, os, time
tag = os.environ["TAG"]
ctypes.CDLL(None).prctl(15, ("hj-" + tag).encode(), 0, 0, 0)  # PR_SET_NAME
OUT = os.path.join(os.environ["HOME"], "executions.txt")
with open("/proc/self/stat") as f:
    born = f.read().rsplit(")", 1)[1].split()[19]
def log(kind):
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, ("%s %s %d %s\\n" % (kind, tag, os.getpid(), born)).encode())
    finally:
        os.close(fd)
log("S")
time.sleep(float(os.environ["NAP"]))
log("E")
"""


def lease_configurable() -> bool:
    return "lease_ttl_ms" in NodeConfig.__dataclass_fields__


def lease_ttl_s() -> float:
    """The lease TTL the nodes of this test run with (see :func:`node_options`)."""
    if lease_configurable():
        return LEASE_TTL_MS / 1000
    return int(vars(runner)["LEASE_TTL_MS"]) / 1000  # the fixed TTL of nodes without the setting


def stall_s() -> float:
    """How long a stall lasts: beyond both the lease TTL and the ack deadline."""
    return max(lease_ttl_s(), ACK_S) + 5


def node_options(node: NodeProcess) -> None:
    """Written into the home's config: the clocks of one machine agree, so the skew an origin
    allows for past an ack deadline is MAX_SKEW_S; a short lease TTL where the node has the
    setting."""
    options = {"max_skew_s": MAX_SKEW_S}
    if lease_configurable():
        options["lease_ttl_ms"] = LEASE_TTL_MS
    path = node.config.config_path
    text = path.read_text()
    for key, value in options.items():
        line = f"{key} = {value}"
        text, found = re.subn(rf"(?m)^{key} = .*$", line, text, count=1)
        if not found:
            text = text.replace("[node]\n", f"[node]\n{line}\n", 1)
    path.write_text(text)


@dataclass
class Rig:
    """Everything the test started, so that all of it can be stopped whatever happens."""

    tmp: Path
    valkeys: dict[str, ValkeyProcess]
    nodes: dict[str, NodeProcess]
    outs: list[Path]  # each node's execution log, in its context 1's work dir
    t0: float = field(default_factory=time.monotonic)
    events: list[str] = field(default_factory=list)
    frozen: set[int] = field(default_factory=set)  # pids under SIGSTOP right now
    # every node and Valkey process started: (pid, start time) -> what it is
    processes: dict[tuple[int, str], str] = field(default_factory=dict)
    orphans: dict[str, list[str]] = field(default_factory=dict)  # node -> tags running at its kill
    stalled: dict[str, list[str]] = field(default_factory=dict)  # stall -> tags running then

    def note(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {text}"
        self.events.append(line)
        print(line, flush=True)

    async def start(self, name: str) -> None:
        node = self.nodes[name]
        await node.start()
        assert node.proc is not None
        self.own(node.proc.pid, f"node {name}")

    def own(self, pid: int, what: str) -> None:
        self.processes[(pid, born(pid) or "?")] = f"{what} (pid {pid})"


def make_rig(tmp: Path) -> Rig:
    valkeys = {
        n: ValkeyProcess(ValkeySpec(port=stable_port(), data_dir=tmp / f"v{n}", persist=True))
        for n in NAMES
    }
    nodes = {
        n: NodeProcess(
            tmp / n, n, redis_url=valkeys[n].url, runners=RUNNERS, actor_id=1 + NAMES.index(n)
        )
        for n in NAMES
    }
    for node in nodes.values():
        node_options(node)
    outs = [tmp / n / "work" / "1" / "executions.txt" for n in NAMES]
    return Rig(tmp, valkeys, nodes, outs)


def node_id(node: NodeProcess) -> str:
    return read_key_file(node.config.node_key_path).public_hex


async def wire(rig: Rig) -> None:
    """A dials B and C; B and C know A without an address (they never dial it), know A's actor
    as actor 1 and let it execute in their context 1. Written before the nodes start."""
    a = rig.nodes["a"]
    a_actor = read_key_file(a.config.actor_key_path)
    async with open_client(rig.valkeys["a"].url) as client:
        for name in ("b", "c"):
            await client.add_peer(node_id(rig.nodes[name]), rig.nodes[name].ws_url, name=name)
    for name in ("b", "c"):
        async with open_client(rig.valkeys[name].url) as client:
            await client.add_peer(node_id(a), "", name="a")
            await client.register_actor(1, a_actor.public_hex)
            await client.register_context(
                1, admins=[rig.nodes[name].config.actor_id], executors=[1]
            )


# -- the faults ------------------------------------------------------------------------------


def freeze(rig: Rig, pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    rig.frozen.add(pid)


def thaw(rig: Rig, pid: int) -> None:
    rig.frozen.discard(pid)
    os.kill(pid, signal.SIGCONT)


async def stall(rig: Rig, what: str, pid: int, name: str, sub: Submitted) -> None:
    """Freeze ``pid`` (node ``name``'s or its Valkey's) at a moment when a job runs at
    ``name`` (if one does within 10 s), for :func:`stall_s`."""
    seen: list[str] = []
    with trio.move_on_after(10):  # bounded polling of the log (a file: no event)
        while not (seen := running(rig.outs, sub.tags_to(name))):  # noqa: ASYNC110
            await trio.sleep(0.02)
    freeze(rig, pid)
    # what ran a moment before the freeze: read again after it, a job that ended in between
    # (its end and answer then meet the stall) showed as none, and failed the test's check
    rig.stalled[what] = seen
    rig.note(f"SIGSTOP {what} (pid {pid}) for {stall_s():.0f}s, {rig.stalled[what]} running")
    await trio.sleep(stall_s())  # the stall itself: a chosen duration, not a wait for state
    thaw(rig, pid)
    rig.note(f"SIGCONT {what}")


def executions(outs: list[Path]) -> list[tuple[str, str, int, str]]:
    """(kind, tag, pid, start time) of every line of the execution logs, in the order written
    (per node: a job runs at one node only)."""
    found = []
    lines = [line for out in outs if out.exists() for line in out.read_text().splitlines()]
    for line in lines:
        kind, tag, pid, start = line.split()
        found.append((kind, tag, int(pid), start))
    return found


def running(out: list[Path], tags: set[str]) -> list[str]:
    """The executions of ``tags`` started and not ended so far."""
    count: Counter[str] = Counter()
    for kind, tag, _, _ in executions(out):
        if tag in tags:
            count[tag] += 1 if kind == "S" else -1
    return [tag for tag, n in count.items() if n > 0]


async def kill_mid_jobs(rig: Rig, name: str, sub: Submitted, rng: random.Random) -> None:
    """kill -9 a node at a moment when several of its jobs run (their processes survive it):
    at least ORPHANS of them if that happens within 10 s, else at least one."""
    node = rig.nodes[name]
    assert alive(node), f"{name} died on its own:\n{log_tail(node)}"
    orphans: list[str] = []
    for want, within_s in ((ORPHANS, 10), (1, 50)):
        with trio.move_on_after(within_s):  # bounded polling of the log (a file: no event)
            while len(orphans := running(rig.outs, sub.tags_to(name))) < want:  # noqa: ASYNC110
                await trio.sleep(0.02)
        if len(orphans) >= want:
            break
    assert orphans, f"no job of {name} ran for a minute"
    await node.kill()
    rig.orphans[name] = orphans
    down = rng.uniform(1.0, 2.0)
    rig.note(f"kill -9 {name} while {len(orphans)} of its jobs run {orphans}; down {down:.1f}s")
    await trio.sleep(down)  # the outage itself
    await rig.start(name)
    rig.note(f"{name} restarted")


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Submitted:
    msgs: list[Message] = field(default_factory=list)
    dest: dict[str, str] = field(default_factory=dict)  # tag -> node name

    def tags_to(self, name: str) -> set[str]:
        return {tag for tag, d in self.dest.items() if d == name}


async def submit(
    rig: Rig,
    client: Client,
    sub: Submitted,
    to_wait: trio.MemorySendChannel[Message],
    dest: str,
    rng: random.Random,
) -> None:
    tag = f"j{len(sub.msgs):04d}"
    env = {"TAG": tag, "NAP": f"{rng.uniform(0.2, 0.8):.3f}"}
    actor = read_key_file(rig.nodes["a"].config.actor_key_path)
    msg = await client.submit_job(
        actor,
        1,
        to=rig.nodes[dest].node_id or node_id(rig.nodes[dest]),
        context_id=1,
        script_type="python",
        script=SCRIPT,
        env_vars=env,
        retries=RETRIES,
        timeout_ack_s=ACK_S,
    )
    sub.msgs.append(msg)
    sub.dest[tag] = dest
    to_wait.send_nowait(msg)


async def trickle(
    rig: Rig,
    client: Client,
    sub: Submitted,
    to_wait: trio.MemorySendChannel[Message],
    rng: random.Random,
    over: trio.Event,
) -> None:
    """One job to each node per tick until the faults are ``over`` (every fault meets new
    work). Never cancelled mid-submit: a submission cancelled after its write is queued at A
    but not in ``sub``, and the next job would reuse its tag (two jobs, one tag: seen as one
    job run twice)."""
    while not over.is_set():
        for dest in NAMES:
            await submit(rig, client, sub, to_wait, dest, rng)
        with trio.move_on_after(TRICKLE_EVERY_S):  # the submission rate: a pace
            await over.wait()


@dataclass
class Run:
    sub: Submitted
    results: dict[str, JobResult]
    recovery_s: float


async def run_scenario(rig: Rig, case: str, rng: random.Random, nursery: trio.Nursery) -> Run:
    await wire(rig)
    for name in ("b", "c", "a"):  # A last: its first dials find B and C listening
        await rig.start(name)
    sub = Submitted()
    results: dict[str, JobResult] = {}
    all_final = trio.Event()
    to_wait, submitted = trio.open_memory_channel[Message](math.inf)
    async with (
        open_client(rig.valkeys["a"].url) as client,
        open_client(rig.valkeys["a"].url) as waiter,
    ):
        with trio.fail_after(120):
            for i in range(UP_FRONT):
                await submit(rig, client, sub, to_wait, NAMES[i % 3], rng)
        rig.note(f"submitted {len(sub.msgs)} jobs (A, B, C in turn)")
        nursery.start_soon(wait_all, waiter, submitted, results, all_final)
        with trio.fail_after(300):
            over = trio.Event()
            async with trio.open_nursery() as faults:
                faults.start_soon(trickle, rig, client, sub, to_wait, rng, over)
                await run_faults(rig, case, sub, rng)
                over.set()
        to_wait.close()
        last_fault = time.monotonic()
        rig.note(f"faults over; {len(results)}/{len(sub.msgs)} results at A")
        for node in rig.nodes.values():
            assert alive(node), f"{node.name} died on its own:\n{log_tail(node)}"
        with trio.move_on_after(RECOVERY_BOUND_S):
            await all_final.wait()
        recovery_s = time.monotonic() - last_fault
        rig.note(f"{len(results)}/{len(sub.msgs)} results at A")
    return Run(sub, results, recovery_s)


async def run_faults(rig: Rig, case: str, sub: Submitted, rng: random.Random) -> None:
    """The case's faults, at seeded moments, while jobs are being submitted."""
    if case == "stalls":
        b, vc = rig.nodes["b"], rig.valkeys["c"]
        await trio.sleep(rng.uniform(1.0, 2.0))  # a random moment: the point of the test
        assert b.proc is not None
        await stall(rig, "node b", b.proc.pid, "b", sub)
        await trio.sleep(rng.uniform(1.0, 2.0))
        await stall(rig, "c's valkey-server", vc.pid, "c", sub)
    else:
        for name in ("c", "b", "a"):
            await trio.sleep(rng.uniform(1.0, 2.0))
            await kill_mid_jobs(rig, name, sub, rng)
    await trio.sleep(rng.uniform(1.0, 2.0))  # jobs go on being submitted after the last fault


# -- the counters -----------------------------------------------------------------------------


@dataclass
class Counters:
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    told_failed_but_ran: list[str] = field(default_factory=list)
    finished_then_run_again: list[str] = field(default_factory=list)
    silent_duplicates: list[str] = field(default_factory=list)
    processes_left: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)  # jobs at A the test lost track of

    def rows(self) -> list[tuple[str, list[str]]]:
        return [
            ("lost", self.lost),
            ("stuck", self.stuck),
            ("told-failed-but-ran", self.told_failed_but_ran),
            ("finished-then-run-again", self.finished_then_run_again),
            ("silent duplicates", self.silent_duplicates),
            ("processes left", self.processes_left),
            ("submitted but untracked", self.untracked),
        ]


@dataclass
class JobView:
    """One job as the test sees it at the end."""

    tag: str
    at_a: tuple[str | None, str | None]  # status, reason at the origin
    at_dest: tuple[str | None, str | None]  # status, attempt at the destination
    starts: int
    ends: int
    rerun_after_end: bool  # a start written after one of its ends


FINAL = {JobStatus.FINISHED.value, JobStatus.ERROR.value}


def judge(job: JobView, counters: Counters) -> None:
    """Add ``job`` to every counter it breaks."""
    status, reason = job.at_a
    dest_status, attempt = job.at_dest
    tag = f"{job.tag}: A {status}/{reason or '-'}, dest {dest_status}/{attempt}"
    runs = f"{job.starts} start(s), {job.ends} end(s)"
    if status not in FINAL:  # nobody will answer any more (lost), or not yet (stuck)
        held = dest_status is not None and dest_status not in FINAL
        (counters.stuck if held else counters.lost).append(f"{tag}, {runs}")
    elif status == JobStatus.FINISHED.value and job.ends == 0:
        counters.lost.append(f"{tag}: finished without a completed run")
    elif status == JobStatus.ERROR.value:
        died = (reason or "").startswith("runner_lost")  # true only if no run completed
        if not reason or job.ends > 0 or (job.starts > 0 and not died):
            counters.told_failed_but_ran.append(f"{tag}, {runs}")
    if job.ends > 1 or job.rerun_after_end:
        counters.finished_then_run_again.append(f"{tag}, {runs}")
    if job.starts > int(attempt or 0):  # every execution is an attempt the destination records
        counters.silent_duplicates.append(f"{tag}, {runs}")


async def job_views(rig: Rig, run: Run) -> list[JobView]:
    tags = [m.job[0].env_vars["TAG"] for m in run.sub.msgs]
    job_keys = [m.job[0].key for m in run.sub.msgs]
    at_a = await job_states(rig.valkeys["a"].url, job_keys, ["status", "reason"])
    at_dest: dict[str, tuple[str | None, str | None]] = {}
    for name in NAMES:
        mine = [(t, k) for t, k in zip(tags, job_keys, strict=True) if run.sub.dest[t] == name]
        states = await job_states(
            rig.valkeys[name].url, [k for _, k in mine], ["status", "attempt"]
        )
        at_dest |= {t: (s[0], s[1]) for (t, _), s in zip(mine, states, strict=True)}
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    rerun: set[str] = set()
    for kind, tag, _, _ in executions(rig.outs):
        (starts if kind == "S" else ends)[tag] += 1
        if kind == "S" and ends[tag]:
            rerun.add(tag)
    return [
        JobView(t, (a[0], a[1]), at_dest[t], starts[t], ends[t], t in rerun)
        for t, a in zip(tags, at_a, strict=True)
    ]


async def untracked(rig: Rig, run: Run) -> list[str]:
    """The jobs A holds (the origin of every job: its copy of each) that the test did not
    record as submitted: their executions would be counted under another job's tag."""
    tracked = {m.job[0].key for m in run.sub.msgs}
    async with open_client(rig.valkeys["a"].url) as client:
        held = await client.store.call(1, lambda r: r.keys("job:*"))
    return sorted(k for k in map(str, held) if k.count(":") == 2 and k not in tracked)


def job_processes(tags: set[str]) -> list[str]:
    """The tags of the job processes alive now (found by the name each gave itself)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("hj-") and name[3:] in tags and born(int(entry.name)) is not None:
            found.append(name[3:])
    return found


def born(pid: int) -> str | None:
    """The start time of live process ``pid`` (clock ticks after boot: with the pid, it names
    one process even if the pid is reused); None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if stat[0] == "Z" else stat[19]


async def processes_left(rig: Rig) -> list[str]:
    """Node, Valkey and job processes still alive once everything was stopped (job processes
    get a few seconds: an orphan may be ending its nap)."""
    procs = dict(rig.processes)
    tags = {tag for _, tag, _, _ in executions(rig.outs)}

    def left() -> list[str]:
        ours = [what for (pid, start), what in procs.items() if born(pid) == start]
        return ours + [f"job process (ran {tag})" for tag in job_processes(tags)]

    with trio.move_on_after(10):  # bounded polling of /proc: these are not our children
        while left():  # noqa: ASYNC110
            await trio.sleep(0.2)
    return left()


# -- the test ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", ["stalls", "orphans"])
async def test_stalls_and_orphans_keep_every_promise(tmp_path: Path, case: str) -> None:
    """stalls: B frozen, then C's Valkey frozen, each beyond the lease TTL and the ack
    deadline. orphans: C, B and A killed (-9) in turn while jobs run there, each restarted."""
    rng = random.Random(SEED)
    rig = make_rig(tmp_path)
    counters = Counters()
    try:
        for name, v in rig.valkeys.items():
            await trio.to_thread.run_sync(v.start)
            rig.own(v.pid, f"valkey-server of {name}")
        async with trio.open_nursery() as nursery:
            run = await run_scenario(rig, case, rng, nursery)
            nursery.cancel_scope.cancel()
        views = await job_views(rig, run)
        for job in views:
            judge(job, counters)
        counters.untracked = await untracked(rig, run)
        extra = await details(rig, run, views)
    finally:
        await stop_all(rig)
    counters.processes_left = await processes_left(rig)
    report(rig, case, run, counters, extra)
    for name, found in counters.rows():
        assert found == [], f"{name}: {len(found)}: {found[:5]}"
    # every fault met work running where it struck (else it showed nothing)
    hit = rig.stalled if case == "stalls" else rig.orphans
    assert len(hit) == (2 if case == "stalls" else 3), hit
    assert all(hit.values()), hit


async def stop_all(rig: Rig) -> None:
    for pid in list(rig.frozen):
        thaw(rig, pid)
    for node in rig.nodes.values():
        await node.close()
    for v in rig.valkeys.values():
        await trio.to_thread.run_sync(v.stop)


async def details(rig: Rig, run: Run, views: list[JobView]) -> list[tuple[str, object]]:
    """Figures for the report beside the counters (read while the Valkeys still run)."""
    errors = Counter(
        (v.at_a[1] or "?").split(":")[0] for v in views if v.at_a[0] == JobStatus.ERROR.value
    )
    key_of = {m.job[0].env_vars["TAG"]: m.job[0].key for m in run.sub.msgs}
    view_of = {v.tag: v for v in views}
    orphans = []
    for name, tags in rig.orphans.items():
        ended = await attempts_of(rig.valkeys[name].url, [key_of[t] for t in tags])
        for tag, attempts in zip(tags, ended, strict=True):
            v = view_of[tag]
            reasons = [(a.get("reason") or a.get("status", "?"))[:30] for a in attempts]
            orphans.append(f"{name} {tag}: {v.starts}S {v.ends}E, {v.at_dest}, ended {reasons}")
    dlq = {
        f"{n} db{db}": dict(await dead_letter_reasons(rig.valkeys[n].url, db))
        for n in NAMES
        for db in (0, 1)
    }
    return [
        ("sent (A, B, C)", f"{len(run.sub.msgs)} {tuple(len(run.sub.tags_to(n)) for n in NAMES)}"),
        ("results read by the client (in order)", len(run.results)),
        ("final at A", sum(v.at_a[0] in FINAL for v in views)),
        (
            "executions started / ended",
            f"{sum(v.starts for v in views)} / {sum(v.ends for v in views)}",
        ),
        ("error reasons at A", dict(errors)),
        ("orphans (node tag: runs, dest state, attempts)", "\n      ".join(["", *orphans])),
        ("dead letters", {k: v for k, v in dlq.items() if v}),
        ("tracebacks in node logs", {n.name: exceptions_in(n.log) for n in rig.nodes.values()}),
        ("recovery time after the last fault (s)", f"{run.recovery_s:.1f}"),
        ("total run time (s)", f"{time.monotonic() - rig.t0:.1f}"),
    ]


def report(
    rig: Rig, case: str, run: Run, counters: Counters, extra: list[tuple[str, object]]
) -> None:
    print(f"\n=== {case}: {len(run.sub.msgs)} jobs over 3 nodes ===")
    print(f"  lease TTL {lease_ttl_s():g}s, ack deadline {ACK_S}s, stalls {stall_s():g}s")
    for name, found in counters.rows():
        print(f"  {name:<40} {len(found):>8}")
    for name, value in extra:
        print(f"  {name:<40} {value}")
    for name, found in counters.rows():
        if found:
            print(f"  {name}, e.g.: {found[:4]}")
    print("  timeline:\n    " + "\n    ".join(rig.events))
