"""One reply inbox per client: a message's signed ``reply_to`` names the list its answers go to,
the client pops them in batches and hands each to the waiter of its message; a bad name is
refused (``bad_reply_to``) and ``reply:<message key>`` stays the default."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from bus.client.api import Client, new_job, open_client
from bus.client.inbox import BATCH, new_inbox_name
from bus.core import keys
from bus.core.envelope import JobResult, parse_reply, sign_message, verify_message
from bus.core.models import JobStatus, Message, MessageType
from bus.core.reasons import Reason
from bus.errors import ClientError
from bus.store.connection import Store
from crypto import KeyPair, read_key_file
from node.host.acl import CLIENT, role_url
from tests.nodes import link_to

CTX = 1


# -- the key and the signed field (pure) ----------------------------------------------------------


def test_reply_list_is_the_named_inbox_or_the_message_s_own_list():
    assert keys.reply_list("message:1:2") == "reply:message:1:2"
    assert keys.reply_list("message:1:2", "c0ffee_A-1.x") == "inbox:c0ffee_A-1.x"
    # a name that is no inbox name never becomes a key: the default list is used
    for bad in ("a b", "../x", "x:y", "é", "*", "a" * (keys.INBOX_NAME_MAX + 1)):
        assert keys.inbox_name_problem(bad), bad
        assert keys.reply_list("message:1:2", bad) == "reply:message:1:2"
        with pytest.raises(ValueError, match="inbox name"):
            keys.inbox(bad)
    assert not keys.inbox_name_problem(new_inbox_name())


def _message(reply_to: str = "") -> Message:
    job = new_job(7, CTX, "python", "print(1)")
    return Message(
        id=5, caller_id=7, context_id=CTX, job=[job], created_at=1, nonce="n", reply_to=reply_to
    )


def test_reply_to_is_signed_when_set_and_absent_otherwise():
    key = KeyPair.generate()
    plain = _message()
    assert "reply_to" not in plain.signed_content()  # existing signatures and vectors hold
    assert "reply_to" not in plain.to_hash()
    named = sign_message(_message("inbox1"), key)
    assert named.signed_content()["reply_to"] == "inbox1"
    parsed = Message.from_hash(named.to_hash())
    assert parsed.reply_to == "inbox1"
    assert parsed.signed_content() == named.signed_content()
    assert verify_message(named, key.public_hex).ok
    # moving the answers to another inbox breaks the caller's signature
    assert not verify_message(replace(named, reply_to="inbox2"), key.public_hex).ok


# -- the client side: batched pops on real Valkey, no node ---------------------------------------


async def _blmpop_calls(store: Store) -> int:
    stats = await store.call(CTX, lambda r: r.info("commandstats"))
    return int(stats.get("cmdstat_blmpop", {}).get("calls", 0))


def _answer(message: Message, index: int = 0) -> str:
    """What a node pushes on the inbox for job ``index`` of ``message``."""
    job = message.job[index]
    result = {"stdout": f"{job.key}\n"}
    return json.dumps(
        {"in_reply_to": message.key, "job_key": job.key, "status": "finished", "result": result}
    )


async def test_many_waiters_share_one_blocking_pop_per_batch(store):
    """300 answers already in the inbox reach their 300 waiters with two BLMPOPs (256 + 44),
    not one pop per job; each waiter gets its own message's answers."""
    name = new_inbox_name()
    client = Client(store, inbox=name)
    messages = [replace(_message(name), id=i) for i in range(300)]
    await store.lpush(CTX, keys.inbox(name), *[_answer(m) for m in messages])
    before = await _blmpop_calls(store)
    got: dict[str, list[JobResult]] = {}

    async def wait(message: Message) -> None:
        got[message.key] = await client.wait_results(message, timeout_s=10)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for message in messages:
                nursery.start_soon(wait, message)
    assert len(got) == 300
    for message in messages:
        [result] = got[message.key]
        assert result.job_key == message.job[0].key
        assert result.stdout == f"{message.job[0].key}\n"
    assert await _blmpop_calls(store) - before == -(-300 // BATCH)
    assert await store.llen(CTX, keys.inbox(name)) == 0


async def test_answers_of_a_later_waiter_are_kept_and_a_missing_one_times_out(store):
    name = new_inbox_name()
    client = Client(store, inbox=name)
    first, second = (replace(_message(name), id=i) for i in (1, 2))
    two_jobs = replace(second, job=[second.job[0], new_job(7, CTX, "python", "print(2)")])
    await store.lpush(CTX, keys.inbox(name), _answer(two_jobs, 0), _answer(first), "not json")
    with trio.fail_after(30):
        [mine] = await client.wait_results(first, timeout_s=0.3)  # pops all three at once
        assert mine.job_key == first.job[0].key
        with pytest.raises(ClientError, match="no result for"):
            await client.wait_results(two_jobs, timeout_s=0.3)  # its second answer never comes
        await store.lpush(CTX, keys.inbox(name), _answer(two_jobs, 1))
        # the waiter that gave up claims nothing: a new wait gets only what came after it
        with pytest.raises(ClientError, match="no result for"):
            await client.wait_results(two_jobs, timeout_s=0.3)


async def test_a_popper_that_gives_up_leaves_the_others_their_answers(store):
    """The waiter popping for everyone is cancelled while it pops: the answer that comes
    then still reaches its own waiter (the pop is shielded and filed before it leaves)."""
    name = new_inbox_name()
    client = Client(store, inbox=name)
    first, second = (replace(_message(name), id=i) for i in (1, 2))
    got: list[JobResult] = []
    popper = trio.CancelScope()

    async def wait_first() -> None:
        with popper:
            await client.wait_results(first, timeout_s=10)

    async def wait_second() -> None:
        got.extend(await client.wait_results(second, timeout_s=10))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_first)
            await trio.testing.wait_all_tasks_blocked()  # first is in its BLMPOP
            nursery.start_soon(wait_second)
            await trio.testing.wait_all_tasks_blocked()  # second waits for first to pop
            # the answer is taken by first's pop; first is cancelled before it reads it
            await store.lpush(CTX, keys.inbox(name), _answer(second))
            popper.cancel()
    assert popper.cancelled_caught
    assert [r.job_key for r in got] == [second.job[0].key]
    assert await store.llen(CTX, keys.inbox(name)) == 0


