"""No secret in reach of a runner, and a runner runs only what the node admitted (issue 21, items
1 and 2): the ``runner`` ACL user, the spec over a pipe, the signer process, the admission
stamp, non-dumpable processes and the home's modes. Real nodes, real Valkey, real processes."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from coredis.tokens import PureToken

from bus.client.api import new_job, open_client
from bus.core import admitted, keys
from bus.core.envelope import ResultBody, sign_message, verify_message
from bus.core.models import JobStatus, Message, MessageType
from bus.store.connection import open_store
from crypto import KeyPair, read_key_file
from node.config import NodeConfig
from node.errors import NodeError
from node.host.acl import ROLES, RUNNER, read_secret, role_url
from node.host.hardening import admission_key_path, check_home, ensure_admission_key
from node.host.signer import Signer, SignerClient, SignerGone, run_signer
from node.intake.messages import signed_here
from node.state import NodeState
from tests.nodeproc import NodeProcess
from tests.nodes import link_to
from tests.runners.test_runner_procs import runner_processes_of

FORGED = {
    "caller_id": "1",
    "context_id": "1",
    "script_type": "sh",
    "status": "dispatched",
    "timeout": "60",
}


def secrets_of(home: Path) -> list[str]:
    """Every secret value of a home, as text."""
    values = [read_secret(home, role) for role in ROLES]
    values.append(admission_key_path(home).read_text().strip())
    values.append(read_key_file(home / "node.key").seed.hex())
    return values


def work_of(node) -> Path:  # noqa: ANN001 - RunningNode
    """Context 1's work dir on the host: the one place outside its sandbox a job sees (its
    cwd), where these tests' jobs leave their marks (see node/runners/sandboxes.py)."""
    return Path(node.config.home) / "work" / "1"


async def _dead_letters(node) -> dict[str, dict[str, str]]:  # noqa: ANN001 - RunningNode
    entries = [json.loads(e) for e in await node.store.lrange(1, keys.DLQ)]
    return {e["key"]: e for e in entries}


async def test_a_hand_written_job_hash_is_refused_and_the_next_admitted_job_runs(
    node_factory, capfd
):
    """With the ``runner`` password, a job hash of actor 1 written and queued by hand (no stamp,
    or a wrong one) is dead-lettered ``not_admitted`` and never runs; the admitted job queued
    right after it runs."""
    alice = await node_factory("alice", embedded=True, runners={"sh": 1})
    actor = read_key_file(alice.config.actor_key_path)
    ran = work_of(alice) / "forged-ran"  # the job's cwd: it would touch it there
    forged = FORGED | {"script": "touch forged-ran", "origin": alice.info.node_id}
    runner_url = role_url(alice.config, alice.info.redis_url, RUNNER)
    with trio.fail_after(40):
        async with open_store(runner_url) as as_runner:
            await as_runner.hset(1, "job:1:666", forged | {"id": "666"})
            wrong = forged | {"id": "667", admitted.FIELD: "00" * 32}
            await as_runner.hset(1, "job:1:667", wrong)
            await as_runner.call(1, lambda r: r.lpush("queue:sh", ["job:1:666", "job:1:667"]))
        msg = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="sh", script="echo admitted"
        )
        [result] = await alice.client.wait_results(msg, 30)
    assert result.ok, result
    assert result.stdout == "admitted\n"
    assert not ran.exists()
    letters = await _dead_letters(alice)
    for key in ("job:1:666", "job:1:667"):
        assert letters[key]["reason"] == "not_admitted", letters
        fields = await alice.store.hgetall(1, key)
        assert fields["status"] == "error"
        assert fields["reason"].startswith("not_admitted: ")
    assert "no admission stamp" in letters["job:1:666"]["detail"]
    logged = capfd.readouterr().err  # the runner process's log lines, on the node's stderr
    assert "refused job:1:666 (context 1): the job hash carries no admission stamp" in logged
    assert "does not match" in letters["job:1:667"]["detail"]


