"""The one plan that ends every attempt (bus/core/attempts.py: plan_ending), a pure function:
retry, answer here or answer a remote origin, with what each writes. Property-tested against
the retry policy it applies (after_attempt, beside it), which keeps its own tests."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from bus.core import queues
from bus.core.attempts import (
    BACKOFF_MAX_S,
    AnswerHere,
    AnswerRemote,
    Attempt,
    Outcome,
    Retry,
    RetryPolicy,
    after_attempt,
    ended_as,
    plan_ending,
)
from bus.core.envelope import reply_text
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from bus.store.atomic.runs import ending_of
from node.slot.away import Away

HERE, THERE = "a" * 64, "b" * 64
REASONS = st.sampled_from(
    ["exit code 3", f"{Reason.TIMEOUT}: killed after 5 s", f"{Reason.RUNNER_LOST}: gone",
     f"{Reason.STOPPED}: by its caller", "", "memory_limit: out"]
)  # fmt: skip
OUTCOMES = st.builds(
    Outcome,
    st.sampled_from([JobStatus.FINISHED, JobStatus.ERROR]),
    st.dictionaries(st.sampled_from(["stdout", "stderr", "exit_code"]), st.text(max_size=5)),
    REASONS,
)


def _job(retries: int, priority: str = "") -> RunnerJob:
    return RunnerJob(7, 1, 1, "print(1)", "python", retries=retries, message_key="message:1:9",
                     priority=priority)  # fmt: skip


def _request(origin: str, reply_to: str = "") -> Message:
    return Message(9, 1, 1, origin=origin, destination=HERE, reply_to=reply_to)


@given(
    OUTCOMES,
    st.integers(1, 6),
    st.integers(0, 5),
    st.sampled_from(["", HERE, THERE]),
    st.sampled_from(["", "high"]),
    st.integers(0, 2**32),
)
def test_the_plan_is_the_policy_s_decision_and_writes_what_it_decided(
    outcome: Outcome, number: int, retries: int, origin: str, priority: str, seed: int
) -> None:
    job, request = _job(retries, priority), _request(origin, "inbox:1")
    ran = Attempt(number, "tok", 100, 105)
    plan = plan_ending(
        job, outcome, ran, RetryPolicy.of(job), request=request, here=HERE, rand=random.Random(seed)
    )
    decided = after_attempt(
        outcome.status, outcome.reason, number, retries, rand=random.Random(seed)
    )
    assert isinstance(plan, Retry) == decided.retry
    ending = ending_of(plan, job.key, number, "inflight:x")
    assert (ending.job_key, ending.attempt, ending.inflight) == (job.key, number, "inflight:x")
    if isinstance(plan, Retry):
        # a typed retry: its cause is the failed attempt's reason, unchanged
        assert (plan.cause, ending.reason, ending.status) == (
            outcome.reason,
            outcome.reason,
            "retry",
        )
        assert plan.delay_s == decided.delay_s
        assert 0 < plan.delay_s <= BACKOFF_MAX_S
        assert plan.queue == queues.target_queue(job)
        assert ended_as(plan) == "retry"
        return
    body = plan.body
    assert body.result == outcome.result | {"attempts": str(number)}
    assert (body.job_key, body.in_reply_to) == (job.key, request.key)
    assert (body.status, body.reason) == (outcome.status, outcome.reason)
    assert (ending.status, ending.result, ending.reason) == (
        outcome.status.value, body.result, outcome.reason
    )  # fmt: skip
    assert ended_as(plan) == outcome.status.value
    if origin in ("", HERE):
        assert isinstance(plan, AnswerHere)
        assert plan.reply_to == "inbox:1"
        assert plan.reply == reply_text(
            request.key, job.key, outcome.status.value, body.result, outcome.reason
        )
    else:
        assert isinstance(plan, AnswerRemote)
        assert plan.request == request


@given(st.integers(1, 4), REASONS)
def test_every_attempt_but_a_first_one_that_finished_is_recorded(number: int, reason: str) -> None:
    for status in (JobStatus.FINISHED, JobStatus.ERROR):
        plan = plan_ending(
            _job(0),
            Outcome(status, {}, reason),
            Attempt(number, "tok", 100, 105),
            RetryPolicy(),
            request=_request(HERE),
            here=HERE,
        )
        if number == 1 and status is JobStatus.FINISHED:
            assert plan.entry == ""
            continue
        entry = json.loads(plan.entry)
        assert entry == {
            "attempt": number,
            "runner": "tok",
            "status": status.value,
            "reason": reason,
            "started_at": 100,
            "ended_at": 105,
        }


def test_a_policy_that_does_not_cover_the_failure_answers_at_once() -> None:
    job = _job(3)
    only_timeouts = RetryPolicy(retry_on=("timeout",))
    plan = plan_ending(
        job,
        Outcome(JobStatus.ERROR, {}, "exit code 1"),
        Attempt(1, "tok", 0, 1),
        only_timeouts,
        request=_request(THERE),
        here=HERE,
    )
    assert isinstance(plan, AnswerRemote)
    timed_out = Outcome(JobStatus.ERROR, {}, f"{Reason.TIMEOUT}: killed after 5 s")
    again = plan_ending(
        job, timed_out, Attempt(1, "tok", 0, 1), only_timeouts, request=_request(THERE), here=HERE
    )
    assert isinstance(again, Retry)


def test_an_end_valkey_refuses_is_tried_again_at_a_growing_bounded_wait(caplog) -> None:
    """The one schedule of the runner process's and the node's tries (node/slot/away.py)."""
    away = Away("job:1:7")
    waits = [away.failed(ConnectionError("refused")) for _ in range(8)]
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert away.tries == 8
    assert (
        caplog.messages[0]
        == "job:1:7: cannot record the outcome yet (ConnectionError('refused')); retrying"
    )
