"""The embedded Valkey launcher: ready only after PING, AOF in the data dir, clean stop; the
ports the test and replicated servers start on."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from bus.store.connection import open_store
from node.errors import ListenError
from node.host.acl import ensure_secrets
from node.host.replicated import SET_ROLES, ReplicatedSet
from node.host.valkey import LIBC_ENV, ValkeySpec, free_port, jemalloc, run_valkey


async def test_embedded_valkey_persists_with_aof_and_stops_on_cancel(tmp_path):
    spec = ValkeySpec(port=free_port(), data_dir=tmp_path / "v", databases=32)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(run_valkey, spec)
            async with open_store(url) as store:
                await store.hset(31, "k", {"a": "1"})  # a high DB exists: databases applied
                config = await store.call(0, lambda r: r.config_get(["appendfsync", "bind"]))
                server = await store.call(0, lambda r: r.info("server"))
                # batch scheduling: woken by a command, it does not preempt the node
                assert os.sched_getscheduler(int(server["process_id"])) == os.SCHED_BATCH
            nursery.cancel_scope.cancel()
    assert config["appendfsync"] == "everysec"
    assert config["bind"].startswith("127.0.0.1")
    assert list((tmp_path / "v" / "appendonly").glob("*.aof"))
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", spec.port), timeout=1),
    ):
        pass  # nothing listens any more
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(run_valkey, spec)
            async with open_store(url) as store:
                assert await store.hgetall(31, "k") == {"a": "1"}
            nursery.cancel_scope.cancel()


async def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        spec = ValkeySpec(port=busy.getsockname()[1], data_dir=tmp_path / "v", persist=False)
        port = spec.port
        why = f"the embedded Valkey cannot listen on 127.0.0.1:{port}: the port is in use; "
        expected = pytest.RaisesExc(ListenError, match=why)
        with trio.fail_after(30), pytest.RaisesGroup(expected, flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_valkey, spec)


def _maps_jemalloc(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libjemalloc" in maps.read()


@pytest.mark.parametrize("libc", [False, True], ids=["default", "libc-malloc-asked"])
async def test_the_embedded_valkey_allocates_with_jemalloc_where_the_host_has_it(
    tmp_path, monkeypatch, libc
):
    # glibc's malloc: the server's CPU per job grew with the store (HISTORY.md#flat-cost-2)
    if libc:
        monkeypatch.setenv(LIBC_ENV, "1")
    if os.environ.get("CI") == "true":
        assert jemalloc(), ".ci/run installs libjemalloc2: this test must check it"
    elif not jemalloc():
        pytest.skip("no jemalloc on this host: the server keeps glibc's malloc")
    spec = ValkeySpec(port=free_port(), data_dir=tmp_path / "v", persist=False)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(run_valkey, spec)
            async with open_store(url) as store:
                server = await store.call(0, lambda r: r.info("server"))
                mapped = _maps_jemalloc(int(server["process_id"]))
            nursery.cancel_scope.cancel()
    assert mapped is not libc


def test_a_free_port_is_below_the_range_outgoing_connections_take_theirs_from():
    # a port from that range may become a connection's source port before the server binds it
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    given = [free_port() for _ in range(50)]
    assert all(1024 <= port < low for port in given)
    assert len(set(given)) == len(given)


def test_a_replicated_server_whose_port_was_taken_starts_on_another(tmp_path):
    (tmp_path / "home").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        # the primary's and then the Sentinel's first port are taken when they bind
        offered = iter([taken, free_port(), taken, free_port()])
        servers = ReplicatedSet(
            tmp_path / "store",
            ensure_secrets(tmp_path / "home", SET_ROLES),
            replicas=0,
            sentinels=1,
            ports=lambda: next(offered),
        )
        try:
            servers.start()
            assert taken not in servers.data_ports + servers.sentinel_ports
            assert [c.running for c in servers.data + servers.watchers] == [True, True]
        finally:
            servers.stop()
