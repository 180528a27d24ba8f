"""A submit on a replicated store returns only once its write is durable, confirmed by WAITAOF
on the connection that made the write (bus/store/durable.py): no barrier write of its own, and
no promise for a write that failed or that no replica confirmed."""

from __future__ import annotations

import signal

import pytest
import trio

from bench.replicated import primary_calls
from bus.client.api import Client
from bus.core import keys
from bus.errors import StoreError
from bus.store.connection import Store, open_store
from bus.store.durable import NotDurable
from crypto import KeyPair
from node.host.acl import NODE
from tests.replicated_rig import sentinels_name

CTX = 1


async def _replicas_ready(store: Store) -> None:
    """Every replica has synced and rewritten its AOF (a fresh set takes a few seconds): until
    then a replica confirms no fsync."""
    with trio.fail_after(30):
        while True:
            try:
                return await store.durable()
            except NotDurable:
                await trio.sleep(0.1)


async def _client(store: Store) -> Client:
    await _replicas_ready(store)
    await store.hset(keys.ACTORS_DB, keys.NODE_INFO, {"id": KeyPair.generate().public_hex})
    return Client(store)


async def _submit(client: Client, actor: KeyPair) -> None:
    await client.submit_job(actor, 7, to="self", context_id=CTX, script_type="sh", script="true")


async def test_a_submit_waits_on_its_own_write_without_a_barrier_write(replicated):
    async with open_store(replicated.url(NODE, waitaof="1,1")) as store:
        client = await _client(store)
        actor = KeyPair.generate()
        await _submit(client, actor)  # connections made, scripts loaded
        before = await primary_calls(replicated)
        for _ in range(3):
            await _submit(client, actor)
        after = await primary_calls(replicated)
        assert len(await store.lrange(CTX, keys.MSG_OUT)) == 4
    assert after.get("waitaof", 0) - before.get("waitaof", 0) >= 3
    assert after.get("incr", 0) == before.get("incr", 0)  # no ``INCR durable``
    assert after["exec"] - before["exec"] == 3


async def test_a_failed_write_is_reported_not_confirmed(replicated):
    async with open_store(replicated.url(NODE, waitaof="1,1")) as store:
        client = await _client(store)
        actor = KeyPair.generate()
        await store.call(CTX, lambda r: r.set(keys.MSG_OUT, "not a list"))  # LPUSH: WRONGTYPE
        before = await primary_calls(replicated)
        with pytest.raises(StoreError, match="wrong_type"):
            await _submit(client, actor)
        assert (await primary_calls(replicated)).get("waitaof", 0) == before.get("waitaof", 0)


async def test_no_submit_returns_while_no_replica_confirms_it(replicated):
    url = replicated.url(NODE, waitaof="1,1", waitaof_timeout_ms="300")
    async with open_store(url) as store:
        client = await _client(store)
        actor = KeyPair.generate()
        await _submit(client, actor)
        for port in replicated.data_ports[1:]:
            replicated.child(port).signal(signal.SIGSTOP)
        try:
            with trio.fail_after(10), pytest.raises(NotDurable, match="0 replica"):
                await _submit(client, actor)
        finally:
            for port in replicated.data_ports[1:]:
                replicated.child(port).signal(signal.SIGCONT)
        await _submit(client, actor)  # the replicas back: promises again


async def test_the_next_write_goes_while_a_batch_waits_to_be_durable(replicated):
    """A submit holds its context's write lock only until its write is answered: the next
    batch is written while it waits on WAITAOF; neither returns until confirmed (here never:
    the replicas are stopped)."""
    url = replicated.url(NODE, waitaof="1,1", waitaof_timeout_ms="5000")
    async with open_store(url) as store:
        client = await _client(store)
        actor = KeyPair.generate()
        for port in replicated.data_ports[1:]:
            replicated.child(port).signal(signal.SIGSTOP)
        outcomes: list[str] = []

        async def submit() -> None:
            try:
                await _submit(client, actor)
                outcomes.append("returned")
            except NotDurable:
                outcomes.append("not durable")

        async def queued(n: int) -> None:  # polls the store: nothing here to wait on
            while True:
                if len(await store.lrange(CTX, keys.MSG_OUT)) >= n:
                    return
                await trio.sleep(0.01)

        try:
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit)
                    await queued(1)
                    nursery.start_soon(submit)
                    await queued(2)  # written while the first still waits to be durable
                    assert outcomes == []
        finally:
            for port in replicated.data_ports[1:]:
                replicated.child(port).signal(signal.SIGCONT)
    assert outcomes == ["not durable", "not durable"]


async def test_no_promise_is_given_on_a_primary_the_sentinels_no_longer_name(replicated):
    """A primary woken inside a failover still has a replica, which ``WAITAOF`` counts and
    whose resync from the new primary erases what it confirmed. Once the Sentinels agree on
    another primary, no promise is given on the old one, even where every replica the count
    wants confirms (as the runner's confirmation: tests/runners/test_runner_failover.py).
    They are made to name replica A while the store's connections stay on the primary, both
    replicas attached; the count is asked again as after a Sentinel's ``+sdown``."""
    async with open_store(replicated.url(NODE)) as store:
        await _replicas_ready(store)  # promise every-replica: both replicas confirmed
        assert store.barrier is not None
        promoted = replicated.data_ports[1]
        sentinels_name(replicated, promoted)
        store.barrier.replicas.changed()
        with pytest.raises(NotDurable, match=f"Sentinels name primary 127.0.0.1:{promoted}"):
            await store.durable()
