"""Runner processes (node/worker/loop.py, node/runners/processes.py): their pop, and their life
as the node starts, watches, restarts, recycles and stops them."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
import redis
import trio

from bus import open_client
from bus.core import keys
from bus.core.attempts import Outcome
from bus.core.models import JobStatus, Message, RunnerJob
from bus.store import records
from bus.store.atomic.runs import NextJob
from bus.store.atomic.runs_sync import SyncRuns, connect
from crypto import read_key_file
from node.host.valkey import ValkeyProcess, ValkeySpec
from node.runners.processes import start_in_stages, start_stages
from node.slot.spec import RunnerSpec, frame, read_frame
from node.worker import job as procjob
from node.worker.ending import Ran
from node.worker.job import Wake
from node.worker.loop import SlotLoop
from tests.leases import lapse
from tests.nodeproc import NodeProcess
from tests.runners.slots import slot_spec
from tests.scripts import announcing, wait_announced

INFLIGHT = "inflight:runner:v:0"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def runner_processes_of(run_dir: Path) -> list[int]:
    """The live runner processes started for the node whose run directory is ``run_dir``
    (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--runner" in argv and str(run_dir).encode() in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def runner_of(pid: int) -> int:
    """The runner process that started the sandbox process ``pid`` runs in (its ancestor
    started with ``--runner``)."""
    while pid > 1:
        if b"--runner" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        pid = int(stat[1])
    raise AssertionError("no runner process above the job")


# -- the pop of a runner process (no process needed: the loop's method, on a real Valkey) --------


def _runner(redis_url: str, tmp_path: Path) -> SlotLoop:
    return SlotLoop(slot_spec(redis_url, tmp_path, pop_timeout_s=1.0), b"k" * 32)


def test_a_runner_pops_in_consume_order_then_blocks_on_its_type_queue(redis_url, tmp_path):
    runner = _runner(redis_url, tmp_path)
    client = connect(redis_url, 1)
    client.lpush("queue:v", "job:1:1")
    client.lpush("queue:v:prio:high", "job:1:2")
    lists = ["queue:v:prio:high", "queue:v", "queue:v:prio:low"]
    assert runner.popper.pop(lists, check_first=True) == ("job:1:2", None)
    assert runner.popper.pop(lists, check_first=True) == ("job:1:1", None)
    assert runner.popper.pop(lists, check_first=True) is None  # after the blocking pop's timeout
    assert client.lrange(INFLIGHT, 0, -1) == ["job:1:1", "job:1:2"]


def test_an_orphaned_runner_hands_over_increments_not_its_slots_totals(redis_url, tmp_path):
    """While its node lives, a runner hands over its slot's totals (one field, set). Once the
    node died, the next node may have started another process of the slot from those totals,
    which a set would then write over: an orphan hands over its increments, which add up."""
    runner = _runner(redis_url, tmp_path)
    runner.reports.totals.counts["ended|v|finished|"] = 4
    fields = {"script_type": "v"}
    for orphaned in (False, True, True):
        runner.reports.stats.ended(fields, "finished", "", 0.001)
        if orphaned:
            runner.reports.parent = -1  # as getppid() != the parent it had at start
        runner.reports.flush(idle=True)
    client = connect(redis_url, 1)
    runner_totals = json.loads(client.hget(keys.STATS_JOBS, "runner|v:0"))
    assert runner_totals["ended|v|finished|"] == 4 + 1
    assert client.hget(keys.STATS_JOBS, "ended|v|finished|") == "2"


def test_a_pop_interrupted_after_the_server_moved_the_entry_still_returns_it(
    redis_url, tmp_path, monkeypatch
):
    """A wake-up (a signal) that lands after the server carried out the blocking pop loses its
    replies: the entry is taken from the head of the in-flight list, not an older key there,
    and the start pipelined behind the pop is found in the job's hash if it ran (never a
    second attempt)."""
    runner = _runner(redis_url, tmp_path)
    client = connect(redis_url, 1)
    client.lpush(INFLIGHT, "job:1:1")  # a stale key left by a refused result
    for job in ("job:1:3", "job:1:4"):
        client.hset(job, mapping={"status": "dispatched", "attempt": "0", "script_type": "v"})
    client.lpush("queue:v", "job:1:3")
    real = SyncRuns.pop_started

    def moved_then_woken(self: SyncRuns, *args: object) -> None:
        real(self, *args)  # type: ignore[arg-type]
        raise Wake

    monkeypatch.setattr(SyncRuns, "pop_started", moved_then_woken)
    popped = runner.popper.pop(["queue:v"], check_first=False)
    assert popped is not None
    assert popped[0] == "job:1:3"
    assert isinstance(popped[1], dict)
    assert (popped[1]["status"], popped[1]["attempt"]) == ("started", "1")

    def moved_not_started(self: SyncRuns, source: str, inflight: str, *_: object) -> None:
        self.client.lmove(source, inflight, "RIGHT", "LEFT")
        raise Wake

    client.lpush("queue:v", "job:1:4")
    monkeypatch.setattr(SyncRuns, "pop_started", moved_not_started)
    # held: the length the take that found nothing read (the stale key and job:1:3)
    assert runner.popper.pop(["queue:v"], check_first=False, held=2) == ("job:1:4", None)
    assert client.hget("job:1:4", "status") == "dispatched"
    monkeypatch.setattr(SyncRuns, "pop_started", lambda *_: (_ for _ in ()).throw(Wake()))
    assert runner.popper.pop(["queue:v"], check_first=False) is None  # woken before anything moved
    assert runner.popper.pop(["queue:v"], check_first=False, held=3) is None


def test_a_blocking_pop_starts_its_entry_in_the_same_round_trip(redis_url, tmp_path):
    """The blocking pop has the start pipelined behind it: the entry comes back started (its
    lease taken, attempt 1), with no start of its own; a timeout starts nothing, not even an
    entry already in flight; an entry that names no job is left for the runner to refuse."""
    runner = _runner(redis_url, tmp_path)
    client = connect(redis_url, 1)
    client.hset("job:1:5", mapping={"status": "dispatched", "attempt": "0", "script_type": "v"})
    client.lpush("queue:v", "job:1:5")

    def evalsha_calls() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    before = evalsha_calls()
    popped = runner.popper.pop(["queue:v"], check_first=False, held=0)
    assert popped is not None
    assert popped[0] == "job:1:5"
    assert isinstance(popped[1], dict)
    assert (popped[1]["status"], popped[1]["attempt"]) == ("started", "1")
    assert evalsha_calls() == before + 1  # the pipelined start, nothing else
    assert client.hget("job:1:5", "runner") == "n:b:1:v:0:job:1:5"
    assert client.zscore(keys.RUNNING, "job:1:5") is not None  # its lease
    # timed out (1 s): the entry already in flight is not started again
    assert runner.popper.pop(["queue:v"], check_first=False, held=1) is None
    assert client.hget("job:1:5", "attempt") == "1"
    client.lpush("queue:v", "job:1:404")  # names no hash
    assert runner.popper.pop(["queue:v"], check_first=False, held=1) == (
        "job:1:404",
        "missing_hash",
    )
    assert client.lrange(INFLIGHT, 0, -1) == ["job:1:404", "job:1:5"]  # the runner refuses it


def test_after_an_empty_take_the_blocking_pop_sends_nothing_ahead(redis_url, tmp_path, monkeypatch):
    """The end whose take found the slot's lists empty read the in-flight list's length with
    it: the blocking pop that follows compares with that, and sends no LLEN of its own."""
    runner = _runner(redis_url, tmp_path)
    client = connect(redis_url, 1)
    client.lpush("queue:v", "job:1:1")
    popped: list[str] = []

    def run_job(job_key: str, _begun: object, nxt: NextJob) -> list:
        popped.append(job_key)
        nxt.found_empty, nxt.held = True, 1  # as an end whose take found nothing
        if len(popped) == 1:
            client.lpush("queue:v", "job:1:2")
        else:
            runner.draining = True
        return []

    lengths: list[str] = []  # the runner's own LLENs (the scripts' are not its round trips)
    monkeypatch.setattr(SyncRuns, "held", lambda _self, name: lengths.append(name) or 0)
    monkeypatch.setattr(runner, "run_job", run_job)
    runner.serve()
    assert popped == ["job:1:1", "job:1:2"]
    assert lengths == []


def test_a_runner_refuses_an_entry_that_is_not_utf8(redis_url, tmp_path):
    runner = _runner(redis_url, tmp_path)
    raw = connect(redis_url, 1)
    redis.Redis.from_url(redis_url, db=1).lpush("queue:v", b"job:1:\xff")
    assert runner.popper.pop(["queue:v"], check_first=True) is None
    [entry] = [json.loads(e) for e in raw.lrange(keys.DLQ, 0, -1)]
    assert entry["reason"] == "not_utf8"
    assert raw.llen(INFLIGHT) == 0


def test_an_end_sent_again_gives_back_what_the_cut_call_took(redis_url, tmp_path, monkeypatch):
    """An end whose connection was cut (a failover: the runner left the old primary) is sent
    again without taking a job; what the cut call took with it (runs_take_next) is given back
    uncounted, else it stays started by this live slot, its lease renewed by the reaper for
    ever. An entry moved but not started goes back to its queue; a final one is dropped."""
    runner = _runner(redis_url, tmp_path)
    client = connect(redis_url, 1)
    token = "n:b:1:v:0:job:1:2"
    client.hset("job:1:2", mapping={"status": "started", "attempt": "1", "runner": token})
    client.hset("job:1:2", mapping={"script_type": "v"})
    client.zadd(keys.RUNNING, {"job:1:2": 2**50})  # its lease, far from lapsing
    client.hset("job:1:3", mapping={"status": "dispatched", "script_type": "v"})
    client.hset("job:1:4", mapping={"status": "finished", "script_type": "v"})
    calls: list[object] = []

    def end(_rans: object, _back: object, nxt: object) -> list:  # Ender._end's signature
        calls.append(nxt)
        if len(calls) == 1:  # it ended job:1:1 and took the others, but its reply was lost
            client.lpush(INFLIGHT, "job:1:3", "job:1:4", "job:1:2")
            raise redis.ConnectionError("cut: the Sentinels named a new primary")
        return []

    monkeypatch.setattr(runner.ender, "_end", end)
    job = RunnerJob(1, 1, 1, "", "v")
    outcome = Outcome(JobStatus.FINISHED, {}, "")
    assert runner.ender.conclude(Ran(job, {}, Message(1, 1, 1), outcome, 1), "next") == []
    assert calls == ["next", None]  # sent again without taking a job
    assert client.lrange(INFLIGHT, 0, -1) == []
    assert client.hmget("job:1:2", "status", "attempt") == ["dispatched", "0"]
    assert client.zrange(keys.RUNNING, 0, -1) == []  # its lease released
    assert sorted(client.lrange("queue:v", 0, -1)) == ["job:1:2", "job:1:3"]


def test_a_job_s_start_and_end_lines_carry_their_fields_in_one_order(redis_url, tmp_path, caplog):
    """Both lines each job logs (started; finished or failed) carry the runner's context and
    slot, then the job, then why, then the rest: the order of every runner line (its JSON
    object's keys, node/observe/logs.py)."""
    runner = _runner(redis_url, tmp_path)
    # what any record carries, and what a handler's formatter adds to it once it has run
    standard = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
    job = RunnerJob(1, 1, 1, "", "v")
    failed = Outcome(JobStatus.ERROR, {}, "exit code 3")
    with caplog.at_level(logging.INFO, logger="node.worker.loop"):
        runner._log_start(job.key, 1)
        runner.ender._log_end(Ran(job, {}, Message(1, 1, 1), failed, 1), False, True)
    start, end = ([k for k in vars(r) if k not in standard] for r in caplog.records)
    assert start == ["ctx", "runner", "job", "attempt"]
    assert end == ["ctx", "runner", "job", "reason", "status", "duration_ms"]
    assert caplog.records[1].reason == "exit code 3"


# -- the processes of a node ---------------------------------------------------------------------


async def _python_job(node, script: str, **kw):
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor, 1, to=node.node_id, context_id=1, script_type="python", script=script, **kw
    )


