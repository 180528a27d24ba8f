"""The one plan that ends every attempt: pure, no I/O (httpcore's pool plan: a function decides
and returns what to do; the caller does the I/O).

An attempt ends three ways: **retried** (an error the job's policy retries while retries are
left: the job waits in the ``delayed`` zset, its reason the failed attempt's, its ``retry_of``
that attempt), **answered here** (the request was made on this node: the job's final state and
the client's reply in one script) or **answered remotely** (a result message, signed by the
caller with what it holds, goes back to the request's origin). Three callers execute the plan,
each with its own I/O: a runner process ending the job it ran (node/worker/), the node ending
an attempt it adopted from a dead process (node/runners/recovery.py), and the node answering
what an external runner finished (node/runners/external.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bus.core import queues
from bus.core.envelope import ResultBody
from bus.core.models import Message, RunnerJob
from bus.store.atomic.runs import Ending, attempt_entry
from node.slot.lifecycle import RetryPolicy, after_attempt
from node.slot.outcomes import Outcome


@dataclass(frozen=True)
class Attempt:
    """The attempt that ended: its number (the fencing token), the lease token of whoever ran
    it, and when it started and ended (wall-clock seconds; 0: unknown)."""

    number: int
    token: str
    started_at: int
    ended_at: int


@dataclass(frozen=True)
class Retry:
    """Record the failed attempt and queue the next one on ``queue`` after ``delay_s``."""

    cause: str  # the failed attempt's reason: the job's reason while the retry waits
    delay_s: float
    queue: str
    entry: str  # the attempt's record (bus/store/atomic/runs.py attempt_entry)


@dataclass(frozen=True)
class AnswerHere:
    """The job's final state and its client's reply, on this node (no result message)."""

    body: ResultBody
    entry: str
    reply_to: str  # the inbox the request named ("": its own reply list)

    @property
    def reply(self) -> str:
        """What the waiting client reads (bus/core/envelope.py reply_text)."""
        return self.body.reply()


@dataclass(frozen=True)
class AnswerRemote:
    """The job's final state and a result message for the request's origin (built by
    bus/core/envelope.py build_result, signed by the caller)."""

    body: ResultBody
    entry: str
    request: Message


Plan = Retry | AnswerHere | AnswerRemote


def plan_ending(
    job: RunnerJob,
    outcome: Outcome,
    attempt: Attempt,
    policy: RetryPolicy,
    *,
    request: Message,
    here: str,
    rand: random.Random | None = None,
) -> Plan:
    """What ending ``attempt`` of ``job`` with ``outcome`` writes, under the job's retry
    ``policy``: a retry, or the answer to ``request`` (here when its origin is this node,
    ``here``, or unnamed; else remote). ``rand`` draws the retry's jitter."""
    status, reason = outcome.status, outcome.reason
    entry = attempt_entry(
        attempt.number, attempt.token, status.value, reason, attempt.started_at, attempt.ended_at
    )
    after = after_attempt(status, reason, attempt.number, job.retries, policy=policy, rand=rand)
    if after.retry:
        return Retry(reason, after.delay_s, queues.target_queue(job), entry)
    result = outcome.result | {"attempts": str(attempt.number)}
    body = ResultBody(request.key, job.key, status, result, reason)
    if request.origin in ("", here):
        return AnswerHere(body, entry, request.reply_to)
    return AnswerRemote(body, entry, request)


def ended_as(plan: Plan) -> str:
    """How the plan ends the attempt, as the job statistics and the breakers count it:
    ``retry``, ``finished`` or ``error``."""
    return "retry" if isinstance(plan, Retry) else plan.body.status.value


def ending_of(plan: Plan, job_key: str, attempt: int, inflight: str) -> Ending:
    """The plan as the ending scripts take it (bus/store/atomic/runs.py): a retry's reason is
    its cause, its status ``retry``."""
    if isinstance(plan, Retry):
        return Ending(job_key, attempt, inflight, "retry", {}, plan.cause, plan.entry)
    body = plan.body
    return Ending(
        job_key, attempt, inflight, body.status.value, body.result, body.reason, plan.entry
    )


def ended_counter(plan: Plan) -> str:
    """The node's counter (hero-node status) of an attempt the plan ended."""
    return "job_retries" if isinstance(plan, Retry) else "jobs_" + plan.body.status.value


__all__ = [
    "AnswerHere",
    "AnswerRemote",
    "Attempt",
    "Plan",
    "Retry",
    "ended_as",
    "ended_counter",
    "ending_of",
    "plan_ending",
]
