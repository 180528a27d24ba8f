"""Queue bounds at admission (issue 46): an actor past its bound of queued jobs in a context, or
a context past its own, is refused (``quota_exceeded``: a dead letter and an answer), while the
other actors' jobs still run; the counts live in Valkey and survive a restart.

The flooding actor submits ``sh`` jobs on a node with no ``sh`` runner: they stay queued, so its
depth stays at its bound and the test need not race the runners. Scaled down from the issue's
100,000 submits against a bound of 10,000 to 1,000 against 100 (the bound is a setting)."""

from __future__ import annotations

import argparse

import pytest
import trio

from bus.core import keys
from bus.core.models import JobStatus, Message
from bus.core.reasons import Reason
from bus.store import records
from crypto import KeyPair, read_key_file
from node.cli.status import status, status_facts
from node.config import validate_queue_limits
from node.errors import ConfigError
from node.observe.metrics import exposition
from tests.nodes import link_to
from tests.runners.test_runners import External

BOUND, FLOOD = 100, 1000
OTHER = 2  # the actor id of the one who does not flood
OTHER_S = str(OTHER)


async def _two_actors(node) -> tuple[KeyPair, KeyPair]:  # noqa: ANN001 - conftest.RunningNode
    flooder = read_key_file(node.config.actor_key_path)
    other = KeyPair.generate()
    await node.client.register_actor(OTHER, other.public_hex)
    await node.client.register_context(1, admins=[1], executors=[OTHER])
    return flooder, other


async def _submit(node, signer: KeyPair, caller: int, script_type: str, script: str) -> Message:  # noqa: ANN001
    return await node.client.submit_job(
        signer, caller, to=node.node_id, context_id=1, script_type=script_type, script=script
    )


async def _depths(node) -> dict[str, int]:  # noqa: ANN001
    """Each actor's count as stored, and the context's (their sum: bus.store.records)."""
    return await records.quota_depths(node.store, 1)


async def test_a_flooding_actor_is_refused_past_its_bound_while_another_actor_runs(
    node_factory,
):
    alice = await node_factory("alice", runners={"python": 1, "sh": 0}, max_queued_per_actor=BOUND)
    flooder, other = await _two_actors(alice)
    flood = [await _submit(alice, flooder, 1, "sh", f"echo {i}") for i in range(FLOOD)]
    # submitted after the flood, so judged after it (msg_out is first in, first out)
    mine = [await _submit(alice, other, OTHER, "python", f"print({i})") for i in range(5)]
    with trio.fail_after(60):
        ran = [(await alice.client.wait_results(m, timeout_s=60))[0] for m in mine]
        refused = [(await alice.client.wait_results(m, timeout_s=60))[0] for m in flood[BOUND:]]
    assert [r.stdout for r in ran] == [f"{i}\n" for i in range(5)]
    assert {r.status for r in refused} == {JobStatus.ERROR}
    assert all(r.reason.startswith(f"{Reason.QUOTA_EXCEEDED}: ") for r in refused)
    assert f"bound of {BOUND}" in refused[0].reason
    queued = [await alice.store.hgetall(1, m.job[0].key) for m in flood[:BOUND]]
    assert {j["status"] for j in queued} == {JobStatus.DISPATCHED.value}
    # each refusal is a dead letter with its reason
    letters = await alice.store.call(1, lambda r: r.lrange(keys.DLQ, 0, -1))
    assert sum(Reason.QUOTA_EXCEEDED.value in str(e) for e in letters) == FLOOD - BOUND
    # the other actor's started jobs left its count; the flooder's queued ones hold it
    assert await _depths(alice) == {"1": BOUND, OTHER_S: 0, keys.QUOTA_ALL: BOUND}

    await alice.stopped()  # the counts are in Valkey: a new boot holds the same bound
    alice = await node_factory("alice", again=alice)
    late = await _submit(alice, flooder, 1, "sh", "echo late")
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(late, timeout_s=30)
    assert result.reason.startswith(f"{Reason.QUOTA_EXCEEDED}: ")