async def test_a_runner_killed_9_is_restarted_and_its_attempt_reaped(node_factory, tmp_path):
    """SIGKILL of the runner process mid-job: the node sees it exit, ends the attempt
    ``runner_lost`` (retried as the job allows) and starts a fresh process, which runs it."""
    alice = await node_factory("alice", runners={"python": 1})
    # the marker in the context's work dir (the job's cwd), which the retry's sandbox sees too
    first = "import pathlib\np = pathlib.Path('ran-once')\nfirst = not p.exists()\np.touch()\n"
    body = "import time\nif first:\n    time.sleep(60)\nprint('second')\n"
    script = first + announcing(alice.info.redis_url, "run:k", body)  # marked, then announced
    msg = await _python_job(alice, script, retries=1)
    pid = await wait_announced(alice.store, "run:k")
    os.kill(runner_of(pid), signal.SIGKILL)  # the job's sandbox ends with its runner
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.ok, result
    assert result.stdout == "second\n"
    assert result.result["attempts"] == "2"
    history = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(result.job_key))]
    assert history[0]["reason"].startswith("runner_lost")
    with trio.fail_after(20):  # the second attempt announced itself too (it may be over)
        assert await alice.store.call(1, lambda r: r.blpop(["run:k"], timeout=20)) is not None
    assert not alive(pid)
    assert alice.info.state is not None
    assert alice.info.state.counters.metrics["runner_restarts"] >= 1
    assert await alice.store.lrange(1, "inflight:runner:python:0") == []


