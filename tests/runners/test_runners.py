"""Custom script types, runner registration/presence, and external runners (raw Redis only)."""

from __future__ import annotations

import json

import pytest
import trio
from coredis.tokens import PureToken

from bus.core import keys
from bus.core.models import JobStatus
from bus.store.connection import open_store
from bus.store.presence import live_runners
from crypto import read_key_file
from node.config import NodeConfig, load_config, render_config
from node.daemon import run_node
from node.errors import ConfigError
from node.host.home import init_home
from tests.scripts import announcing, wait_announced

# docs/use/runners.md#external-runners: finishing a job (atomic, only while the attempt is current)
FINISH_LUA = """
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'reason', ARGV[4],
           'updated_at', ARGV[5])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('LREM', KEYS[3], 1, KEYS[1])
redis.call('LPUSH', KEYS[4], KEYS[1])
return 1
"""


async def submit(node, script_type: str, script: str, *, to: str = "", **kw):
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor,
        1,
        to=to or node.node_id,
        context_id=1,
        script_type=script_type,
        script=script,
        **kw,
    )


# -- 1. custom script types -------------------------------------------------------------------


async def test_custom_types_script_file_and_stdin(node_factory, tmp_path):
    alice = await node_factory(
        "alice",
        runners={"python": 1, "sh": 1, "fileish": 1, "cat": 1},
        commands={"fileish": ["/bin/sh", "{script_file}", "{job_id}"], "cat": ["/bin/cat"]},
    )
    # the script file is in the sandbox's /tmp: a later job of the slot finds it gone
    script = 'stat -c %a "$0"; echo "$0"; echo "job $1 $HERO_JOB_ID"'
    with trio.fail_after(20):
        [res] = await alice.client.wait_results(await submit(alice, "fileish", script), 15)
        [cat] = await alice.client.wait_results(await submit(alice, "cat", "hello\n"), 15)
    assert res.ok, res
    job_id = res.job_key.rsplit(":", 1)[1]
    mode, path, said = res.stdout.split("\n", 2)
    assert said == f"job {job_id} {job_id}\n"
    assert mode == "600"
    assert path.endswith(".fileish")
    gone = f"test -e {path} || echo gone"
    with trio.fail_after(20):
        [after] = await alice.client.wait_results(await submit(alice, "fileish", gone), 15)
    assert after.stdout == "gone\n", after
    assert cat.ok
    assert cat.stdout == "hello\n"


async def test_unknown_type_still_errors(node_factory):
    alice = await node_factory("alice", commands={})
    with trio.fail_after(20):
        [res] = await alice.client.wait_results(await submit(alice, "v", "println(1)"), 15)
    assert res.status is JobStatus.ERROR
    assert res.reason.startswith("unknown_script_type")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[runners]\nv = 1\n[commands]\nv = []\n", "non-empty list of strings"),
        ('[runners]\nv = 1\n[commands]\nv = "v run"\n', "non-empty list of strings"),
        ('[runners]\nv = 1\n[commands]\nv = ["v", 3]\n', "non-empty list of strings"),
        ('[runners]\nv = 1\n[commands]\nv = ["v", "{file}"]\n', "unknown placeholder {file}"),
        ("[runners]\nv = 1\n", "no command to run it"),
        ('[runners]\npython = 1\n[commands]\nv = ["v"]\n', "add `v = 1` to [runners]"),
        ('[runners]\nv = 1\n[commands]\nv = ["v"]\n[runner_groups]\nsh = "g"\n', "sh"),
    ],
)
def test_command_config_errors(tmp_path, table, message):
    (tmp_path / "config.toml").write_text('[node]\nname = "x"\n' + table)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("{", r"\{")):
        load_config(tmp_path)


