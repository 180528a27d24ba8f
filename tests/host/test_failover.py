"""A node on a replicated store (a real primary, two replicas, three Sentinels): the primary
SIGKILLed while jobs flow, and WAITAOF behind every promise.

The failover test submits N_JOBS python jobs to the node; each appends its tag to a file when
it ends, so executions can be counted. A third of the way in, the primary is SIGKILLed: the
Sentinels promote a replica (down-after 1 s) and the node, its runner processes and the client
follow it without a restart. Afterwards every job whose submit returned must be final, run
once, and never be reported failed while it ran. The counters are printed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import coredis
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from bus.client.api import Client, new_job, open_client
from bus.core import keys
from bus.core.models import JobStatus, Message
from bus.errors import ClientError, StoreError
from bus.store.durable import NotDurable
from bus.store.promise import EVERY_REPLICA, ONE_REPLICA
from crypto import KeyPair, read_key_file
from node.host.acl import NODE
from node.host.replicated import SENTINEL
from tests.cli.test_cli_json_schemas import validator
from tests.console_http import get
from tests.leases import lease_left_ms
from tests.nodes import until
from tests.replicated_rig import ROOT, Rig, current_primary, replicated_node, sentinel_events
from tests.scripts import named

# The long fault suites run one after another on one test worker (README "Run the tests"):
# two of them side by side on a 2-core machine would stretch the timings they inject.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

N_JOBS = 300
KILL_AT = N_JOBS // 3
WAVE = 12  # submits at once: 3 a python slot of the rig (4), so that batches form
STOPPED_S = 5.0  # a SIGSTOPped primary stalls this long: a replica is promoted meanwhile
RESTART_AFTER_S = 2.0  # a SIGKILLed primary is started again this long after
SCRIPT = """\
import os
with open(os.environ["OUT"], "a") as f:
    f.write(os.environ["TAG"] + "\\n")
"""


async def final_of(client: Client, msg: Message, deadline: float) -> str:
    """The final status of ``msg``'s one job: its reply (BLPOP), or, when a failover cut the
    pop or the reply went with the old primary, the job's own hash ("" if not final in time).
    Past the deadline (one job that never ends spends it all) the hash is still read once, so
    that the jobs after it are counted for what they are."""
    job_key = msg.job[0].key
    while trio.current_time() < deadline:
        try:
            [res] = await client.wait_results(msg, timeout_s=3)
            return res.status.value
        except (StoreError, ClientError):
            status = await _job_status(client, job_key)
            if status:
                return status
    return await _job_status(client, job_key)


async def _job_status(client: Client, job_key: str) -> str:
    """The job's status if it is final, else ""."""
    try:
        status = (await client.store.hgetall(1, job_key)).get("status", "")
    except StoreError:
        return ""
    return status if status and JobStatus(status).final else ""


@asynccontextmanager
async def submitting(rig: Rig) -> AsyncIterator[Callable[[], Awaitable[Message]]]:
    """A client of the rig's store, as ``submit()``: each call submits one ``sh`` job
    ``true`` as the rig's actor."""
    actor = read_key_file(rig.home / "actor.key")
    async with open_client(rig.client_url) as client:
        yield partial(
            client.submit_job, actor, 1, to="self", context_id=1, script_type="sh", script="true"
        )


async def submit_tagged(client: Client, actor: KeyPair, tag: str) -> Message:
    """One SCRIPT job that appends ``tag`` to ran.txt of its work dir when it runs."""
    return await client.submit_job(
        actor,
        1,
        to="self",
        context_id=1,
        script_type="python",
        script=SCRIPT,
        env_vars={"TAG": tag, "OUT": "ran.txt"},
        retries=2,
    )