async def test_an_attempt_a_slot_s_dead_process_left_is_reaped_under_its_live_successor(
    node_factory,
):
    """The runner process SIGKILLed mid-job, its attempt hidden from the slot's recovery as a
    Sentinel failover that lost the recovery's end leaves it (``started``, on no in-flight
    list): once its lease lapses, the reaper ends it ``runner_lost`` though the slot has a
    live process again, and the retry runs it. A reaper that took every attempt of a live
    slot for that process's own would renew this lease for ever (the job never ends)."""
    alice = await node_factory("alice", runners={"python": 1})
    first = "import pathlib\np = pathlib.Path('ran-once')\nfirst = not p.exists()\np.touch()\n"
    body = "import time\nif first:\n    time.sleep(60)\nprint('second')\n"
    script = first + announcing(alice.info.redis_url, "run:h", body)
    msg = await _python_job(alice, script, retries=1)
    job_key = msg.job[0].key
    runner = runner_of(await wait_announced(alice.store, "run:h"))
    os.kill(runner, signal.SIGSTOP)  # still, while its in-flight entry goes
    inflight = "inflight:runner:python:0"
    assert await alice.store.call(1, lambda r: r.lrem(inflight, 1, job_key)) == 1
    os.kill(runner, signal.SIGKILL)
    with trio.fail_after(20):  # the slot's next process runs
        while set(runner_processes_of(alice.config.run_dir)) - {runner} == set():  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert (await alice.store.hgetall(1, job_key))["status"] == "started"  # recovery missed it
    await lapse(alice.store, job_key, 200)
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.ok, result
    assert result.stdout == "second\n"
    history = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(job_key))]
    assert history[0]["reason"] == "runner_lost: slot python:0 of this node no longer runs it"