async def test_a_context_bound_holds_across_actors_and_is_set_per_context(node_factory, capsys):
    alice = await node_factory(
        "alice",
        runners={"python": 1, "sh": 0},
        max_queued_per_actor=10,
        queue_limits={"1": {"context": 15}},
    )
    flooder, other = await _two_actors(alice)
    first = [await _submit(alice, flooder, 1, "sh", "true") for _ in range(12)]
    second = [await _submit(alice, other, OTHER, "sh", "true") for _ in range(12)]
    with trio.fail_after(30):
        over_actor = [(await alice.client.wait_results(m, 30))[0] for m in first[10:]]
        over_context = [(await alice.client.wait_results(m, 30))[0] for m in second[5:]]
    assert all("actor 1 holds 10 queued jobs" in r.reason for r in over_actor)
    assert all("context 1 holds 15 queued jobs" in r.reason for r in over_context)
    assert await _depths(alice) == {"1": 10, OTHER_S: 5, keys.QUOTA_ALL: 15}
    # hero-node status and /metrics show each actor's queued jobs against its bound
    facts = await status_facts(alice.client)
    assert facts["contexts"][1]["quotas"] == {
        "actors": {"1": {"depth": 10, "bound": 10}, OTHER_S: {"depth": 5, "bound": 10}},
        "context": {"depth": 15, "bound": 15},
    }
    assert alice.info.state is not None
    metrics, _ = await exposition(alice.info.state)
    assert b'hero_actor_queued_jobs{actor="1",ctx="1"} 10.0' in metrics
    assert b'hero_queue_bound{ctx="1",scope="context"} 15.0' in metrics
    await status(alice.client, argparse.Namespace(json=False, home=alice.config.home))
    assert "queued actor 1=10/10 actor 2=5/10; context 15/15" in capsys.readouterr().out


async def test_a_runner_under_its_acl_user_uncounts_the_job_it_starts(node_factory):
    """On the embedded Valkey the runner process starts jobs as the ``runner`` ACL user: the
    start that takes a job off its actor's count must be allowed to (node/host/acl.py)."""
    alice = await node_factory("alice", embedded=True, runners={"python": 1})
    actor = read_key_file(alice.config.actor_key_path)
    message = await _submit(alice, actor, 1, "python", "print('ran')")
    with trio.fail_after(30):
        [result] = await alice.client.wait_results(message, timeout_s=30)
    assert result.stdout == "ran\n"
    assert await _depths(alice) == {"1": 0, keys.QUOTA_ALL: 0}


async def test_an_external_runners_job_leaves_the_count_when_its_result_is_taken(node_factory):
    """An external runner starts jobs with raw commands (docs/use/runners.md#external-runners),
    not the start script: its job leaves its actor's count when the node takes its result."""
    alice = await node_factory("alice", runners={"python": 1, "ext": 0})
    actor = read_key_file(alice.config.actor_key_path)
    ext = External(alice.store, "ext-1", "ext")
    await ext.register()
    with trio.fail_after(30):
        message = await _submit(alice, actor, 1, "ext", "say 42")
        job, attempt = await ext.take()
        assert (await _depths(alice))["1"] == 1  # started by hand: still counted
        assert await ext.finish(job, attempt, "finished", {"stdout": "42"}) == 1
        [result] = await alice.client.wait_results(message, timeout_s=30)
    assert result.ok
    assert await _depths(alice) == {"1": 0, keys.QUOTA_ALL: 0}


async def test_a_bound_raised_for_one_context_is_logged_at_start(node_factory, caplog):
    await node_factory(
        "alice",
        queue_limits={"1": {"actor": 50_000}, "2": {"context": 0}, "3": {"actor": 5}},
    )
    raised = [r.getMessage() for r in caplog.records if "queue bound raised" in r.getMessage()]
    assert raised == [
        "queue bound raised: context 1: actor queue bound 50000 (node-wide 10000)",
        "queue bound raised: context 2: context queue bound lifted (node-wide 100000)",
    ]


def test_queue_limits_are_checked_when_the_configuration_is_read():
    assert validate_queue_limits({"2": {"actor": 5}}) == {"2": {"actor": 5}}
    for bad in ({"x": {"actor": 5}}, {"2": {"actors": 5}}, {"2": {"actor": -1}}, {"2": 5}):
        with pytest.raises(ConfigError):
            validate_queue_limits(bad)


async def test_a_peers_actor_is_bounded_at_the_destination_and_told_why(node_factory):
    """The same bound on the consumer's path: jobs a peer delivers are counted and refused
    where they would be queued, and the refusal reaches the caller at its origin."""
    alice = await node_factory("alice", runners={"python": 1, "sh": 0}, max_queued_per_actor=2)
    bob = await node_factory("bob")
    actor = await link_to(bob, alice)
    sent = [
        await bob.client.submit_job(
            actor, 1, to=alice.node_id, context_id=1, script_type="sh", script="true"
        )
        for _ in range(4)
    ]
    with trio.fail_after(30):
        refused = [(await bob.client.wait_results(m, timeout_s=30))[0] for m in sent[2:]]
    assert all(r.reason.startswith(f"{Reason.QUOTA_EXCEEDED}: actor 1 holds 2") for r in refused)
    assert (await _depths(alice))["1"] == 2
