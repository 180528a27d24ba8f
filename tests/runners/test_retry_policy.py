"""Retry policies by cause (a job's signed retry_on and backoff): the pure decision, the job
fields, and jobs on a real node."""

from __future__ import annotations

import json
import random

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bus.client.api import new_job
from bus.core import keys
from bus.core.attempts import (
    BACKOFF_MAX_S,
    RetryPolicy,
    after_attempt,
    backoff_s,
    cause_of,
)
from bus.core.models import JobStatus, Message, RunnerJob
from bus.errors import ModelError
from crypto import read_key_file
from tests.scripts import work_file

CAUSES = ["timeout", "runner_lost", "exit:1", "exit:3", "exit:75", "exit:any"]
REASONS = {
    "timeout: killed after 5 s": "timeout",
    "runner_lost: killed by SIGKILL": "runner_lost",
    "exit code 3": "exit:3",
    "exit code 75": "exit:75",
    "malformed_job: no script": "malformed_job",
}


def test_cause_of_each_failure():
    for reason, cause in REASONS.items():
        assert cause_of(reason) == cause
    # timeout_ack is no job timeout
    assert cause_of("timeout_ack: no ack") == "timeout_ack"


@given(
    st.lists(st.sampled_from(CAUSES), max_size=3, unique=True),
    st.sampled_from(sorted(REASONS)),
    st.integers(1, 10),
    st.integers(0, 10),
)
def test_only_the_named_causes_are_retried(retry_on, reason, attempt, retries):
    policy = RetryPolicy(retry_on=tuple(retry_on))
    nxt = after_attempt(JobStatus.ERROR, reason, attempt, retries, policy=policy)
    cause = REASONS[reason]
    any_exit = cause.startswith("exit:") and "exit:any" in retry_on
    named = not retry_on or cause in retry_on or any_exit
    assert nxt.retry == (attempt <= retries and named)
    # a finished job, or a stopped one, is never retried, whatever the policy
    assert not after_attempt(JobStatus.FINISHED, "", attempt, retries, policy=policy).retry
    stopped = after_attempt(JobStatus.ERROR, "stopped: by 1", attempt, retries, policy=policy)
    assert not stopped.retry


@given(st.integers(1, 200), st.sampled_from(["exponential", "linear"]), st.integers(1, 10_000))
def test_backoff_is_jittered_below_its_ceiling(attempt, kind, base_ms):
    base = base_ms / 1000
    delay = backoff_s(attempt, base_s=base, kind=kind, rand=random.Random(attempt))
    grown = base * attempt if kind == "linear" else base * 2 ** (attempt - 1)
    ceiling = min(BACKOFF_MAX_S, grown)
    assert ceiling / 2 <= delay <= ceiling


@given(st.integers(1, 50), st.integers(1, 5000))
def test_linear_grows_by_steps_exponential_doubles(attempt, base_ms):
    top = random.Random(0)
    top.random = lambda: 1.0  # type: ignore[method-assign] # the ceiling itself
    base = base_ms / 1000
    lin = [backoff_s(a, base_s=base, kind="linear", rand=top) for a in (attempt, attempt + 1)]
    exp = [backoff_s(a, base_s=base, kind="exponential", rand=top) for a in (attempt, attempt + 1)]
    assert lin[1] == pytest.approx(min(BACKOFF_MAX_S, lin[0] + base))
    assert exp[1] == pytest.approx(min(BACKOFF_MAX_S, exp[0] * 2))


def test_policy_of_a_job_and_its_defaults():
    job = new_job(1, 1, "sh", "true", retries=2, retry_on=["exit:3"], backoff="linear",
                  backoff_ms=250)  # fmt: skip
    assert RetryPolicy.of(job) == RetryPolicy(("exit:3",), "linear", 0.25)
    assert RetryPolicy.of(new_job(1, 1, "sh", "true")) == RetryPolicy()