@pytest.mark.parametrize("fault", ["sigkill", "sigkill-gone", "sigstop"])
async def test_primary_lost_mid_flow_loses_nothing_and_runs_nothing_twice(tmp_path, fault):
    """``sigkill``: the primary dies, and is started again RESTART_AFTER_S later.
    ``sigkill-gone``: it dies and is never started again: once the Sentinels flag it down it
    is counted out, and writes are confirmed again on the one replica left. ``sigstop``: it
    stalls past down-after while a replica is promoted, then wakes up cut off from its
    replicas (it refuses writes: NOREPLICAS), with the client's connections still open to it,
    until the node makes it a replica. The time until writes are confirmed again is printed
    (a figure, not a bound: the machine is shared)."""
    # jobs run sandboxed: each appends to ran.txt in context 1's work dir, the one place it
    # may write (docs/security/sandbox.md)
    async with replicated_node(tmp_path, console_listen="127.0.0.1:0") as rig:
        out = rig.work() / "ran.txt"
        counted = await _flow(rig, out, fault)
        async with open_client(rig.node_url) as node:
            after = await node.store.topology()
        status = await cli_status(rig)
        events = await _events(rig)
    print("failover counters:", " ".join(f"{k}={v}" for k, v in counted.items()))
    print("store after:", after)
    print(f"writes confirmed again {counted['writes_resumed_s']} s after the {fault}")
    print("node events:", events)
    old_primary = f"127.0.0.1:{rig.servers.data_ports[0]}"
    assert after["primary"] != old_primary
    assert after["failovers"] >= 1
    assert status["store"]["primary"] == after["primary"]
    # a submit cut by the failover, or made while not every replica is back, is told
    assert counted["acknowledged"] + counted["refused"] == N_JOBS
    assert counted["acknowledged"] >= N_JOBS // 2
    for name in ("lost", "stuck", "completed_twice", "told_failed_but_ran"):
        assert counted[name] == 0, counted
    assert counted["finished_unseen"] == 0, counted  # the run counts read the jobs' file
    assert counted["writes_resumed_s"] >= 0  # writes were confirmed again after the fault
    # the runners took jobs several at a time (one take, one WAITAOF for its starts)
    assert events.get("batch_takes", 0) >= 1, events
    if fault == "sigkill-gone":  # ... without the dead server: counted out, shown down
        assert not rig.servers.child(rig.servers.data_ports[0]).running
        [row] = [r for r in after["replicas"] if r["address"] == old_primary]
        assert row["link"] == "down"
        assert after["promise"]["replicas_wanted"] == 1


async def _events(rig: Rig) -> dict[str, float]:
    """The node's own counters as its /metrics has them now (``hero_node_events_total``: the
    runners' reports included), by event."""
    _, _, body = await get(rig.ready.console_url + "/metrics")
    return {
        s.labels["event"]: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "hero_node_events_total"
    }


async def cli_status(rig: Rig, healthy: bool = True, *, text: bool = False) -> Any:  # noqa: ANN401
    """``hero-node status --json`` of the rig's home (it finds the store through the Sentinels),
    parsed; with ``text``, what ``status`` prints. Exit 0 if ``healthy``, else 3."""
    argv = [sys.executable, "-m", "node.cli", "--home", str(rig.home), "status"]
    argv += [] if text else ["--json"]
    done = await trio.run_process(argv, capture_stdout=True, check=False, cwd=ROOT)
    assert done.returncode == (0 if healthy else 3), done
    return done.stdout.decode() if text else json.loads(done.stdout)


async def test_a_submit_is_not_acknowledged_until_a_replica_has_it(tmp_path):
    """With both replicas stopped the primary still takes the write (within
    min-replicas-max-lag), but WAITAOF cannot confirm a replica's fsync: the client is told."""
    async with replicated_node(tmp_path) as rig:
        async with submitting(rig) as submit:
            await submit()  # acknowledged while the replicas are up
            for port in rig.servers.data_ports[1:]:
                rig.servers.child(port).signal(signal.SIGSTOP)
            try:
                with pytest.raises(NotDurable, match="not durable"):
                    await submit()
            finally:
                for port in rig.servers.data_ports[1:]:
                    rig.servers.child(port).signal(signal.SIGCONT)
            text = await trio.run_process(
                [sys.executable, "-m", "node.cli", "--home", str(rig.home), "status"],
                capture_stdout=True,
                cwd=ROOT,
            )
    shown = text.stdout.decode()
    print(shown)
    assert f"store hero: primary 127.0.0.1:{rig.servers.data_ports[0]}" in shown


