"""The node's own Valkey is its trust anchor: a unix socket in a 0700 run/, no TCP unless
configured, and ACL users per role (node, client, runner) with passwords in the home."""

from __future__ import annotations

import logging
import shutil
import socket
import stat
from pathlib import Path

import coredis
import pytest
import trio

from bus.client.api import new_job, open_client
from bus.core.models import JobStatus
from bus.errors import StoreError
from bus.store.atomic.runs import Call, Ending, NextJob, finish_local_call
from bus.store.atomic.runs_sync import SyncRuns, connect
from bus.store.connection import Store, open_store
from crypto import read_key_file
from node.cli.main import main
from node.daemon import run_node
from node.host.acl import CLIENT, ROLES, RUNNER, role_url, secret_path, valkey_socket
from node.host.home import init_home
from node.host.valkey import free_port
from tests.runners.test_runners import External

FLOW_JOB = {"id": "a", "node": "self", "context": 1, "type": "sh", "script": "echo hi"}
FLOW_B = FLOW_JOB | {"id": "b", "depends": ["a"]}
# docs/use/runners.md "External runners", step 4
KEEP_LEASE = """
local cur = redis.call('HMGET', KEYS[2], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[1], KEYS[2])
return 1
"""
TRUSTED = ("actor:1", "context:1", "peer:" + "ab" * 32, "node:info")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def raw(address: str | tuple[str, int], *commands: bytes) -> bytes:
    """Send RESP ``commands`` on a fresh connection without authenticating; the replies."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(address)
        for command in commands:
            args = command.split()
            body = b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
            s.sendall(b"*%d\r\n" % len(args) + body)
        return s.recv(4096)


async def refused(store: Store, key: str) -> bool:
    try:
        await store.hset(1 if key.startswith("context") else 0, key, {"pubkey": "00" * 32})
    except StoreError as exc:
        return "permission" in str(exc).lower()
    return False


async def test_embedded_valkey_has_no_tcp_port_and_admits_no_one_without_a_password(
    node_factory,
):
    alice = await node_factory("alice", embedded=True)
    home, sock = alice.config.home, valkey_socket(alice.config)
    assert mode(alice.config.run_dir) == 0o700
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    assert mode(sock) == 0o700
    assert mode(home / "secrets") == 0o700
    assert {mode(secret_path(home, r)) for r in ROLES} == {0o600}
    assert mode(home / "secrets" / "valkey.acl") == 0o600
    assert read_secret_free(alice.info.redis_url, home)
    # no TCP listener, and nobody gets in without a password
    assert (await alice.store.call(0, lambda r: r.config_get(["port"])))["port"] == "0"
    reply = await trio.to_thread.run_sync(raw, str(sock), b"PING", b"HSET actor:1 pubkey x")
    assert reply.startswith(b"-NOAUTH"), reply
    reply = await trio.to_thread.run_sync(raw, str(sock), b"AUTH default x")
    assert reply.startswith(b"-WRONGPASS"), reply
    assert (await alice.store.hgetall(0, "actor:1"))["pubkey"] != "x"


async def test_client_credentials_serve_the_client_api_but_never_rewrite_trust(node_factory):
    alice = await node_factory("alice", embedded=True)
    client_url = role_url(alice.config, alice.info.redis_url, CLIENT)
    actor = read_key_file(alice.config.actor_key_path)
    with trio.fail_after(40):
        async with open_client(client_url) as client:
            for key in (*TRUSTED, "job:1:1"):
                assert await refused(client.store, key), key
            # a submit's durability needs no write of its own: the barrier key is the node's
            with pytest.raises(StoreError, match="(?i)permission"):
                await client.store.call(0, lambda r: r.incr("durable"))
            jobs = [new_job(1, 1, "python", "print(6 * 7)"), new_job(1, 1, "sh", "sleep 30")]
            short, long = await client.submit_many(actor, 1, to="self", context_id=1, jobs=jobs)
            [res] = await client.wait_results(short, 25)
            assert [text async for _, text in client.job_logs(1, jobs[0].key)] == ["42\n"]
            assert (await client.delivery_status(1, short.key) or {})["state"] == "processed"
            await client.stop_job(actor, 1, jobs[1].key, 1)
            [stopped] = await client.wait_results(long, 25)
            assert (await client.job_fields(1, jobs[1].key))["status"] == "error"
            flow_id = await client.submit_flow(actor, 1, {"jobs": [FLOW_JOB, FLOW_B]}, context_id=1)
            flow = await client.wait_flow(flow_id, 1, 25)
    assert res.status is JobStatus.FINISHED
    assert res.result["stdout"].strip() == "42"
    assert stopped.reason.startswith("stopped"), stopped
    assert flow.status.value == "finished", flow


def read_secret_free(published: str, home: Path) -> bool:
    """The published URL names no password of the home."""
    return all(secret_path(home, r).read_text().strip() not in published for r in ROLES)


async def test_runner_credentials_serve_the_runner_protocol_only(node_factory):
    alice = await node_factory("alice", embedded=True, runners={"python": 1, "ext": 0})
    runner_url = role_url(alice.config, alice.info.redis_url, RUNNER)
    actor = read_key_file(alice.config.actor_key_path)
    with trio.fail_after(30):
        async with open_store(runner_url) as runner_store:
            for key in TRUSTED:
                assert await refused(runner_store, key), key
            with pytest.raises(StoreError, match="permission"):  # no stealing of messages
                await runner_store.call(1, lambda r: r.lpop("msg_out"))
            ext = External(runner_store, "ext-1", "ext")
            await ext.register()
            job = new_job(1, 1, "ext", "say 42")
            msg = await alice.client.submit(actor, 1, to="self", context_id=1, jobs=[job])
            key, attempt = await ext.take()
            keep = await runner_store.call(
                1, lambda r: r.eval(KEEP_LEASE, ["running", key], ["15000", attempt])
            )
            assert keep == 1
            await runner_store.call(1, lambda r: r.zadd("running", {key: 1}))  # lapsed: a stall
            keep = await runner_store.call(
                1, lambda r: r.eval(KEEP_LEASE, ["running", key], ["15000", attempt])
            )
            assert keep == 1  # taken again: the attempt is still current
            assert int(await runner_store.call(1, lambda r: r.zscore("running", key))) > 1
            assert await ext.finish(key, attempt, "finished", {"stdout": "42"}) == 1
            [res] = await alice.client.wait_results(msg, 15)
    assert res.ok
    assert res.result["stdout"] == "42"


async def test_the_runner_user_starts_what_its_blocking_pop_moved(node_factory):
    """The start pipelined behind a runner's blocking pop (runs_start_moved) runs under the
    runner's ACL user: a command it may not send would leave every start to a round trip of
    its own (the fallback), unnoticed by any job."""
    alice = await node_factory("alice", embedded=True, runners={"sh": 1})
    job = {"status": "dispatched", "attempt": "0", "script_type": "probe"}
    async with open_store(role_url(alice.config, alice.info.redis_url)) as admin:
        await admin.hset(1, "job:1:999", job)
        await admin.lpush(1, "queue:probe", "job:1:999")
    runs = SyncRuns(connect(role_url(alice.config, alice.info.redis_url, RUNNER), 1))
    take = NextJob(("queue:probe",), "n:b:1:probe:0", 15_000, "probe:0")
    entry, begun = runs.pop_started("queue:probe", "inflight:runner:probe:0", 1.0, 0, take)
    assert entry == "job:1:999"
    assert isinstance(begun, dict)
    assert (begun["status"], begun["attempt"]) == ("started", "1")


async def test_the_runner_user_ends_a_batch_and_takes_the_next_in_one_call(node_factory):
    """A batch's ends and the next take (runs.ends_then_source) run under the runner's ACL
    user, every command of them: the starts (the lease in ``running``), the ends with their
    answers pushed per list, the in-flight list rewritten at once. A command it may not send
    would fail the call after some ends were written."""
    alice = await node_factory("alice", embedded=True, runners={"sh": 1})
    jobs = [f"job:1:99{i}" for i in range(5)]
    queued = {"status": "dispatched", "attempt": "0", "script_type": "probe"}
    async with open_store(role_url(alice.config, alice.info.redis_url)) as admin:
        for job in jobs:
            await admin.hset(1, job, queued)
            await admin.lpush(1, "queue:probe", job)
    runs = SyncRuns(connect(role_url(alice.config, alice.info.redis_url, RUNNER), 1))
    inflight = "inflight:runner:probe:0"
    take = NextJob(("queue:probe",), "n:b:1:probe:0", 15_000, "probe:0", count=4)
    _, taken = runs.end_all([], inflight, take)
    assert [key for key, _ in taken] == jobs[:4]

    def finished(job: str) -> Call:
        ending = Ending(job, 1, inflight, "finished", {}, "", "")
        return finish_local_call(ending, request_key=f"message:{job}", reply_ttl_s=60, stats="[]")

    oks, again = runs.end_all([finished(j) for j in jobs[:4]], inflight, take)
    assert oks == [True] * 4
    assert [key for key, _ in again] == [jobs[4]]
    assert runs.client.lrange(inflight, 0, -1) == [jobs[4]]
    async with open_store(role_url(alice.config, alice.info.redis_url)) as admin:
        assert await admin.llen(1, f"reply:message:{jobs[0]}") == 1


async def test_a_home_without_passwords_gets_them_at_start(tmp_path, caplog):
    config = init_home(tmp_path / "h", listen_port=0, runners={"sh": 1})
    shutil.rmtree(tmp_path / "h" / "secrets")
    (tmp_path / "h" / "run").chmod(0o755)
    caplog.set_level(logging.INFO, logger="node.host.acl")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            info = await nursery.start(run_node, config)
            async with open_store(role_url(config, info.redis_url)) as store:
                await store.ping()
            nursery.cancel_scope.cancel()
    assert {mode(secret_path(config.home, r)) for r in ROLES} == {0o600}
    assert mode(config.run_dir) == 0o700
    assert "generated Valkey password(s) for node, client, runner" in caplog.text


async def test_credentials_command_gives_a_tcp_runner_url_when_a_port_is_open(tmp_path, capsys):
    port = free_port()
    config = init_home(tmp_path / "h", listen_port=0, runners={"sh": 1}, valkey_port=port)
    assert main(["--home", str(config.home), "credentials", "runner"]) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith("redis://runner:")
    assert url.endswith(f"@127.0.0.1:{port}")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_node, config)
            reply = await trio.to_thread.run_sync(raw, ("127.0.0.1", port), b"PING")
            assert reply.startswith(b"-NOAUTH"), reply
            async with open_store(url) as runner:
                await runner.hset(1, "job:1:1", {"status": "started"})
                assert await refused(runner, "actor:1")
            nursery.cancel_scope.cancel()
    assert main(["--home", str(config.home), "credentials", "client"]) == 0
    assert capsys.readouterr().out.strip().startswith("redis://client:")


async def test_without_credentials_coredis_cannot_connect(node_factory):
    alice = await node_factory("alice", embedded=True)
    anonymous = coredis.Redis.from_url(f"unix://{valkey_socket(alice.config)}")
    denied = pytest.RaisesExc(coredis.exceptions.AuthenticationRequiredError)
    with trio.fail_after(10), pytest.RaisesGroup(denied, flatten_subgroups=True):
        async with anonymous:
            await anonymous.hset("actor:1", {"pubkey": "x"})
    assert (await alice.store.hgetall(0, "actor:1"))["pubkey"] != "x"
