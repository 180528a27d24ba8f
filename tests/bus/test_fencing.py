"""A stall is not a crash: attempts are fenced by their number, not by lease presence.

Lua-level tests of the fence against a real Valkey, then running nodes whose leases lapse
under a live job (re-taken, the job finishes once) or under a job no process runs (reaped).
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from bus.client.api import open_client
from bus.core import admitted, keys
from bus.core.attempts import Outcome
from bus.core.models import JobStatus, Message, RunnerJob
from bus.store.atomic import runs, runs_trio
from bus.store.atomic.runs_sync import SyncRuns
from crypto import read_key_file
from node.host.hardening import ensure_admission_key
from node.runners.adoption import adopted_outcome
from node.slot import outcomes
from node.worker.loop import SlotLoop
from tests.leases import lapse, lease_left_ms
from tests.nodeproc import NodeProcess
from tests.scripts import announcing, command_job_run, wait_announced

JOB = "job:1:1"


async def _started(store, sync_runs: SyncRuns, attempts: int = 1) -> dict[str, str]:
    await store.hset(1, JOB, {"status": "dispatched", "attempt": "0"})
    fields: dict[str, str] = {}
    for _ in range(attempts):
        started = sync_runs.start(JOB, "tok", 10_000, "python:0")
        assert isinstance(started, dict)
        fields = started
    return fields


async def _finish_local(store, attempt: int) -> bool:
    ending = runs.Ending(
        JOB, attempt, "inflight:runner:python:0", "finished", {"stdout": "x"}, "", "{}"
    )
    return await runs_trio.finish_local(
        store,
        1,
        ending,
        request_key="message:1:1",
        reply_ttl_s=60,
    )


async def test_a_current_attempt_is_accepted_after_its_lease_expired(store, sync_runs):
    fields = await _started(store, sync_runs)
    assert (fields["attempt"], fields["runner_id"]) == ("1", "python:0")
    await lapse(store, JOB)  # lapsed during a stall
    assert await _finish_local(store, 1)
    job = await store.hgetall(1, JOB)
    assert (job["status"], json.loads(job["result"])) == ("finished", {"stdout": "x"})
    assert await store.llen(1, keys.reply("message:1:1")) == 1
    assert not await _finish_local(store, 1)  # ended: a second conclusion is refused


async def test_a_superseded_attempt_is_refused_even_holding_the_lease(store, sync_runs):
    # attempt 1 was presumed lost and the job started again
    await _started(store, sync_runs, attempts=2)
    assert not await _finish_local(store, 1)
    assert not await runs_trio.retry_later(
        store, 1, JOB, 1, "inflight:x", queue="queue:python", cause="r", entry="{}", due_ms=0
    )
    assert not sync_runs.finish_malformed(JOB, 1, "inflight:x", "bad")
    assert not sync_runs.requeue(JOB, 1, "inflight:x", "queue:python")
    assert (await store.hgetall(1, JOB))["status"] == "started"
    assert await store.llen(1, keys.reply("message:1:1")) == 0
    assert await _finish_local(store, 2)


async def test_renew_retakes_a_lapsed_lease_only_for_the_current_attempt(store, sync_runs):
    await _started(store, sync_runs, attempts=2)
    await lapse(store, JOB)
    assert not await runs_trio.renew(store, 1, JOB, "old", 10_000, 1)
    assert (await lease_left_ms(store, JOB) or 0) < 0  # still lapsed
    assert await runs_trio.renew(store, 1, JOB, "tok", 10_000, 2)
    assert 9_000 < (await lease_left_ms(store, JOB) or 0) <= 10_000


async def _submit(node, script: str, script_type: str = "python", **kw):
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor, 1, to=node.node_id, context_id=1, script_type=script_type, script=script, **kw
    )


def work_of(home: Path) -> Path:
    """Context 1's work dir under ``home``: the one place of the host its sandboxed jobs see
    (their cwd), where these tests' jobs keep their files."""
    work = home / "work" / "1"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _gated(redis_url: str, tag: str, tmp_path) -> str:
    """A python job that announces itself, waits until the test creates ``<tag>.go``, then
    records one run in ``<tag>.runs`` and prints ``done``."""
    body = (
        "import pathlib, time\n"
        "base = pathlib.Path('.')\n"  # the job's cwd, its work dir (see work_of)
        f"while not (base / '{tag}.go').exists(): time.sleep(0.02)\n"
        f"with open(base / '{tag}.runs', 'a') as f: f.write('run\\n')\n"
        "print('done')\n"
    )
    return announcing(redis_url, f"pid:{tag}", body)