def test_command_config_round_trip(tmp_path):
    cfg = NodeConfig(
        home=tmp_path,
        runners={"python": 1, "v": 2, "ext": 0},
        commands={"v": ["v", "run", "{script_file}"]},
        runner_groups={"v": "gpu"},
    )
    (tmp_path / "config.toml").write_text(render_config(cfg))
    assert load_config(tmp_path) == cfg


# -- 2. registration and presence -------------------------------------------------------------


async def test_runners_register_and_show_busy(node_factory):
    alice = await node_factory("alice")
    live = {r.runner_id: r for r in await live_runners(alice.store, 1)}
    prefix = alice.node_id[:12]
    assert set(live) == {f"{prefix}:1:python:0", f"{prefix}:1:python:1", f"{prefix}:1:sh:0"}
    assert not any(r.busy for r in live.values())
    runner = await alice.store.hgetall(1, keys.runner(f"{prefix}:1:sh:0"))
    assert runner["local"] == "true"
    assert runner["script_type"] == "sh"
    assert runner["address"] == alice.info.ws_url
    assert runner["pubkey"] == alice.node_id
    ttl = await alice.store.call(1, lambda r: r.ttl(keys.presence_runner(f"{prefix}:1:sh:0")))
    assert 0 < ttl <= 15
    script = announcing(alice.info.redis_url, "busy", "import time; time.sleep(30)")
    await submit(alice, "python", script)
    await wait_announced(alice.store, "busy")
    busy = [r for r in await live_runners(alice.store, 1) if r.busy]
    assert len(busy) == 1
    assert busy[0].script_type == "python"
    assert busy[0].jobs[0].startswith("job:1:")


async def test_clean_stop_deletes_presence(tmp_path, redis_url):
    config = init_home(tmp_path / "n", listen_port=0, redis_url=redis_url, runners={"sh": 2})
    async with open_store(redis_url) as store:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_node, config)
            assert len(await live_runners(store, 1)) == 2
            nursery.cancel_scope.cancel()
        assert await live_runners(store, 1) == []
        names = await store.call(1, lambda r: r.keys("runner:*"))
        assert len(names) == 2  # registrations stay; presence says who is live


# -- 4. external runners ----------------------------------------------------------------------


class External:
    """An external runner speaking docs/use/runners.md's protocol with raw Redis commands."""

    def __init__(self, store, runner_id: str, script_type: str) -> None:
        self.store, self.id, self.type = store, runner_id, script_type
        self.inflight = f"inflight:runner:{runner_id}"

    async def register(self) -> None:
        fields = {"id": self.id, "local": "false", "script_type": self.type, "topic": ""}
        presence = json.dumps({"inflight": self.inflight, "script_type": self.type})
        await self.store.call(1, lambda r: r.hset(f"runner:{self.id}", fields))
        await self.store.call(1, lambda r: r.set(f"presence:runner:{self.id}", presence, ex=15))

    async def take(self, lease_ms: int = 15_000) -> tuple[str, str]:
        """Pop a job reliably, lease it and mark it started; (job key, attempt number)."""
        job = await self.store.call(
            1, lambda r: r.blmove(f"queue:{self.type}", self.inflight, "RIGHT", "LEFT", 10)
        )
        assert job is not None
        token = f"{self.id}:t{trio.current_time()}"
        valkey_now = await self.store.call(1, lambda r: r.time())  # the clock leases are on
        lapses_ms = int(valkey_now.timestamp() * 1000) + lease_ms
        lease = {job: lapses_ms}
        taken = await self.store.call(1, lambda r: r.zadd("running", lease, condition=PureToken.NX))
        assert taken == 1  # 0: another runner holds it
        attempt = await self.store.call(1, lambda r: r.hincrby(job, "attempt", 1))
        started = {"status": "started", "runner": token, "runner_id": self.id}
        await self.store.call(1, lambda r: r.hset(job, started))
        return job, str(attempt)

    async def finish(self, job: str, attempt: str, status: str, result: dict, reason: str = ""):
        names = [job, "running", self.inflight, "results"]
        args = [attempt, status, json.dumps(result), reason, "0"]
        return await self.store.call(1, lambda r: r.eval(FINISH_LUA, names, args))