async def _flow(rig: Rig, out, fault: str) -> dict[str, object]:  # noqa: ANN001
    actor = read_key_file(rig.home / "actor.key")
    old_primary = rig.servers.data_ports[0]
    acked: list[Message] = []
    refused = 0
    resumed_s = -1.0
    async with (
        open_client(rig.client_url) as client,
        open_client(rig.node_url) as probe,
        trio.open_nursery() as nursery,
    ):

        async def kill_primary() -> None:
            nonlocal resumed_s
            primary = rig.servers.child(old_primary)
            if fault.startswith("sigkill"):
                began = trio.current_time()
                await trio.to_thread.run_sync(primary.kill)
                if fault == "sigkill":  # the operator restarts it: the node makes it a replica
                    await trio.sleep(RESTART_AFTER_S)
                    await trio.to_thread.run_sync(rig.servers.restart, old_primary)
                await _writes_confirmed(probe)
                resumed_s = trio.current_time() - began
                return
            began = time.monotonic()
            primary.signal(signal.SIGSTOP)
            await trio.sleep(STOPPED_S)  # the stall itself, past down-after (1 s)
            primary.signal(signal.SIGCONT)
            await _writes_confirmed(probe)
            resumed_s = time.monotonic() - began

        async def submit(i: int) -> None:
            nonlocal refused
            try:
                msg = await submit_tagged(client, actor, f"j{i:03d}")
            except StoreError as exc:
                refused += 1  # told: not a promise (it may run all the same)
                if refused < 4 or refused % 50 == 0:
                    print(f"submit {i} refused: {exc}")
                return
            acked.append(msg)

        with trio.fail_after(120):
            # WAVE submits at a time: more jobs queued at once than the node has python slots,
            # so that the slots take them in batches, across the failover too
            for wave in range(0, N_JOBS, WAVE):
                if wave <= KILL_AT < wave + WAVE:
                    nursery.start_soon(kill_primary)
                async with trio.open_nursery() as submits:
                    for i in range(wave, min(wave + WAVE, N_JOBS)):
                        submits.start_soon(submit, i)
        counted = await _counts(client, probe, acked, out)
    return counted | {
        "refused": refused,
        "writes_resumed_s": round(resumed_s, 2),
        "node_restarts": 0 if rig.node.returncode is None else 1,
    }


async def _counts(
    client: Client, probe: Client, acked: list[Message], out: Path
) -> dict[str, object]:
    """Jepsen-style counts of the acknowledged submits ``acked``: final or not, and how many
    times each ran (its tag in ``out``; a re-run is allowed only after a runner was lost under
    an attempt)."""
    deadline = trio.current_time() + 90
    finals = [await final_of(client, m, deadline) for m in acked]
    ran = (
        Counter((await trio.Path(out).read_text()).split())
        if await trio.Path(out).exists()
        else Counter[str]()
    )
    tags = [m.job[0].env_vars["TAG"] for m in acked]
    for m, f, t in zip(acked, finals, tags, strict=True):
        if not f:  # where an unfinished job is, for the log: its attempt, runner and lease
            job_key = m.job[0].key
            job = await probe.store.hgetall(1, job_key)
            held = {k: job.get(k) for k in ("status", "attempt", "runner", "runner_id")}
            lease_ms = await lease_left_ms(probe.store, job_key)
            print(t, m.key, await client.delivery_status(1, m.key), held, "lease", lease_ms)
    lost_runners = {
        t: sum(
            json.loads(e).get("reason", "").startswith("runner_lost")
            for e in await probe.store.lrange(1, keys.attempts(m.job[0].key))
        )
        for m, t in zip(acked, tags, strict=True)
        if ran[t] > 1
    }
    twice = sum(1 for t in tags if ran[t] - 1 > lost_runners.get(t, 0))
    return {
        "acknowledged": len(acked),
        "finished": finals.count("finished"),
        "lost": sum(1 for f, t in zip(finals, tags, strict=True) if not f and not ran[t]),
        "stuck": sum(1 for f in finals if not f),
        "completed_twice": twice,
        "at_least_once_reruns": sum(1 for t in tags if ran[t] > 1) - twice,
        "told_failed_but_ran": sum(
            1 for f, t in zip(finals, tags, strict=True) if f == "error" and ran[t]
        ),
        # finished, yet its tag not in ``out``: the counts above would be blind
        "finished_unseen": sum(
            1 for f, t in zip(finals, tags, strict=True) if f == "finished" and not ran[t]
        ),
    }