@pytest.mark.parametrize("tamper", [False, True])
async def test_an_admitted_job_whose_script_was_changed_is_refused(node_factory, tamper):
    """An admitted job is held back (targeted to a group no slot serves), its script rewritten
    with the ``runner`` password and put on the type queue: refused. Untouched, the same job
    taken the same way runs (the control: the stamp survives the move)."""
    alice = await node_factory("alice", embedded=True, runners={"sh": 1})
    actor = read_key_file(alice.config.actor_key_path)
    # relative: the job's cwd is its work dir, the only host dir its sandbox shows it
    fine, evil = work_of(alice) / "fine", work_of(alice) / "evil"
    job = replace(new_job(1, 1, "sh", "touch fine"), group="held")
    runner_url = role_url(alice.config, alice.info.redis_url, RUNNER)
    with trio.fail_after(40):
        msg = await alice.client.submit(actor, 1, to="self", context_id=1, jobs=[job])
        async with open_store(runner_url) as as_runner:

            def hold(r):  # noqa: ANN001, ANN202 - a coredis client
                held = "inflight:runner:held"
                return r.blmove("queue:sh:group:held", held, PureToken.RIGHT, PureToken.LEFT, 20)

            assert await as_runner.call(1, hold) == job.key
            if tamper:
                await as_runner.hset(1, job.key, {"script": "touch evil"})
            await as_runner.call(1, lambda r: r.lpush("queue:sh", [job.key]))
        after = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="sh", script="echo next"
        )
        [nxt] = await alice.client.wait_results(after, 30)
        assert nxt.ok, nxt
        if not tamper:
            [result] = await alice.client.wait_results(msg, 30)
            assert result.ok, result
    assert fine.exists() is not tamper
    assert not evil.exists()
    fields = await alice.store.hgetall(1, job.key)
    letters = await _dead_letters(alice)
    if tamper:
        assert fields["reason"].startswith("not_admitted"), fields
        assert letters[job.key]["reason"] == "not_admitted"
    else:
        assert fields["status"] == "finished"
        assert job.key not in letters


async def test_runner_processes_hold_no_secret_and_connect_as_runner(node_factory, monkeypatch):
    """The runner processes' environments (/proc/<pid>/environ, read from outside) and command
    lines hold no password nor key, nor does a python job's own environment (which it prints:
    in its sandbox, as another uid, it may not read /proc/self/environ) and command line; its
    interpreter holds no key object; the runner processes are the ``runner`` user's
    connections."""
    monkeypatch.setenv("HERO_KEY_PASSPHRASE", "passphrase-of-the-node")  # not passed on
    alice = await node_factory("alice", embedded=True, runners={"python": 1, "sh": 1})
    actor = read_key_file(alice.config.actor_key_path)
    script = (
        "import gc, os\n"
        "from crypto import KeyPair\n"
        "print(open('/proc/self/cmdline', 'rb').read().decode(errors='replace'))\n"
        "print(dict(os.environ))\n"
        "print('keys', sum(isinstance(o, KeyPair) for o in gc.get_objects()))\n"
    )
    with trio.fail_after(40):
        msg = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="python", script=script
        )
        [result] = await alice.client.wait_results(msg, 30)
        clients = await alice.store.call(0, lambda r: r.client_list())
    assert result.ok, result
    assert "keys 0" in result.stdout
    pids = runner_processes_of(alice.config.run_dir)
    assert len(pids) == 2
    files = [Path(f"/proc/{pid}/{what}") for pid in pids for what in ("environ", "cmdline")]
    seen = result.stdout.encode() + b"".join(f.read_bytes() for f in files)  # noqa: ASYNC240
    for secret in [*secrets_of(alice.config.home), "passphrase-of-the-node"]:
        assert secret.encode() not in seen
    assert sum(c.get("user") == RUNNER for c in clients) >= 2, clients