async def test_a_live_job_whose_lease_expired_retakes_it_and_finishes_once(node_factory, tmp_path):
    alice = await node_factory("alice", runners={"python": 1})
    tmp_path = work_of(alice.config.home)
    msg = await _submit(alice, _gated(alice.info.redis_url, "live", tmp_path), retries=2)
    await wait_announced(alice.store, "pid:live")
    job_key = msg.job[0].key
    await lapse(alice.store, job_key)  # as a stall would let it lapse
    with trio.fail_after(20):  # re-taken: the attempt is alive here
        while (await lease_left_ms(alice.store, job_key) or 0) <= 0:  # noqa: ASYNC110
            await trio.sleep(0.05)  # a real job process holds it: poll what Valkey shows
    assert (await alice.store.hgetall(1, job_key))["status"] == "started"
    (tmp_path / "live.go").touch()
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(msg, timeout_s=20)
    assert result.ok, result.reason
    assert (result.stdout, result.result["attempts"]) == ("done\n", "1")
    assert (tmp_path / "live.runs").read_text() == "run\n"


async def test_a_started_job_this_node_no_longer_runs_is_reaped(node_factory):
    """A job started under this node's current run but run by none of its slots (the slot's
    task failed after starting it) is ended ``runner_lost`` once its lease expires."""
    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    first = await _submit(alice, "print(1)")
    with trio.fail_after(20):
        await alice.client.wait_results(first, timeout_s=20)
    token = (await alice.store.hgetall(1, first.job[0].key))["runner"]
    orphan = await _submit(alice, "print(2)", script_type="ext")  # queued, never popped here
    job_key = orphan.job[0].key
    # stage the orphan on the job the node admitted: the runner refuses a hand-written hash
    # (not_admitted), and one written before intake materialises it makes intake refuse the
    # message (job_exists)
    with trio.fail_after(20):
        while not await alice.store.call(1, lambda r: r.lrem("queue:ext", 1, job_key)):  # noqa: ASYNC110
            await trio.sleep(0.05)  # intake materialises it in its own time: poll Valkey
    await alice.store.call(1, lambda r: r.rpush("inflight:runner:python:0", [job_key]))
    await alice.store.call(1, lambda r: r.hincrby(job_key, "attempt", 1))
    started = {"status": "started", "runner": token, "runner_id": "python:0"}
    await alice.store.hset(1, job_key, started)
    key = ensure_admission_key(alice.config.home)  # the node's, made when it started
    assert admitted.problem(key, 1, job_key, await alice.store.hgetall(1, job_key)) == ""
    await lapse(alice.store, job_key, 200)
    with trio.fail_after(20):
        [result] = await alice.client.wait_results(orphan, timeout_s=20)
    assert result.status is JobStatus.ERROR
    assert result.reason == "runner_lost: slot python:0 of this node no longer runs it"
    assert await alice.store.lrange(1, "inflight:runner:python:0") == []
    assert await runs_trio.running_jobs(alice.store, 1) == []


# -- the processes that write outcomes ----------------------------------------------------------