ROUNDS = 10  # stalls of the primary, one failover each
STALL_S = 2.0  # the plain stall: past down-after (1 s), about as long as the election
SUBMITTERS = 2
SUBMIT_GAP_S = 0.1  # each submitter's pause between submits: ~20 jobs a second in all
FLOW_S = 1.0  # submits acknowledged between the set's recovery and the next stall
# the leader announces this once it sent SLAVEOF NO ONE to the replica it chose, before it
# moves the other replica (it does that once it sees the promoted one answer as primary):
# woken now, the old primary still has that other replica
PROMOTING = "+failover-state-wait-promotion"
SWITCHED = "+switch-master"
CONVERTED = "+convert-to-slave"  # the Sentinels made the woken old primary a replica


async def test_a_primary_woken_inside_the_failover_window_breaks_no_promise(tmp_path: Path) -> None:
    """The primary stalls (SIGSTOP) while two clients submit, ROUNDS times: in even rounds it
    wakes the moment a replica is being promoted, before the Sentinels move the other replica
    (which it still has, so ``WAITAOF 1 1`` there confirms writes the next resync erases); in
    odd rounds after a plain STALL_S stall. Every acknowledged submit must then run once and
    be final. The woken old primary is made a replica by the node as soon as it answers,
    not by the Sentinels 8 s later; the time until writes are confirmed again is printed."""
    async with replicated_node(tmp_path) as rig:
        out = rig.work() / "ran.txt"
        actor = read_key_file(rig.home / "actor.key")
        acked: list[Message] = []
        refused: list[str] = []
        resumed: list[float] = []
        switched = by_sentinels = 0
        async with (
            open_client(rig.client_url) as client,
            open_client(rig.node_url) as probe,
            sentinel_events(rig, [PROMOTING, SWITCHED, CONVERTED]) as events,
        ):

            async def submitter(who: int) -> None:
                for i in range(10**6):
                    try:
                        acked.append(await submit_tagged(client, actor, f"s{who}-{i}"))
                    except StoreError as exc:
                        refused.append(str(exc))  # told: not a promise
                    await trio.sleep(SUBMIT_GAP_S)

            with trio.fail_after(40 * ROUNDS):
                async with trio.open_nursery() as nursery:
                    for who in range(SUBMITTERS):
                        nursery.start_soon(submitter, who)
                    for r in range(ROUNDS):
                        await trio.sleep(FLOW_S)
                        stalled_s, moved, converted = await _stall(rig, events, timed=r % 2 == 0)
                        by_sentinels += converted
                        switched += moved
                        resumed.append(stalled_s + await _writes_confirmed(probe))
                    nursery.cancel_scope.cancel()
            counted = await _counts(client, probe, acked, out)
    node_log = (await trio.Path(rig.log).read_text()).splitlines()
    by_node = sum("said it is a primary: made a replica" in line for line in node_log)
    counted |= {"refused": len(refused), "failovers": switched}
    counted |= {"made_replica_by_node": by_node, "by_sentinels": by_sentinels}
    print("window counters:", " ".join(f"{k}={v}" for k, v in counted.items()))
    print("writes confirmed again after (s):", [round(s, 1) for s in resumed])
    print("refusals, e.g.:", sorted(set(refused))[:3])
    assert switched >= ROUNDS // 2  # the timed wakes at least come inside a failover
    assert counted["acknowledged"] >= ROUNDS * 5  # promises were given around each stall
    for name in ("lost", "stuck", "completed_twice", "told_failed_but_ran"):
        assert counted[name] == 0, counted
    # every-replica gives no promise until the woken old primary is a replica again; the
    # Sentinels convert it only once it has reported itself primary for 8 s, the node as
    # soon as it answers (docs/operate/promise.md)
    assert by_node >= 1, counted


async def _stall(
    rig: Rig, events: trio.MemoryReceiveChannel[str], *, timed: bool
) -> tuple[float, int, int]:
    """SIGSTOP the primary; SIGCONT it when a replica is being promoted (``timed``) or after
    STALL_S; then wait for the Sentinels to name the new primary (a plain stall may end
    before they start one). How long it stalled; 1 if a failover came, else 0; how many
    times the Sentinels converted an old primary since the last stall."""
    server = rig.servers.child(await current_primary(rig))
    converted = 0
    while True:  # what the last failover's other Sentinels still had to say
        try:
            converted += events.receive_nowait().startswith(CONVERTED)
        except trio.WouldBlock:
            break
    began = trio.current_time()
    server.signal(signal.SIGSTOP)
    try:
        if timed:
            while not (event := await events.receive()).startswith(PROMOTING):
                converted += event.startswith(CONVERTED)
        else:
            await trio.sleep(STALL_S)
    finally:
        server.signal(signal.SIGCONT)
    stalled_s = trio.current_time() - began
    with trio.move_on_after(8 if timed else 4):  # a failover that started ends within 8 s
        while not (event := await events.receive()).startswith(SWITCHED):
            converted += event.startswith(CONVERTED)
        return stalled_s, 1, converted
    return stalled_s, 0, converted