def test_policy_is_signed_and_stored_only_when_set():
    plain = new_job(1, 1, "sh", "true", retries=1)
    assert not {"retry_on", "backoff", "backoff_ms"} & plain.signed_dict().keys()
    assert not {"retry_on", "backoff", "backoff_ms"} & plain.to_hash().keys()
    job = new_job(1, 1, "sh", "true", retries=1, retry_on=["timeout", "exit:any"],
                  backoff="linear", backoff_ms=100)  # fmt: skip
    signed = job.signed_dict()
    assert (signed["retry_on"], signed["backoff"], signed["backoff_ms"]) == (
        ["timeout", "exit:any"], "linear", 100)  # fmt: skip
    assert RunnerJob.from_hash(job.to_hash()) == job
    assert RunnerJob.from_signed_dict(json.loads(json.dumps(signed))).signed_dict() == signed
    # a message's stored hash parses back to the same signed content
    msg = Message(1, 1, 1, job=[job], created_at=1, origin="a" * 64, destination="a" * 64)
    assert Message.from_hash(msg.to_hash()).signed_content() == msg.signed_content()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"retry_on": '["exit:0"]'}, "retry_on"),
        ({"retry_on": '["exit:256"]'}, "retry_on"),
        ({"retry_on": '["oom"]'}, "retry_on"),
        ({"retry_on": '"timeout"'}, "retry_on"),
        ({"backoff": "fibonacci"}, "backoff"),
        ({"backoff_ms": "3600001"}, "backoff_ms"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_field(fields, named):
    base = new_job(1, 1, "sh", "true").to_hash()
    with pytest.raises(ModelError, match=named):
        RunnerJob.from_hash(base | fields)
    with pytest.raises(ModelError, match=named):
        new_job(1, 1, "sh", "true", **{k: v if k == "backoff" else json.loads(v)
                                       for k, v in fields.items()})  # fmt: skip


async def submit(node, script: str, **policy):
    actor = read_key_file(node.config.actor_key_path)
    job = new_job(1, 1, "python", script, **policy)
    return await node.client.submit(actor, 1, to=node.node_id, context_id=1, jobs=[job])


def flaky(name: str, first_exit: int) -> str:
    """A script that exits ``first_exit`` on its first run and 0 after (its count in ``name``,
    in its work dir: tests/scripts.py work_file)."""
    return (
        f"import pathlib; p = pathlib.Path({name!r})\n"
        f"n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
        f"raise SystemExit({first_exit} if n == 1 else 0)\n"
    )


async def test_named_exit_code_is_retried_others_fail_at_once(
    node_factory, tmp_path, mock_clock, wall_clock_on_trio
):
    alice = await node_factory("alice")
    policy = {"retries": 3, "retry_on": ["exit:75"], "backoff": "linear", "backoff_ms": 100}
    retried = await submit(alice, flaky("a", 75), **policy)
    failed = await submit(alice, flaky("b", 3), **policy)
    with trio.fail_after(30):
        [ok] = await alice.client.wait_results(retried, timeout_s=30)
        [bad] = await alice.client.wait_results(failed, timeout_s=30)
    assert (ok.status, ok.result["attempts"]) == (JobStatus.FINISHED, "2")
    assert (bad.status, bad.reason, bad.result["attempts"]) == (JobStatus.ERROR, "exit code 3", "1")
    assert work_file(alice, "b").read_text() == "1"  # ran once, with 3 retries left
    log = [json.loads(e) for e in await alice.store.lrange(1, keys.attempts(ok.job_key))]
    assert [e["status"] for e in log] == ["error", "finished"]


async def test_a_node_refuses_a_job_with_a_bad_policy(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    job = RunnerJob(7, 1, 1, "print(1)", "python", retries=1, retry_on=["sometimes"])
    msg = await alice.client.submit(actor, 1, to=alice.node_id, context_id=1, jobs=[job])
    # a message that cannot be parsed has no job to answer: it is dead-lettered (popped here)
    with trio.fail_after(20):
        popped = await alice.store.call(1, lambda r: r.blpop([keys.DLQ], timeout=20))
    letter = json.loads(popped[1])
    assert (letter["key"], letter["reason"]) == (msg.key, "malformed")
    assert "retry_on" in letter["detail"]
    assert not await alice.store.exists(1, job.key)


def test_the_nodes_jitter_leaves_the_random_modules_state_alone() -> None:
    """Retry backoff, the dialler's redial wait, a link's ping payload, the pick of a free
    port and a sandbox worker's recycle point draw from their own generators: a program or a
    test that seeds the random module (Hypothesis draws examples while an in-process node runs
    in another thread) finds its sequence untouched."""
    from bus.wire.transport import jittered, ping_payload
    from node.host.valkey import free_port
    from node.sandbox.spawn import recycle_point

    state = random.getstate()
    assert 0.5 <= backoff_s(1, base_s=1.0) <= 1.0
    assert 0.5 <= jittered(1.0) < 1.5
    assert len({ping_payload() for _ in range(8)}) > 1  # 4 random bytes each
    assert free_port() > 0
    assert 875 <= recycle_point(1000) <= 1000
    assert random.getstate() == state
