"""The store's lane behind Sentinels (bus/store/lane.py): its connections go to the server the
Sentinels name primary and that says so itself, follow a failover without a restart, never
hang on a stopped server, and a failover the node hears of ends a command waiting on the old
primary. Real primary, replicas and Sentinels (the ``replicated`` fixture)."""

from __future__ import annotations

import signal

import coredis.exceptions as cx
import pytest
import redis
import trio
from coredis.commands.script import Script

from bus.errors import StoreError
from bus.store.connection import open_store
from bus.store.durable import NotDurable
from bus.store.failover import Failover, _not_run
from bus.store.lane import Lane, _Target, lane_for
from node.host.acl import NODE
from node.host.replicated import ReplicatedSet
from tests.nodes import until

WRITE = Script(script="return redis.call('INCR', KEYS[1])")


def _sentinel(servers: ReplicatedSet) -> redis.Redis:
    return redis.Redis(
        port=servers.sentinel_ports[0],
        username=NODE,
        password=servers.passwords[NODE],
        decode_responses=True,
    )


def _primary_port(servers: ReplicatedSet) -> int:
    with _sentinel(servers) as sentinel:
        _, port = sentinel.sentinel_get_master_addr_by_name(servers.service)
    return int(port)


def _lane(servers: ReplicatedSet) -> Lane:
    lane = lane_for(servers.url(NODE, waitaof="0,0"))
    assert lane is not None
    assert lane.sentinels is not None
    return lane


async def test_a_lane_follows_a_failover(replicated):
    """After a failover the lane's connections go to the new primary without a restart: the
    old one, demoted, says so in the handshake (ROLE), nothing is sent to it, and the call
    goes again to the primary the Sentinels name now."""
    async with open_store(replicated.url(NODE, waitaof="1,2")) as store:
        assert store.lane is not None
        assert store.failover is not None
        assert await store.script(1, WRITE, ["n"], []) == 1
        with trio.fail_after(30):  # both replicas have it (a fresh set syncs for a while)
            while True:
                try:
                    await store.durable()
                    break
                except NotDurable:
                    await trio.sleep(0.1)
        old = _primary_port(replicated)
        assert old == replicated.data_ports[0]
        with _sentinel(replicated) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", replicated.service)
        with _data(replicated, old) as demoted:
            assert await until(
                lambda: _primary_port(replicated) != old and demoted.role()[0] == "slave", 30
            )
        retried = store.failover.retried
        with trio.fail_after(30):  # the new primary has the first write, and takes this one
            assert await store.script(1, WRITE, ["n"], []) == 2
        assert store.failover.retried > retried  # the old primary refused in the handshake
        with _data(replicated, _primary_port(replicated), db=1) as new:
            assert new.get("n") == "2"


def _data(servers: ReplicatedSet, port: int, db: int = 0) -> redis.Redis:
    return redis.Redis(
        port=port, db=db, username=NODE, password=servers.passwords[NODE], decode_responses=True
    )


async def test_a_replica_refusing_a_write_is_taken_as_not_run(replicated):
    """A replica's READONLY (coredis' ReadOnlyError, whose text has lost the word) means the
    write did not run: the failover policy sends it again and leaves that server."""
    replica = replicated.data_ports[1]
    lane = Lane(_Target("", "127.0.0.1", replica, NODE, replicated.passwords[NODE]))
    async with lane.acquire(1) as conn:
        with pytest.raises(cx.ReadOnlyError) as refused:
            await conn.create_request("INCR", "n")
    lane.close()
    left: list[bool] = []
    failover = Failover(lambda: left.append(True))
    assert _not_run(refused.value)
    failover.noticed(refused.value)
    assert left == [True]
    assert failover.epoch == 1


async def test_a_server_that_is_no_primary_is_refused_before_anything_runs(replicated):
    """A connection to a server that answers ROLE as a replica is closed before a command is
    sent (coredis' StalePrimaryError: the failover policy sends the command again); the next
    connection asks the Sentinels."""
    lane = _lane(replicated)
    replica = replicated.data_ports[1]
    lane._primary = _Target("", "127.0.0.1", replica, NODE, replicated.passwords[NODE])
    with pytest.raises(cx.StalePrimaryError, match=f"127.0.0.1:{replica} is a slave"):
        async with lane.acquire(1):
            pytest.fail("a connection to a replica was handed out")
    async with lane.acquire(1) as conn:
        assert conn.where == f"127.0.0.1:{replicated.data_ports[0]}"
        assert (await conn.create_request("ROLE"))[0] == "master"
    lane.close()


async def test_a_stopped_server_fails_the_handshake_in_bounded_time(replicated):
    """A SIGSTOPped primary accepts a connection and never answers: the handshake gives up
    (after the lane's ``handshake_s``) with an error that says nothing ran, instead of waiting
    for ever."""
    lane = _lane(replicated)
    lane.handshake_s = 0.5
    primary = replicated.child(replicated.data_ports[0])
    primary.signal(signal.SIGSTOP)
    try:
        with (
            trio.fail_after(10),
            pytest.raises(cx.ConnectionError, match="Unable to establish.*no answer in 0.5 s"),
        ):
            async with lane.acquire(1):
                pytest.fail("a connection to a stopped server was handed out")
    finally:
        primary.signal(signal.SIGCONT)
    lane.close()


async def test_a_failover_ends_a_pop_waiting_on_the_old_primary(replicated):
    """The node heard the Sentinels name a new primary (Store.follow_failover): a blocking pop
    waiting on a connection to the old one ends now, as a lost connection, not after its
    timeout."""
    async with open_store(replicated.url(NODE, waitaof="0,0")) as store, trio.open_nursery() as n:
        ended: list[BaseException] = []
        done = trio.Event()

        async def pop() -> None:
            try:
                await store.blpop(1, "never", 60)
            except StoreError as exc:
                ended.append(exc)
            done.set()

        n.start_soon(pop)
        with _data(replicated, replicated.data_ports[0]) as info:
            assert await until(lambda: int(info.info("clients")["blocked_clients"]) >= 1, 30)
        store.follow_failover()
        with trio.fail_after(5):
            await done.wait()
        assert "Connection lost" in str(ended[0])