def test_the_outcome_a_runner_keeps_is_the_one_the_node_adopts(tmp_path, redis_url):
    """Before asking Valkey to record an attempt's end, the runner keeps its outcome on disk
    (Ender.keep): the exit status as the node reads it (a signal as -N), and a reason only
    where the status does not say it (a timeout), so a node that adopts the file after the
    runner died (node/runners/adoption.py) concludes what the runner concluded."""
    run = command_job_run(tmp_path, redis_url, ["/bin/sh", "-s"])
    runner = SlotLoop(run.job_run.spec, b"k" * 32)
    runner.job = runner.ender.job = run.job_run  # the slot's JobRun, as the process has it
    cases = [
        ("echo hi; exit 3", "exit code 3", {"exit_code": 3}),
        ("kill -9 $$", "runner_lost: killed by SIGKILL", {"exit_code": -9}),
    ]
    for ident, (script, reason, kept) in enumerate(cases, start=2):
        job = RunnerJob(1, ident, 1, script, "sh", timeout=30)
        done = run(job)
        assert done is not None
        assert done.reason == reason
        path = outcomes.outcome_path(tmp_path, 1, job.key, 1)
        runner.ender.keep(done)
        assert outcomes.read_outcome(path) == kept
        adopted = adopted_outcome(path, run.job_run.logs, 10_000)
        assert adopted.found
        assert (adopted.outcome.status, adopted.outcome.reason) == (done.status, done.reason)
        assert adopted.outcome.result.get("stdout") == done.result.get("stdout")
    # killed by its runner (JobRun.run's outcome for a timeout): the status does not say why
    timed_out = Outcome(JobStatus.ERROR, {}, "timeout: killed after 1 s")
    runner.ender.keep(timed_out)
    assert outcomes.read_outcome(path) == {"exit_code": -9, "reason": timed_out.reason}
    adopted = adopted_outcome(path, run.job_run.logs, 10_000)
    assert (adopted.outcome.status, adopted.outcome.reason) == (JobStatus.ERROR, timed_out.reason)


def test_outcome_names_carry_context_job_and_attempt(tmp_path):
    path = outcomes.outcome_path(tmp_path, 7, "job:12:34", 3)
    assert outcomes.parse_outcome_name(path.name) == (7, "job:12:34", 3)
    assert outcomes.parse_outcome_name(path.name + ".tmp") is None
    assert outcomes.parse_outcome_name("junk") is None


# -- real node processes: a stall of the node, a kill of the node --------------------------------


@pytest.fixture
async def node_proc(tmp_path):
    made: list[NodeProcess] = []

    def make(name: str, **node_options: object) -> NodeProcess:
        # one slot of each type: each test runs one job, and every slot is a runner process
        # each start and restart waits for (the default is one python slot per core)
        made.append(NodeProcess(tmp_path / name, name, runners={"python": 1, "sh": 1}))
        cfg = made[-1].config.config_path
        text = cfg.read_text()
        for key, value in node_options.items():  # init writes every setting: replace its line
            text, found = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text, count=1)
            assert found, key
        cfg.write_text(text)
        return made[-1]

    yield make
    for n in made:
        await n.close()


async def _submit_to(node: NodeProcess, script: str, script_type: str = "python", **kw):
    actor = read_key_file(node.config.actor_key_path)
    async with open_client(node.redis_url) as client:
        return await client.submit_job(
            actor, 1, to=node.node_id, context_id=1, script_type=script_type, script=script, **kw
        )


async def _result(node: NodeProcess, msg, timeout_s: float = 30):
    async with open_client(node.redis_url) as client:
        with trio.fail_after(timeout_s):
            [result] = await client.wait_results(msg, timeout_s=timeout_s)
    return result