async def test_a_client_refuses_a_bad_inbox_name(store):
    with pytest.raises(ClientError, match="inbox"):
        Client(store, inbox="no spaces")


# -- with nodes ---------------------------------------------------------------------------------


async def _submit_and_wait(client: Client, actor: KeyPair, to: str, jobs: list) -> list:
    messages = await client.submit_many(actor, 1, to=to, context_id=CTX, jobs=jobs)
    got: dict[str, list[JobResult]] = {}

    async def wait(message: Message) -> None:
        got[message.key] = await client.wait_results(message, timeout_s=50)

    async with trio.open_nursery() as nursery:
        for message in messages:
            nursery.start_soon(wait, message)
    return [(m, got[m.key]) for m in messages]


def _script_jobs(n: int) -> list:
    """n messages, every third one carrying two jobs; each job prints its own number."""
    return [
        [new_job(1, CTX, "python", f"print({i})")]
        + ([new_job(1, CTX, "sh", f"echo {i}b")] if i % 3 == 0 else [])
        for i in range(n)
    ]


def _check(answered: list) -> None:
    for message, results in answered:
        assert sorted(r.job_key for r in results) == sorted(j.key for j in message.job)
        assert all(r.status is JobStatus.FINISHED for r in results), results
        by_key = {r.job_key: r.stdout for r in results}
        for job in message.job:
            printed = job.script.removeprefix("print(").removesuffix(")").removeprefix("echo ")
            assert by_key[job.key] == f"{printed}\n"