async def _writes_confirmed(probe: Client) -> float:
    """Seconds until a write is confirmed durable again (the promise the store now gives)."""
    began = trio.current_time()
    while True:
        try:
            await probe.store.call(0, lambda r: r.incr("failover:probe"))
            await probe.store.durable()
            return trio.current_time() - began
        except StoreError:
            await trio.sleep(0.05)  # a cut connection fails at once: the next one waits


@pytest.mark.parametrize("promise", [EVERY_REPLICA, ONE_REPLICA])
async def test_a_replica_down_shows_what_the_promise_does(tmp_path, caplog, promise):
    """One replica SIGKILLed: once the Sentinels flag it down, a submit is acknowledged on the
    other replica's fsync either way (``every-replica`` counts it out: they would not promote
    it; ``one-replica`` never waited for it). Then, with ``every-replica``, the second replica
    too: a submit is refused ("not durable", the promise named) and the store is unhealthy.
    The log, ``status`` (text and JSON) and ``/metrics`` say which."""
    every = promise == EVERY_REPLICA
    async with replicated_node(tmp_path, promise=promise, console_listen="127.0.0.1:0") as rig:
        async with submitting(rig) as submit:
            await submit()  # both replicas up: acknowledged either way
            await _kill_replica(rig, rig.servers.data_ports[2])
            await submit()  # on the replica left
            given = await cli_status(rig, text=True)
            if every:  # stalled, still attached: the primary takes the write, none confirms it
                await _kill_replica(rig, rig.servers.data_ports[1], signal.SIGSTOP)
                with pytest.raises(NotDurable, match="1 wanted \\(promise every-replica\\)"):
                    await submit()
        facts = await cli_status(rig, healthy=not every)
        shown = await cli_status(rig, healthy=not every, text=True)
        _, _, body = await get(rig.ready.console_url + "/metrics")
    samples = {
        (s.name, s.labels.get("promise")): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    node_log = (await trio.Path(rig.log).read_text()).splitlines()
    validator("status").validate(facts)  # the replicated store's JSON, promise included
    said = facts["store"]["promise"]
    print(given, shown, said, [line for line in node_log if "promise" in line], sep="\n")
    assert "promises given with 1 replica fsync(s); " in given
    assert said["name"] == promise
    assert said["refusing"] is every
    assert samples[("hero_store_promise_refusing", promise)] == float(every)
    assert samples[("hero_store_promise_replicas_wanted", promise)] == 1
    if every:
        assert said["now"].startswith("writes are refused (not durable)")
        assert "store hero: no replica is up" in facts["health"]["problems"]
        assert "promise every-replica: WAITAOF 1 1; writes are refused" in shown
        assert any("promise not given" in r.getMessage() for r in caplog.records)  # the client
        assert any("store: promise every-replica: writes are refused" in line for line in node_log)
    else:
        assert said["now"].startswith("promises given with 1 replica fsync(s);")
        assert "WARNING: weaker than every-replica" in shown
        assert any('promise = "one-replica"' in line for line in node_log)  # at start


async def _kill_replica(rig: Rig, port: int, sig: int = signal.SIGKILL) -> None:
    """Signal the replica on ``port`` (SIGKILL, or SIGSTOP: a stall); return once every
    Sentinel flags it down."""
    async with sentinel_events(rig, ["+sdown"]) as events:
        if sig == signal.SIGKILL:
            await trio.to_thread.run_sync(rig.servers.child(port).kill)
        else:
            rig.servers.child(port).signal(sig)
        flagged = 0
        while flagged < len(rig.servers.sentinel_ports):  # each Sentinel, its own view
            flagged += (await events.receive()).startswith(f"+sdown slave 127.0.0.1:{port}")


async def test_a_replica_the_sentinels_lose_but_the_primary_keeps_still_counts(tmp_path):
    """Replica B cut off from the Sentinels only (their user deleted on it): they flag it
    down, but the primary still has it and ``WAITAOF`` counts its fsync. So the promise keeps
    counting it: with replica A stalled, B's fsync alone confirms nothing (it would stand in
    for A's, and the Sentinels, which cannot reach B, would promote A)."""
    async with replicated_node(tmp_path) as rig:
        a, b = rig.servers.data_ports[1:]
        async with submitting(rig) as submit:
            await submit()
            async with sentinel_events(rig, ["+sdown"]) as events:
                server: coredis.Redis[str] = coredis.Redis(
                    "127.0.0.1", b, username=NODE, password=rig.servers.passwords[NODE]
                )
                async with server:
                    await server.acl_deluser([SENTINEL])  # ends their links to it, and logins
                flagged = 0
                while flagged < len(rig.servers.sentinel_ports):
                    flagged += (await events.receive()).startswith(f"+sdown slave 127.0.0.1:{b}")
            await submit()  # A and B both fsync it
            # status errs on the safe side: B is down to the Sentinels (unhealthy, exit 3)
            facts = await cli_status(rig, healthy=False)
            rig.servers.child(a).signal(signal.SIGSTOP)
            with pytest.raises(NotDurable, match="2 wanted \\(promise every-replica\\)"):
                await submit()
    said = facts["store"]["promise"]
    print(said)
    assert [r["link"] for r in facts["store"]["replicas"] if r["address"].endswith(f":{b}")] == [
        "down"
    ]
    assert said["replicas_wanted"] == 2


# a gate that holds the rig's one python slot, named so that the test finds it from outside
# the sandbox's pid namespace (and kills it), and a job that leaves its mark in the work dir
GATE = """\
import ctypes, time
ctypes.CDLL(None).prctl(15, b"{0}", 0, 0, 0)  # PR_SET_NAME
time.sleep(600)
"""
MARK = "with open('ran-{0}', 'a') as f:\n    f.write('x')\n"


async def test_a_batch_taken_while_no_replica_confirms_runs_none_of_its_jobs(tmp_path):
    """Four jobs queued behind a gate on the one python slot; both replicas stalled, then the
    gate killed: its end takes the four in one script call (a batch), on the primary only.
    WAITAOF cannot confirm that take, so none of the four may run (a failover now would leave
    them queued on the new primary, for another slot to run again): the runner sends the end
    again, and again. Once the replicas are back, each of the four runs once."""
    rig_kw: dict[str, Any] = {"runners": {"python": 1, "sh": 1}, "console_listen": "127.0.0.1:0"}
    async with replicated_node(tmp_path, **rig_kw) as rig:
        work = rig.work()
        actor = read_key_file(rig.home / "actor.key")
        name = "hg-" + os.urandom(6).hex()  # unique on the host: tests may run beside it
        jobs = [new_job(1, 1, "python", GATE.format(name), timeout_s=300)]
        jobs += [new_job(1, 1, "python", MARK.format(n)) for n in "abcd"]
        async with open_client(rig.client_url) as client:
            msg = await client.submit(actor, 1, to="self", context_id=1, jobs=jobs)
            assert await until(lambda: len(named(name)) == 1, 60)  # the gate runs
            [gate] = named(name)
            replicas = [rig.servers.child(p) for p in rig.servers.data_ports[1:]]
            for replica in replicas:
                replica.signal(signal.SIGSTOP)
            try:
                os.kill(gate, signal.SIGKILL)  # the gate ends: its end takes the four
                # that end (with the take) sent twice, unconfirmed both times; or a job ran
                said = f"{jobs[0].key}: cannot record the outcome yet"

                def ran() -> list[str]:
                    return [n for n in "abcd" if (work / f"ran-{n}").exists()]

                assert await until(lambda: rig.log.read_text().count(said) >= 2 or ran(), 60)
                ran_unconfirmed = ran()
            finally:
                for replica in replicas:
                    replica.signal(signal.SIGCONT)
            with trio.fail_after(120):
                results = await client.wait_results(msg, timeout_s=120)
        marks = {n: (work / f"ran-{n}").read_text() for n in "abcd"}
        events = await _events(rig)
    print("node events:", events)
    assert ran_unconfirmed == []  # not one job of the unconfirmed take ran
    assert sorted(r.job_key for r in results if r.ok) == sorted(j.key for j in jobs[1:])
    assert marks == dict.fromkeys("abcd", "x")  # each ran once, once confirmed
    assert events.get("batch_takes", 0) >= 1  # the four were taken together