async def test_runner_processes_are_recycled_after_their_jobs(node_factory, monkeypatch):
    from node.runners import processes as procs

    monkeypatch.setattr(procs, "RECYCLE_JOBS", 2)
    alice = await node_factory("alice", runners={"python": 1})
    pids = []
    # a new runner process is a new sandbox: a job names its sandbox by the start time of the
    # first process of its pid namespace (its /tmp is the job's own, emptied after each job)
    which = "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])"
    for _ in range(5):
        msg = await _python_job(alice, which)
        with trio.fail_after(30):
            [result] = await alice.client.wait_results(msg, timeout_s=30)
        assert result.ok, result
        pids.append(result.stdout)
    assert pids[0] == pids[1]
    assert pids[2] == pids[3]
    assert len(set(pids)) == 3  # 2 jobs per process
    # each process handed its slot's totals over (one field), the next went on from them
    raw = await alice.store.hgetall(1, keys.STATS_JOBS)
    assert "runner|python:0" in raw
    assert "ended|python|finished|" not in raw
    stats = await records.job_stats(alice.store, 1)
    assert stats["ended|python|finished|"] == stats["answered|python|finished|"] == "5"
    assert alice.info.state is not None
    assert "runner_restarts" not in alice.info.state.counters.metrics


@pytest.mark.parametrize("isolation", ["auto", "none"])
async def test_a_timed_out_python_job_ends_its_process_and_the_next_job_runs(
    node_factory, isolation: str
):
    # "none" too: with no pid namespace, the job process (its own session) outlived a kill
    # of the worker's process group and ran to its end
    alice = await node_factory("alice", runners={"python": 1}, isolation=isolation)
    msg = await _python_job(
        alice, announcing(alice.info.redis_url, "run:t", "import time\ntime.sleep(60)"), timeout_s=1
    )
    pid = await wait_announced(alice.store, "run:t")
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(msg, timeout_s=30)
    assert result.status is JobStatus.ERROR
    assert result.reason.startswith("timeout")
    assert not alive(pid)
    nxt = await _python_job(alice, "print('next')")
    with trio.fail_after(30):
        [after] = await alice.client.wait_results(nxt, timeout_s=30)
    assert after.stdout == "next\n"


