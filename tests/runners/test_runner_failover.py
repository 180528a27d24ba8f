"""A runner process on a replicated store when the primary stalls (SIGSTOP) past down-after and
a replica is promoted: what it waits for on the old primary is cut when the Sentinels name the
new one (the node relays their +switch-master: node/host/store_tuning.py), and its next
command reaches the new primary while the old one is still stopped
(bus/store/atomic/runs_sync.py ``SyncRuns.cut``). Real servers: a primary, two replicas and
three Sentinels on free ports."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import redis

from bus.store.atomic.runs import NextJob
from bus.store.atomic.runs_sync import SyncRuns, SyncStoreError, Unconfirmed, connect
from bus.store.promise import REFRESH_S
from bus.store.sentinel import durability
from bus.store.sync import SyncStore
from node.host.acl import NODE, RUNNER
from node.host.replicated import ReplicatedSet
from tests.replicated_rig import sentinels_name

ELECTION_S = 30.0  # down-after (1 s) plus the election: about 3 s here, more under load
TAKE = NextJob(("queue:x",), "n:b:1:x:0", 15_000, "x:0")  # how the runner names its start


def _switches(servers: ReplicatedSet) -> redis.client.PubSub:
    """A subscription to the first Sentinel's +switch-master (as the node's, by the node user)."""
    sentinel = redis.Redis(
        "127.0.0.1",
        servers.sentinel_ports[0],
        username=NODE,
        password=servers.passwords[NODE],
        decode_responses=True,
    )
    pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("+switch-master")
    return pubsub


def _next_primary(pubsub: redis.client.PubSub) -> int:
    """The port of the primary the next +switch-master names (waits on the subscription)."""
    deadline = time.monotonic() + ELECTION_S
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None:
            return int(str(message["data"]).split()[-1])
    raise AssertionError("no +switch-master")


def test_a_pop_waiting_on_a_stalled_primary_is_cut_and_the_next_command_goes_to_the_new_one(
    replicated,
):
    old = replicated.child(replicated.data_ports[0])
    runs = SyncRuns(connect(replicated.url(RUNNER), 1))
    assert runs.held("inflight:runner:x") == 0  # connected to the primary
    switches = _switches(replicated)
    popped: list[BaseException | str | None] = []

    def pop() -> None:
        try:
            popped.append(runs.pop_started("queue:x", "inflight:runner:x", 60.0, 0, TAKE)[0])
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            popped.append(exc)

    waiting = threading.Thread(target=pop, daemon=True)
    waiting.start()
    old.signal(signal.SIGSTOP)
    try:
        new_port = _next_primary(switches)
        assert new_port != replicated.data_ports[0]
        assert waiting.is_alive()  # still waiting on the stopped primary
        runs.cut()  # what the runner's SIGUSR2 handler does when the node relays the switch
        waiting.join(5)
        assert not waiting.is_alive(), "the pop still waits on the stopped primary"
        assert isinstance(popped[0], SyncStoreError), popped  # translated (bus/store/sync.py)
        assert isinstance(popped[0].__cause__, redis.ConnectionError), popped
        began = time.monotonic()
        runs.client.rpush("queue:x", "job:1:1")  # the old primary is still stopped
        assert time.monotonic() - began < 5
        new = redis.Redis(
            "127.0.0.1",
            new_port,
            db=1,
            username=NODE,
            password=replicated.passwords[NODE],
            decode_responses=True,
        )
        assert new.lrange("queue:x", 0, -1) == ["job:1:1"]
    finally:
        old.signal(signal.SIGCONT)
        switches.close()


def test_an_old_primary_that_woke_up_refusing_writes_is_left_for_the_new_one(replicated):
    """After the failover the old primary wakes up cut off from its replicas: it refuses
    writes (NOREPLICAS) until the Sentinels demote it, about 10 s later. A runner that got
    that refusal (say, ending an attempt) must send its next command to the new primary,
    not to the same connection again: a pooled one (a transaction) or the connection its
    hot path holds (a script, a pop)."""
    old_port = replicated.data_ports[0]
    old = replicated.child(old_port)
    pooled = SyncRuns(connect(replicated.url(RUNNER), 1))
    held = SyncRuns(connect(replicated.url(RUNNER), 1))
    admin = {"username": NODE, "password": replicated.passwords[NODE], "decode_responses": True}
    first = redis.Redis("127.0.0.1", old_port, db=1, **admin)
    first.rpush("queue:x", "job:1:0")
    assert first.wait(2, 10_000) == 2  # on both replicas: whichever is promoted has it
    assert pooled.store.transaction([("LRANGE", "queue:x", 0, -1)]) == [["job:1:0"]]  # pooled
    assert held.held("queue:x") == 1  # its held connection, to the primary
    switches = _switches(replicated)
    old.signal(signal.SIGSTOP)
    try:
        new_port = _next_primary(switches)
    finally:
        old.signal(signal.SIGCONT)
        switches.close()
    woken = redis.Redis("127.0.0.1", old_port, **admin)
    assert woken.ping()  # it has read its replicas' goodbyes by now
    with pytest.raises(SyncStoreError, match="NOREPLICAS") as refused:
        pooled.give_back("inflight:runner:x", "job:1:1", "queue:x")
    assert pooled.leave_if_stale(refused.value)
    pooled.give_back("inflight:runner:x", "job:1:2", "queue:x")
    new = redis.Redis("127.0.0.1", new_port, db=1, **admin)
    assert new.lrange("queue:x", 0, -1) == ["job:1:0", "job:1:2"]
    with pytest.raises(SyncStoreError, match="NOREPLICAS") as refused:
        held.pop_started("queue:x", "inflight:runner:x", 0.1, 0, TAKE)
    assert held.leave_if_stale(refused.value)
    assert held.held("queue:x") == 2  # the old primary has 1: job:1:2 is not there
    assert woken.execute_command("ROLE")[0] == "master"  # not demoted yet: it was left


def test_a_start_is_confirmed_on_a_replica_before_its_job_runs(replicated):
    """A runner runs a job only once WAITAOF confirmed its start on a replica (the runner
    loop calls ``SyncRuns.confirm`` before it runs the job, and after each end): a start
    that a failover lost would leave the job queued on the new primary, and another slot
    would run it a second time. With both replicas stopped the primary still takes the
    start (within min-replicas-max-lag), but it is not confirmed; nor is one made on a
    connection lost since."""
    url = replicated.url(RUNNER, waitaof_timeout_ms="300")
    runs = SyncRuns(connect(url, 1), durability(url))
    admin = {"username": NODE, "password": replicated.passwords[NODE], "decode_responses": True}
    primary = redis.Redis("127.0.0.1", replicated.data_ports[0], db=1, **admin)
    for n in range(1, 4):
        primary.hset(f"job:1:{n}", mapping={"status": "queued", "script_type": "x"})
    assert primary.wait(2, 10_000) == 2
    runs.confirm()  # nothing written yet: nothing to wait for
    assert isinstance(runs.start("job:1:1", "n:b:1:x:0", 15_000, "x:0"), dict)
    runs.confirm()  # the replicas are up: confirmed
    stopped = [replicated.child(port) for port in replicated.data_ports[1:]]
    for child in stopped:
        child.signal(signal.SIGSTOP)
    try:
        assert isinstance(runs.start("job:1:2", "n:b:1:x:0", 15_000, "x:0"), dict)
        with pytest.raises(Unconfirmed, match="0 replica fsync"):
            runs.confirm()
    finally:
        for child in stopped:
            child.signal(signal.SIGCONT)
    runs.confirm()  # the replicas caught up: the same start is confirmed now
    assert isinstance(runs.start("job:1:3", "n:b:1:x:0", 15_000, "x:0"), dict)
    runs.client.connection_pool.disconnect()  # as a cut or a stale primary does
    assert runs.held("queue:x") == 0  # a new connection, which wrote nothing
    with pytest.raises(Unconfirmed, match="connection that made the writes was lost"):
        runs.confirm()


def test_writes_on_a_primary_the_sentinels_no_longer_name_are_not_confirmed(replicated):
    """A primary woken inside a failover still has a replica, which its ``WAITAOF`` counts,
    and which then resyncs from the new primary, erasing what it confirmed. Once the
    Sentinels name another primary, a runner confirms nothing written to the old one, even
    where every replica the count wants answers, and its next command goes where they point.
    The Sentinels are made to name replica A here (as after a promotion) while the runner's
    connection stays on the primary, both replicas attached; the replica count is asked
    again when it is stale (an injected clock)."""
    now = [0.0]
    url = replicated.url(RUNNER, waitaof_timeout_ms="300")
    store = SyncStore(connect(url, 1), durability(url), clock=lambda: now[0])
    admin = {"username": NODE, "password": replicated.passwords[NODE]}
    primary = redis.Redis("127.0.0.1", replicated.data_ports[0], db=1, **admin)
    primary.rpush("queue:x", "job:1:0")
    assert primary.wait(2, 10_000) == 2  # both replicas attached and in sync
    store.command("RPUSH", "queue:x", "job:1:1", writes=True)
    store.confirm()  # both replicas fsynced it: confirmed
    promoted = replicated.data_ports[1]
    sentinels_name(replicated, promoted)
    now[0] += REFRESH_S  # the count is stale: the Sentinels are asked again
    store.command("RPUSH", "queue:x", "job:1:2", writes=True)  # still the old primary's connection
    with pytest.raises(Unconfirmed, match=f"Sentinels name primary 127.0.0.1:{promoted}"):
        store.confirm()
    assert store.command("ROLE")[0] == "slave"  # reconnected to the server they name
    store.close()