def test_the_runner_user_cannot_touch_the_trust_anchor(redis_url, tmp_path):
    """Every key the node trusts refuses the runner user's writes, in DB 0 and elsewhere; so do
    replay markers and flows (checked on an embedded Valkey with the node's ACL file)."""
    import redis

    from node.host.acl import embedded_spec
    from node.host.home import init_home
    from node.host.valkey import ValkeyProcess

    config = init_home(tmp_path / "h", listen_port=0, runners={"sh": 1})
    assert admission_key_path(config.home).stat().st_mode & 0o777 == 0o600  # made by init
    spec = embedded_spec(config)
    server = ValkeyProcess(spec)
    server.start()
    try:
        url = f"unix://{spec.unix_socket}"
        password = read_secret(config.home, RUNNER)
        for db in (0, 1):
            r = redis.Redis.from_url(url, username=RUNNER, password=password, db=db)
            r.hset("job:1:1", "status", "dispatched")  # what it may write
            for key in ("actor:666", "context:1", "peer:" + "ab" * 32, "node:info", "flow:1"):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    r.hset(key, "pubkey", "00" * 32)
            with pytest.raises(redis.exceptions.NoPermissionError):
                r.set("seen:message:1:1", "1")
    finally:
        server.stop()


def _result_of(key: KeyPair) -> Message:
    """A result message of the node whose key is ``key``, unsigned."""
    return Message(
        7,
        1,
        1,
        message=ResultBody("message:1:1", "job:1:1", JobStatus.FINISHED, {}).encode(),
        message_type=MessageType.RESULT,
        origin=key.public_hex,
        destination="cd" * 32,
    )