async def _begun_with_a_short_lease(
    node_proc: Callable[..., NodeProcess], tag: str
) -> tuple[NodeProcess, Path, Message]:
    """Node ``a`` with a 600 ms lease TTL, and the message of its job that, once it has begun,
    sleeps 0.5 s, records one run in ``<tag>.runs`` of its work dir and prints ``done``;
    returned once the job has begun (node, work dir, message)."""
    node = node_proc("a", lease_ttl_ms=600)
    await node.start()
    work = work_of(node.home)
    body = (
        "import time, pathlib; base = pathlib.Path('.')\n"  # its work dir (see work_of)
        "time.sleep(0.5)\n"
        f"with open(base / '{tag}.runs', 'a') as f: f.write('run\\n')\n"
        "print('done')\n"
    )
    msg = await _submit_to(node, announcing(node.redis_url, f"began:{tag}", body), retries=2)
    async with open_client(node.redis_url) as client:
        await wait_announced(client.store, f"began:{tag}")
    return node, work, msg


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP) for the block, continued after it whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _finished_once(node: NodeProcess, msg: Message, work: Path, tag: str) -> None:
    result = await _result(node, msg, timeout_s=15)
    assert result.ok, result.reason
    assert (result.stdout, result.result["attempts"]) == ("done\n", "1")
    assert (work / f"{tag}.runs").read_text() == "run\n"


async def test_node_stalled_beyond_the_lease_ttl_finishes_the_job_once(node_proc):
    node, work, msg = await _begun_with_a_short_lease(node_proc, "stall")
    assert node.proc is not None
    with stopped(node.proc.pid):  # the script ends, the lease lapses meanwhile
        await trio.sleep(2.5)  # the stall itself (> 4 lease TTLs), not a wait for state
    await _finished_once(node, msg, work, "stall")


async def _wait_for_file(path, timeout_s: float = 20) -> None:
    with trio.fail_after(timeout_s):
        while not path.exists():  # noqa: ASYNC110 - written by a job process, not by us
            await trio.sleep(0.05)


async def test_killed_node_adopts_a_python_job_still_running_at_restart(node_proc, tmp_path):
    """kill -9 of the node; its warm worker finishes the job after the restart began: the
    restarted node waits for it and adopts its outcome; the job ran once."""
    node = node_proc("a")
    await node.start()
    tmp_path = work_of(node.home)
    msg = await _submit_to(node, _gated(node.redis_url, "py", tmp_path), retries=2)
    async with open_client(node.redis_url) as client:
        await wait_announced(client.store, "pid:py")
    await node.kill()
    await node.start()  # the job's process still runs: it waits for py.go
    (tmp_path / "py.go").touch()
    result = await _result(node, msg)
    assert result.ok, result.reason
    assert (result.stdout, result.result["attempts"]) == ("done\n", "1")
    assert (tmp_path / "py.runs").read_text() == "run\n"


async def test_killed_node_adopts_an_sh_job_that_ended_while_it_was_down(node_proc, tmp_path):
    """kill -9 of the node; its sh job ends while no node runs: the restarted node finds the
    outcome the job's wrapper wrote and concludes with it (output from the slot's log)."""
    node = node_proc("a")
    await node.start()
    work = work_of(node.home)
    began, runs = work / "sh.began", work / "sh.runs"
    script = "touch sh.began; sleep 1; echo run >> sh.runs; echo hello"  # in its work dir
    msg = await _submit_to(node, script, script_type="sh", retries=2)
    await _wait_for_file(began)
    await node.kill()
    await _wait_for_file(runs)
    stale = node.config.run_dir / "outcomes" / "1-job:1:999-1"  # of no started job
    stale.write_text('{"exit_code": 0}')
    await node.start()
    result = await _result(node, msg)
    assert result.ok, result.reason
    assert (result.stdout, result.result["attempts"]) == ("hello\n", "1")
    assert runs.read_text() == "run\n"
    assert not stale.exists()
    assert list((node.config.run_dir / "outcomes").iterdir()) == []  # adopted, then dropped


async def test_valkey_stalled_beyond_the_lease_ttl_finishes_the_job_once(node_proc):
    node, work, msg = await _begun_with_a_short_lease(node_proc, "vk")
    valkey = int((node.config.valkey_dir / "valkey.pid").read_text())
    with stopped(valkey):  # the script ends; the lease expires when Valkey wakes
        await trio.sleep(2.5)  # the stall itself, not a wait for state
    await _finished_once(node, msg, work, "vk")