async def raw_reply(node, message) -> dict:
    """The reply on ``message``'s reply list as the node wrote it, checked to be in the one
    form PROTOCOL.md section 8 gives (compact, keys in its order) whichever way the job ran."""
    got = await node.store.call(1, lambda r: r.blpop([keys.reply(message.key)], 15))
    assert got is not None, "no reply"
    raw = got[1]
    d = json.loads(raw)
    order = ("in_reply_to", "job_key", "status", "result", "reason")
    assert raw == json.dumps({k: d[k] for k in order}, separators=(",", ":")), raw
    assert d["in_reply_to"] == message.key
    return d


async def test_external_runner_local_origin(node_factory):
    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    ext = External(alice.store, "ext-1", "ext")
    await ext.register()
    with trio.fail_after(20):
        msg = await submit(alice, "ext", "say 42")
        job, attempt = await ext.take()
        assert [r.jobs for r in await live_runners(alice.store, 1) if r.runner_id == "ext-1"] == [
            [job]
        ]
        script = (await alice.store.hgetall(1, job))["script"]
        assert await ext.finish(job, attempt, "finished", {"stdout": script.split()[1]}) == 1
        res = await raw_reply(alice, msg)
        # a built-in runner's reply to the same client reads alike
        builtin = await raw_reply(alice, await submit(alice, "python", "print(42)"))
    assert (res["status"], res["reason"]) == ("finished", "")
    assert res["result"] == {"stdout": "42", "attempts": "1"}
    assert builtin["status"] == "finished"
    assert builtin["result"]["stdout"] == "42\n"
    assert await alice.store.lrange(1, ext.inflight) == []
    assert (await alice.store.hgetall(1, msg.key))["status"] == "processed"


async def test_external_runner_remote_origin_signed_result(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob", runners={"sh": 1, "ext": 0})
    await alice.client.add_peer(bob.node_id, bob.info.ws_url, name="bob")
    await bob.client.add_peer(alice.node_id, "", name="alice")
    actor = read_key_file(alice.config.actor_key_path)
    await bob.client.register_actor(1, actor.public_hex)  # alice's actor is actor 1 at bob
    await bob.client.register_context(1, admins=[bob.config.actor_id], executors=[1])
    ext = External(bob.store, "bob-ext", "ext")
    with trio.fail_after(30):
        msg = await submit(alice, "ext", "anything", to=bob.node_id)
        job, attempt = await ext.take()
        assert await ext.finish(job, attempt, "error", {"stderr": "boom"}, "exit code 3") == 1
        res = await raw_reply(alice, msg)  # bob's signed result, applied at alice
    assert res["status"] == JobStatus.ERROR.value
    assert res["reason"] == "exit code 3"
    assert res["result"] == {"stderr": "boom", "attempts": "1"}
    assert (await bob.store.hgetall(1, job))["answered"]


async def test_external_runner_dies_job_requeued_then_lost(node_factory):
    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    ext = External(alice.store, "ext-dead", "ext")
    with trio.fail_after(30):
        msg = await submit(alice, "ext", "x", retries=1)
        job, attempt = await ext.take(lease_ms=300)  # ... and never renews: it "died"
        again, attempt2 = await ext.take(lease_ms=300)  # the reaper re-queued it (retry)
        assert again == job
        [res] = await alice.client.wait_results(msg, 25)
    assert res.status is JobStatus.ERROR
    assert res.reason.startswith("runner_lost")
    assert res.result["attempts"] == "2"
    assert await ext.finish(job, attempt2, "finished", {}) == 0  # too late: that attempt was reaped
    assert not await alice.store.call(1, lambda r: r.zrange("running", 0, -1))
    attempts = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(job))]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "error"), (2, "error")]