@asynccontextmanager
async def _signer_and_runner(key: KeyPair) -> AsyncIterator[tuple[Signer, SignerClient]]:
    """A signer process with ``key``, and a runner's client on a socket to it; the signer is
    stopped when the block ends."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            signer = await nursery.start(run_signer, key)
            sock = await signer.attach()
            client = SignerClient(os.dup(sock.fileno()))
            sock.close()
            yield signer, client
            nursery.cancel_scope.cancel()


async def test_the_signer_signs_results_of_this_node_only(tmp_path):
    key = KeyPair.generate()
    result = _result_of(key)
    async with _signer_and_runner(key) as (_, client):
        signed = await trio.to_thread.run_sync(client.sign_result, result)
        assert verify_message(signed, key.public_hex).ok
        for bad in (
            replace(result, message_type=MessageType.JOB),
            replace(result, message_type=MessageType.FLOW_JOB),
            replace(result, origin="ab" * 32),
        ):
            with pytest.raises(NodeError, match="refused"):
                await trio.to_thread.run_sync(client.sign_result, bad)
    with pytest.raises(SignerGone):  # a runner then exits rather than retry for ever
        client.sign_result(result)


async def test_the_signer_signs_a_batchs_results_in_one_request_each_checked_alone(tmp_path):
    """k results in one request, k signatures back in order; a batch with one result the
    signer may not sign (another origin, not a result) is refused whole, and the socket is
    still served."""
    key = KeyPair.generate()
    results = [replace(_result_of(key), id=n) for n in range(1, 4)]
    async with _signer_and_runner(key) as (signer, client):
        signed = await trio.to_thread.run_sync(client.sign_results, results)
        assert [m.id for m in signed] == [1, 2, 3]
        assert all(verify_message(m, key.public_hex).ok for m in signed)
        assert len({m.signatures[0]["signature"] for m in signed}) == 3
        for bad in (
            replace(results[1], origin="ab" * 32),
            replace(results[1], message_type=MessageType.JOB),
        ):
            with pytest.raises(NodeError, match="refused"):
                await trio.to_thread.run_sync(client.sign_results, [results[0], bad])
        again = await trio.to_thread.run_sync(client.sign_results, results[:2])
        assert all(verify_message(m, key.public_hex).ok for m in again)
        signer.hear()  # the notices wait in the node's socket, each sent before its answer
        assert all(r.key in signer.signed for r in results)


async def test_a_request_nested_too_deep_is_refused_and_the_signer_goes_on(tmp_path):
    """A request line no JSON parser here can nest (orjson refuses it, json recurses out)
    gets an error answer; the runner's socket is still served (it was closed: the thread
    that served it died of the RecursionError, and the runner could answer nothing more)."""
    key = KeyPair.generate()
    result = _result_of(key)
    async with _signer_and_runner(key) as (_, client):
        deep = b'{"content": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"

        def ask_raw() -> bytes:
            with client.lock:
                client.stream.write(deep)
                client.stream.flush()
                return client.stream.readline()

        answer = json.loads(await trio.to_thread.run_sync(ask_raw))
        assert answer == {"error": "content is not an object"}, answer
        signed = await trio.to_thread.run_sync(client.sign_result, result)
        assert verify_message(signed, key.public_hex).ok


async def test_the_node_knows_what_its_signer_signed_for_runners(tmp_path):
    """The signer tells the node which signature it made for which result: the supervisor
    routes that result without verifying it again (signed_here), once; a result carrying any
    other signature under that key, or a key the signer never signed, is verified in full.
    The notice waits in the node's socket before the runner has its signature (so before its
    result can be popped): the supervisor, its one reader, finds it with no task of its own."""
    key = KeyPair.generate()
    result = _result_of(key)
    async with _signer_and_runner(key) as (signer, client):
        signed = await trio.to_thread.run_sync(client.sign_result, result)
        node = SimpleNamespace(
            identity=SimpleNamespace(signer=signer),
            recent=SimpleNamespace(signed_results=signer.signed),  # one memory, as in NodeState
        )
        assert result.key not in signer.signed  # waits in the socket: no one took it yet
        signer.hear()
        assert result.key in signer.signed
        forged = replace(
            signed, signatures=[sign_message(result, KeyPair.generate()).signatures[0]]
        )
        assert not signed_here(node, forged)  # type: ignore[arg-type]  # (taken: once)
        signed_again = await trio.to_thread.run_sync(client.sign_result, result)
        assert signed_here(node, signed_again)  # type: ignore[arg-type]
        assert not signed_here(node, signed_again)  # type: ignore[arg-type]  # once
        other = replace(signed, id=9)
        assert not signed_here(node, other)  # type: ignore[arg-type]
        signer.took_notice(b"not json")  # a garbled notice is ignored
        signer.took_notice(b'{"key": 1, "signature": {}}')
        assert 1 not in signer.signed


def test_a_notice_heard_is_found_in_the_nodes_one_memory(tmp_path):
    """The node's memory of results signed here is one: what the signer's notices said is
    found there like the node's own signatures; still once, and only that signature."""
    key = KeyPair.generate()
    signer = Signer(None, 0, dumpable=False)  # type: ignore[arg-type]  # no process: notices only
    node = NodeState(NodeConfig(home=tmp_path), key, None, signer=signer)  # type: ignore[arg-type]
    signed = sign_message(_result_of(key), key)
    notice = {"key": signed.key, "signature": signed.signatures[0]}
    signer.took_notice(json.dumps(notice).encode())
    forged = replace(signed, signatures=[sign_message(signed, KeyPair.generate()).signatures[0]])
    assert not signed_here(node, forged)  # (taken: once)
    signer.took_notice(json.dumps(notice).encode())
    assert signed_here(node, signed)
    assert not signed_here(node, signed)  # once