@pytest.mark.slow
async def test_sigterm_stops_every_runner_process_and_leaves_nothing(tmp_path):
    node = NodeProcess(tmp_path / "a", "a", grace_s=20)
    try:
        await node.start()
        run_dir = node.config.run_dir
        # a process per slot of context 1 (python: one per core, node/config; sh 2)
        assert len(runner_processes_of(run_dir)) == sum(node.config.runners.values())
        script = announcing(node.redis_url, "run:s", "import time\ntime.sleep(1)\nprint('done')")
        actor = read_key_file(node.config.actor_key_path)
        async with open_client(node.redis_url) as client:
            msg = await client.submit_job(
                actor, 1, to=node.node_id, context_id=1, script_type="python", script=script
            )
            pid = await wait_announced(client.store, "run:s")
            assert await node.signal_and_wait(signal.SIGTERM, timeout_s=60) == 0
            assert not alive(pid)
            assert runner_processes_of(run_dir) == []
            await node.start()
            with trio.fail_after(30):
                [result] = await client.wait_results(msg, timeout_s=30)
        assert result.ok  # it finished within the grace period
        assert result.stdout == "done\n"
        assert result.result["attempts"] == "1"
    finally:
        await node.close()
    assert runner_processes_of(run_dir) == []
    assert not list((run_dir / "jobs").glob("*"))  # their pid files went with them