async def test_local_jobs_are_answered_on_the_client_s_inbox(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    name = new_inbox_name()
    client = Client(alice.store, inbox=name)
    with trio.fail_after(60):
        answered = await _submit_and_wait(client, actor, "self", _script_jobs(24))
        # a client that names no inbox is answered on reply:<message key>, as before
        plain = await alice.client.submit_job(
            actor, 1, to="self", context_id=CTX, script_type="python", script="print('plain')"
        )
        [alone] = await alice.client.wait_results(plain, timeout_s=30)
    _check(answered)
    assert alone.stdout == "plain\n"
    assert not plain.reply_to
    assert await alice.store.scan_keys(CTX, "reply:*") == []  # nothing went to the default lists
    message, _ = answered[0]
    job = await alice.store.hgetall(CTX, message.job[0].key)
    assert job["reply_to"] == name


async def test_cross_node_answers_land_in_the_inbox_at_the_origin(node_factory):
    alice = await node_factory("alice")
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    client = Client(alice.store, inbox=new_inbox_name())
    with trio.fail_after(90):
        answered = await _submit_and_wait(client, actor, bob.node_id, _script_jobs(12))
    _check(answered)
    assert await alice.store.scan_keys(CTX, "reply:*") == []
    assert await bob.store.scan_keys(CTX, "inbox:*") == []  # answered at the origin only


async def test_a_bad_reply_to_is_refused_with_its_reason_and_the_supervisor_goes_on(
    node_factory,
):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    client = Client(alice.store)
    client.inbox = "inbox:other-key"  # past the client's own check: what a hostile one sends
    with trio.fail_after(60):
        [bad] = await client.submit_many(
            actor, 1, to="self", context_id=CTX, jobs=[new_job(1, CTX, "python", "print(1)")]
        )
        # its sender is told why, on the only list the node builds for it: reply:<key>
        [refused] = await client.wait_results(replace(bad, reply_to=""), timeout_s=30)
        client.inbox = new_inbox_name()
        good = await client.submit_job(
            actor, 1, to="self", context_id=CTX, script_type="python", script="print('next')"
        )
        [fine] = await client.wait_results(good, timeout_s=30)
    assert refused.status is JobStatus.ERROR
    assert refused.reason.startswith(f"{Reason.BAD_REPLY_TO}: "), refused
    [letter] = await alice.store.dead_letters(CTX)
    assert letter["reason"] == Reason.BAD_REPLY_TO
    job = await alice.store.hgetall(CTX, bad.job[0].key)  # the origin's copy of its answer
    assert job["status"] == "error"
    assert "started_at" not in job, job  # it never ran
    assert await alice.store.scan_keys(CTX, "inbox:other-key*") == []
    assert fine.stdout == "next\n"


async def test_the_client_role_may_pop_its_inbox(node_factory):
    alice = await node_factory("alice", embedded=True)
    actor = read_key_file(alice.config.actor_key_path)
    url = role_url(alice.config, alice.info.redis_url, CLIENT)
    with trio.fail_after(60):
        async with open_client(url, inbox=new_inbox_name()) as client:
            answered = await _submit_and_wait(client, actor, "self", _script_jobs(4))
    _check(answered)
    assert all(m.message_type is MessageType.JOB for m, _ in answered)


async def test_external_runner_answers_reach_the_inbox(node_factory):
    """Jobs an external runner finishes are answered by the results service, which takes
    what is queued on ``results`` as a batch: on the inbox their message names."""
    from tests.runners.test_runners import External

    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    actor = read_key_file(alice.config.actor_key_path)
    ext = External(alice.store, "ext-1", "ext")
    await ext.register()
    client = Client(alice.store, inbox=new_inbox_name())
    jobs = [new_job(1, CTX, "ext", f"say {i}") for i in range(5)]
    with trio.fail_after(40):
        messages = await client.submit_many(actor, 1, to="self", context_id=CTX, jobs=jobs)
        taken = [await ext.take() for _ in jobs]
        for job_key, attempt in taken:
            said = (await alice.store.hgetall(CTX, job_key))["script"].split()[1]
            assert await ext.finish(job_key, attempt, "finished", {"stdout": said}) == 1
        answered = [await client.wait_results(m, timeout_s=30) for m in messages]
    for job, [result] in zip(jobs, answered, strict=True):
        assert result.job_key == job.key
        assert result.result == {"stdout": job.script.split()[1], "attempts": "1"}
    assert await alice.store.scan_keys(CTX, "reply:*") == []
    assert await alice.store.llen(CTX, keys.inflight("results")) == 0


async def test_a_result_for_a_request_the_node_does_not_remember_reads_its_inbox(node_factory):
    """After a restart the node no longer remembers where the requests it sent want their
    answers: it reads their reply_to (one round trip per batch of results)."""
    from tests.intake.test_rejections import job_message, push_in
    from tests.intake.test_result_batch import P
    from tests.intake.test_result_batch import answer as result_from
    from tests.nodes import add_known_peers

    alice = await node_factory("alice")
    await add_known_peers(alice, P)
    actor = read_key_file(alice.config.actor_key_path)
    name = new_inbox_name()
    # as alice's supervisor routed them to P before a restart: request and job copy written
    requests = [
        replace(job_message(actor, 1, alice.node_id, P.public_hex, f"print({n})"), reply_to=name)
        for n in range(2)
    ]
    plain = job_message(actor, 1, alice.node_id, P.public_hex, "print(2)")
    async with alice.store.transaction(CTX) as tx:
        for request in [*requests, plain]:
            tx.hset(request.key, request.to_hash() | {"status": "dispatched"})
            tx.hset(request.job[0].key, request.job[0].to_hash() | {"message_key": request.key})
    for n, request in enumerate([*requests, plain]):
        await push_in(alice, result_from(P, request, f"{n}\n"))
    client = Client(alice.store, inbox=name)
    with trio.fail_after(30):
        got = [await client.wait_results(r, timeout_s=20) for r in requests]
        [alone] = await client.wait_results(plain, timeout_s=20)  # no reply_to: its own list
    assert [r.stdout for [r] in got] == ["0\n", "1\n"]
    assert alone.stdout == "2\n"


_TEXT = st.text()  # surrogates included: json writes them escaped, orjson refuses them
_VALUES = st.one_of(_TEXT, st.integers(), st.booleans(), st.none())


@given(
    _TEXT,
    _TEXT,
    st.sampled_from(list(JobStatus)),
    st.dictionaries(_TEXT, st.one_of(_VALUES, st.lists(_VALUES, max_size=3)), max_size=4),
    _TEXT,
)
def test_a_reply_reads_as_json_loads_reads_it(
    in_reply_to: str, job_key: str, status: JobStatus, result: dict[str, object], reason: str
) -> None:
    """Replies are read by orjson where it can: the same values as json.loads gives, big
    integers and lone surrogates included (those it refuses json.loads reads)."""
    body = {"in_reply_to": in_reply_to, "job_key": job_key, "status": status.value}
    raw = json.dumps(body | {"result": result, "reason": reason})
    assert parse_reply(raw) == (in_reply_to, JobResult(job_key, status, result, reason))
    assert parse_reply(raw.encode()) == parse_reply(raw)


@pytest.mark.parametrize("raw", ["", "{", "[]", '{"job_key": "j"}', "NaN-ish", b"\xff"])
def test_an_unreadable_reply_is_a_value_error(raw: str | bytes) -> None:
    with pytest.raises(ValueError, match="unreadable reply"):
        parse_reply(raw)