async def test_node_signer_and_runners_are_not_dumpable(tmp_path):
    """The node (``hero-node run``) and its signer publish their PR_GET_DUMPABLE in node:info;
    a python job reads its runner process's own. (As root, /proc access cannot show it: root
    reads any /proc/<pid>/environ; for a node of another uid it is what keeps it private.)"""
    node = NodeProcess(tmp_path / "n", "n", runners={"python": 1})
    actor = read_key_file(node.config.actor_key_path)
    probe = "import ctypes\nprint(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"
    try:
        await node.start()
        with trio.fail_after(40):
            async with open_client(node.redis_url) as client:
                info = await client.store.hgetall(0, keys.NODE_INFO)
                msg = await client.submit_job(
                    actor, 1, to="self", context_id=1, script_type="python", script=probe
                )
                [result] = await client.wait_results(msg, 30)
    finally:
        await node.close()
    assert (info["dumpable"], info["signer_dumpable"]) == ("0", "0"), info
    assert result.stdout == "0\n", result


def test_the_home_s_modes_are_fixed_at_start_and_foreign_secrets_refused(tmp_path, caplog):
    home = tmp_path / "h"
    (home / "secrets").mkdir(parents=True, mode=0o755)
    key = ensure_admission_key(home)
    assert ensure_admission_key(home) == key  # made once
    assert admitted.KEY_BYTES == len(key)
    node_key = home / "node.key"
    node_key.write_text("x")
    home.chmod(0o755)
    node_key.chmod(0o644)
    admission_key_path(home).chmod(0o640)
    fixed = check_home(home, [node_key])
    assert len(fixed) == 4
    paths = (home, home / "secrets", node_key, admission_key_path(home))
    assert [p.stat().st_mode & 0o777 for p in paths] == [0o700, 0o700, 0o600, 0o600]
    assert "secrets must be readable by the node's user only" in caplog.text
    assert check_home(home, [node_key]) == []
    if os.geteuid() == 0:
        os.chown(node_key, 65534, 65534)
        with pytest.raises(NodeError, match="owned by uid 65534"):
            check_home(home, [node_key])


def test_the_stamp_covers_what_runs():
    key = b"k" * 32
    fields = {"id": "1", "script": "echo", "script_type": "sh", "env_vars": "{}", "status": "x"}
    stamped = fields | {admitted.FIELD: admitted.stamp(key, 1, "job:1:1", fields)}
    assert admitted.problem(key, 1, "job:1:1", stamped) == ""
    running = stamped | {"status": "started", "attempt": "2"}
    assert admitted.problem(key, 1, "job:1:1", running) == ""
    for changed in ({"script": "rm"}, {"env_vars": '{"A":"1"}'}, {"reply_to": "x"}):
        assert admitted.problem(key, 1, "job:1:1", stamped | changed)
    assert admitted.problem(key, 2, "job:1:1", stamped)  # another context
    assert admitted.problem(key, 1, "job:1:2", stamped)  # another key
    assert admitted.problem(b"x" * 32, 1, "job:1:1", stamped)  # another node


async def test_a_remote_job_retried_once_is_answered_through_the_runner_user_and_signer(
    node_factory,
):
    """On embedded Valkeys (runner processes as the ``runner`` user): a job from another node
    fails, is retried (``delayed``, attempts) and then answered with a result message the
    signer signed (``message:*``, ``msg_out``): every write of those paths is in the ACL."""
    alice = await node_factory("alice", embedded=True, runners={"sh": 1})
    bob = await node_factory("bob", embedded=True, runners={"sh": 1})
    actor = await link_to(alice, bob)
    # the flag in the job's cwd, bob's context 1 work dir, which the retry's sandbox sees too
    script = "if [ -e failed-once ]; then echo second; else touch failed-once; exit 3; fi"
    with trio.fail_after(40):
        msg = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="sh", script=script, retries=1
        )
        [result] = await alice.client.wait_results(msg, 30)
    assert result.ok, result
    assert (result.stdout, result.result["attempts"]) == ("second\n", "2")
    assert (work_of(bob) / "failed-once").exists()  # the first attempt ran where bob runs jobs