def test_a_runner_reaches_valkey_on_a_unix_socket_url_without_credentials(tmp_path):
    sock = tmp_path / "v.sock"
    spec = ValkeySpec(port=0, data_dir=tmp_path / "v", persist=False, unix_socket=sock)
    server = ValkeyProcess(spec)
    server.start()
    try:
        client = connect(f"unix://{sock}", 3)
        client.set("k", "v")
        assert client.get("k") == "v"
        assert connect(f"unix://{sock}", 0).get("k") is None  # it was DB 3
    finally:
        server.stop()


def test_spec_and_key_round_trip_through_the_pipe():
    spec = RunnerSpec("redis://x", 1, "sh", 2, ["sh"], "", "t", 1, "/r", 1, 1, "n", False, 3)
    assert RunnerSpec(**json.loads(spec.to_json())) == spec
    read, write = os.pipe()
    os.write(write, frame(spec, b"\x01" * 32) + b'{"stop": "job:1:1"}\n')
    assert read_frame(read) == (spec, b"\x01" * 32)
    assert os.read(read, 100) == b'{"stop": "job:1:1"}\n'  # the control lines stay in the pipe
    os.close(read)
    os.close(write)
    assert spec.slot_id == "sh:2"
    assert spec.inflight == "inflight:runner:sh:2"
    assert procjob.PROCESS.control == -1  # nothing here set up a runner process


def test_a_runner_process_starts_without_the_async_stack():
    """A runner process is a fresh interpreter per slot, six per context by default, started
    again after every recovery: what it imports is paid at each start (0.70 s of CPU here with
    trio and the flows in, 0.56 s without). It needs neither trio, coredis, the async client
    nor flows; importing its modules must not bring them in."""
    import subprocess
    import sys

    unwanted = ("trio", "coredis", "anyio", "bus.client.api", "bus.core.flows", "bus.core.dag")
    probe = (
        "import sys, node.worker.pyjobs, node.worker.loop; "
        f"print(','.join(m for m in {unwanted!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_a_runner_process_starts_without_the_metrics_sdk():
    """redis-py, the runner's store client, imports OpenTelemetry's metrics SDK when it is
    installed (65 ms of a runner's start), for client metrics a runner never turns on: the
    runner's entry loads its loop without any OpenTelemetry SDK (docs/operate/tracing.md: with
    tracing off a runner imports none), and the SDK stays importable afterwards."""
    import subprocess
    import sys

    probe = (
        "import sys; from node.worker.__main__ import METRICS_SDK, load_loop; load_loop(); "
        "sdk = [m for m in sys.modules if m.startswith('opentelemetry.sdk')]; "
        "print('redis' in sys.modules, bool(sdk), end=' '); "
        "import opentelemetry.sdk.metrics; print(METRICS_SDK in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "False", "True"]


async def test_each_type_s_first_runner_is_up_before_the_others_start(autojump_clock):
    """The first job of a context created while the node runs waits for one start, not for
    all of them: each type's first slot starts first, together, and the other slots once
    those are up. At the node's start, all at once (it reports ready when all are up)."""
    slots = [
        (t, [t], n) for t, count in (("python", 3), ("sh", 2), ("js", 1)) for n in range(count)
    ]
    events: list[tuple[str, str, int]] = []

    async def start(slot: tuple[str, list[str], int]) -> None:
        events.append(("begin", slot[0], slot[2]))
        await trio.sleep(1 + slot[2] / 10)  # a start takes a while; its process is then up
        events.append(("up", slot[0], slot[2]))

    await start_in_stages(slots, start, staged=True)
    firsts_up = [i for i, (what, _, n) in enumerate(events) if what == "up" and n == 0]
    others_begin = [i for i, (what, _, n) in enumerate(events) if what == "begin" and n > 0]
    assert len(firsts_up) == 3
    assert len(others_begin) == 3
    assert max(firsts_up) < min(others_begin)
    assert sorted((t, n) for what, t, n in events if what == "up") == sorted(
        (t, n) for t, _, n in slots
    )
    assert start_stages(slots, staged=False) == [slots]
