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
import signal
import sys
import time
from collections import Counter
from functools import partial
from typing import Any

import pytest
import trio

from bus.client.api import Client, open_client
from bus.core import keys
from bus.core.models import JobStatus, Message
from bus.errors import ClientError, StoreError
from bus.store.durable import NotDurable
from crypto import read_key_file
from tests.replicated_rig import ROOT, Rig, replicated_node

# The long fault suites run one after another on one test worker (README "Run the tests"):
# two of them side by side on a 2-core machine would stretch the timings they inject.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

N_JOBS = 300
KILL_AT = N_JOBS // 3
STOPPED_S = 5.0  # a SIGSTOPped primary stalls this long: a replica is promoted meanwhile
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


async def writes_resume(client: Client) -> float:
    """Seconds until a write succeeds again after the primary died."""
    began = time.monotonic()
    while True:
        try:
            await client.store.call(0, lambda r: r.incr("failover:probe"))
            return time.monotonic() - began
        except StoreError:
            await trio.sleep(0.05)  # a cut connection fails at once: the next one waits


@pytest.mark.parametrize("fault", ["sigkill", "sigstop"])
async def test_primary_lost_mid_flow_loses_nothing_and_runs_nothing_twice(tmp_path, fault):
    """``sigkill``: the primary dies. ``sigstop``: it stalls past down-after while a replica is
    promoted, then wakes up cut off from its replicas (it refuses writes: NOREPLICAS) until
    the Sentinels demote it, with the client's connections still open to it."""
    # jobs run sandboxed: each appends to ran.txt in context 1's work dir, the one place it
    # may write (docs/security/sandbox.md)
    async with replicated_node(tmp_path) as rig:
        out = rig.home / "work" / "1" / "ran.txt"
        counted = await _flow(rig, out, fault)
        async with open_client(rig.node_url) as node:
            after = await node.store.topology()
        status = await cli_status(rig)
    print("failover counters:", " ".join(f"{k}={v}" for k, v in counted.items()))
    print("store after:", after)
    assert after["primary"] != f"127.0.0.1:{rig.servers.data_ports[0]}"
    assert after["failovers"] >= 1
    assert status["store"]["primary"] == after["primary"]
    assert counted["acknowledged"] >= N_JOBS - 5  # a submit cut by the failover is told
    for name in ("lost", "stuck", "completed_twice", "told_failed_but_ran"):
        assert counted[name] == 0, counted


async def cli_status(rig: Rig) -> dict[str, Any]:
    """``hero-node status --json`` of the rig's home (it finds the store through the Sentinels)."""
    argv = [sys.executable, "-m", "node.cli", "--home", str(rig.home), "status", "--json"]
    done = await trio.run_process(argv, capture_stdout=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done
    facts: dict[str, Any] = json.loads(done.stdout)
    return facts


async def test_a_submit_is_not_acknowledged_until_a_replica_has_it(tmp_path):
    """With both replicas stopped the primary still takes the write (within
    min-replicas-max-lag), but WAITAOF cannot confirm a replica's fsync: the client is told."""
    async with replicated_node(tmp_path) as rig:
        actor = read_key_file(rig.home / "actor.key")
        async with open_client(rig.client_url) as client:
            submit = partial(
                client.submit_job,
                actor,
                1,
                to="self",
                context_id=1,
                script_type="sh",
                script="true",
            )
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
            if fault == "sigkill":
                await trio.to_thread.run_sync(primary.kill)
                resumed_s = await writes_resume(probe)
                return
            began = time.monotonic()
            primary.signal(signal.SIGSTOP)
            await trio.sleep(STOPPED_S)  # the stall itself, past down-after (1 s)
            primary.signal(signal.SIGCONT)
            await writes_resume(probe)
            resumed_s = time.monotonic() - began

        with trio.fail_after(120):
            for i in range(N_JOBS):
                if i == KILL_AT:
                    nursery.start_soon(kill_primary)
                try:
                    msg = await client.submit_job(
                        actor,
                        1,
                        to="self",
                        context_id=1,
                        script_type="python",
                        script=SCRIPT,
                        env_vars={"TAG": f"j{i:03d}", "OUT": "ran.txt"},
                        retries=2,
                    )
                except StoreError as exc:
                    refused += 1  # told: not a promise (it may run all the same)
                    if refused < 4 or refused % 50 == 0:
                        print(f"submit {i} refused: {exc}")
                    continue
                acked.append(msg)
        deadline = trio.current_time() + 90
        finals = [await final_of(client, m, deadline) for m in acked]
        ran = Counter(out.read_text().split())
        tags = [m.job[0].env_vars["TAG"] for m in acked]
        for m, f, t in zip(acked, finals, tags, strict=True):
            if not f:  # where an unfinished job is, for the log
                print(t, m.key, await client.delivery_status(1, m.key))
        lost_runners = {  # a re-run is allowed only after a runner was lost under an attempt
            t: sum(
                json.loads(e).get("reason", "").startswith("runner_lost")
                for e in await probe.store.lrange(1, keys.attempts(m.job[0].key))
            )
            for m, t in zip(acked, tags, strict=True)
            if ran[t] > 1
        }
    return {
        "acknowledged": len(acked),
        "refused": refused,
        "finished": finals.count("finished"),
        "lost": sum(1 for f, t in zip(finals, tags, strict=True) if not f and not ran[t]),
        "stuck": sum(1 for f in finals if not f),
        "completed_twice": sum(1 for t in tags if ran[t] - 1 > lost_runners.get(t, 0)),
        "at_least_once_reruns": sum(1 for t in tags if ran[t] > 1)
        - sum(1 for t in tags if ran[t] - 1 > lost_runners.get(t, 0)),
        "told_failed_but_ran": sum(
            1 for f, t in zip(finals, tags, strict=True) if f == "error" and ran[t]
        ),
        "writes_resumed_s": round(resumed_s, 2),
        "node_restarts": 0 if rig.node.returncode is None else 1,
    }
