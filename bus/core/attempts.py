"""How an attempt ends: its outcome, the retry policy, and the one plan that ends every attempt.
Pure functions, no I/O (httpcore's pool plan: a function decides and returns what to do; the
caller does the I/O).

An attempt's outcome (:class:`Outcome`) is ``finished`` with the script's output (stdout,
stderr, exit_code) or ``error`` with a reason: :func:`outcome_of` makes it from an exit status
and output (a limit's reason, where one ended the job, is the runner's: node/slot/outcomes.py
``limit_reason``); the reason of a non-zero exit is read back as a cause by :func:`cause_of`.

An attempt ends three ways (:func:`plan_ending`): **retried** (an error the job's policy retries
while retries are left: the job waits in the ``delayed`` zset, its reason the failed attempt's,
its ``retry_of`` that attempt), **answered here** (the request was made on this node: the job's
final state and the client's reply in one script) or **answered remotely** (a result message,
signed by the caller with what it holds, goes back to the request's origin). Three callers
execute the plan, each with its own I/O: a runner process ending the job it ran (node/worker/),
the node ending an attempt it adopted from a dead process (node/runners/recovery.py), and the
node answering what an external runner finished (node/runners/external.py); the ending scripts
take the plan as bus/store/atomic/runs.py ``ending_of`` puts it.

The retry policy (:func:`after_attempt`): an error is retried, after a backoff with jitter,
while the job has retries left; a job that was stopped, or whose type has no runner, is never
retried. ``runner_lost`` (the process running it died) counts as a failed attempt. A job may
name the failures worth a retry (its signed ``retry_on``, fractor's ``retry_on``): ``timeout``,
``runner_lost``, ``exit:<code>`` or ``exit:any``; any other failure then ends the job at once,
retries left or not. Without ``retry_on`` every failure is retried. The backoff is exponential
(the default) or linear from the job's ``backoff_ms`` (default 500 ms).
"""

from __future__ import annotations

import random
import re
import signal

import msgspec

from bus.core import queues
from bus.core.envelope import ResultBody
from bus.core.ids import now
from bus.core.models import JobStatus, Message, RunnerJob, json_arg
from bus.core.reasons import Reason

# -- the outcome -----------------------------------------------------------------------------


class Outcome(msgspec.Struct, frozen=True):
    """How an attempt ended: its status, its result (the script's output and exit code) and,
    for an error, its reason."""

    status: JobStatus
    result: dict[str, str]
    reason: str = ""


def _clip(data: bytes | str, limit: int) -> str:
    if isinstance(data, str):
        return data
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {len(data) - limit} more bytes cut]" if len(data) > limit else "")


def outcome_of(
    returncode: int, stdout: bytes | str, stderr: bytes | str, max_output_bytes: int
) -> Outcome:
    """The job's outcome from its exit status and output (``max_output_bytes`` 0: as given)."""
    result = {
        "stdout": _clip(stdout, max_output_bytes),
        "stderr": _clip(stderr, max_output_bytes),
        "exit_code": str(returncode),
    }
    if returncode == 0:
        return Outcome(JobStatus.FINISHED, result)
    return Outcome(JobStatus.ERROR, result, exit_reason(returncode))


def exit_reason(returncode: int) -> str:
    """The reason :func:`outcome_of` gives an exit status ("" for 0)."""
    if returncode == 0:
        return ""
    if returncode < 0:  # killed by a signal we did not send: the runner process was lost
        return f"{Reason.RUNNER_LOST}: killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


# -- the retry policy ------------------------------------------------------------------------


NEVER_RETRY = (Reason.STOPPED, Reason.UNKNOWN_SCRIPT_TYPE, Reason.ISOLATION_REFUSED)
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0
EXPONENTIAL, LINEAR = "exponential", "linear"
# The reason of an attempt whose script exited non-zero (:func:`exit_reason`).
_EXIT = re.compile(r"exit code (\d+)")


class Next(msgspec.Struct, frozen=True):
    retry: bool
    delay_s: float = 0.0


class RetryPolicy(msgspec.Struct, frozen=True):
    """Which failures are retried (empty: all) and how long to wait before each retry."""

    retry_on: tuple[str, ...] = ()
    backoff: str = EXPONENTIAL
    base_s: float = BACKOFF_BASE_S

    @classmethod
    def of(cls, job: RunnerJob) -> RetryPolicy:
        """The policy a job signed (its fields are checked when the job is parsed)."""
        return cls(
            retry_on=tuple(job.retry_on),
            backoff=job.backoff or EXPONENTIAL,
            base_s=job.backoff_ms / 1000 if job.backoff_ms else BACKOFF_BASE_S,
        )

    def covers(self, reason: str) -> bool:
        """Whether a failure with this reason is one the policy retries."""
        if not self.retry_on:
            return True
        cause = cause_of(reason)
        return cause in self.retry_on or (cause.startswith("exit:") and "exit:any" in self.retry_on)


DEFAULT_POLICY = RetryPolicy()
_FINAL = Next(retry=False)  # frozen: one for every attempt that is not retried


def cause_of(reason: str) -> str:
    """The cause of a failed attempt, in ``retry_on``'s terms: ``timeout``, ``runner_lost``,
    ``exit:<code>``, or the reason's first token for any other failure."""
    exited = _EXIT.fullmatch(reason)
    if exited:
        return f"exit:{int(exited[1])}"
    return reason.split(":", 1)[0].strip()


def after_attempt(
    status: JobStatus,
    reason: str,
    attempt: int,
    retries: int,
    *,
    policy: RetryPolicy = DEFAULT_POLICY,
    rand: random.Random | None = None,
) -> Next:
    """Decide whether attempt number ``attempt`` (1-based) of a job with ``retries`` is retried."""
    if status is JobStatus.FINISHED or attempt > retries or reason.startswith(NEVER_RETRY):
        return _FINAL
    if not policy.covers(reason):
        return _FINAL
    delay = backoff_s(attempt, base_s=policy.base_s, kind=policy.backoff, rand=rand)
    return Next(retry=True, delay_s=delay)


# the node's own jitter: the random module's shared state is left to the application (a test
# or a program that seeds it, Hypothesis drawing in another thread) and not consumed here
_RANDOM = random.Random()


def backoff_s(
    attempt: int,
    *,
    base_s: float = BACKOFF_BASE_S,
    kind: str = EXPONENTIAL,
    rand: random.Random | None = None,
) -> float:
    """Backoff with jitter in [d/2, d], capped at BACKOFF_MAX_S: exponential
    d = base * 2**(attempt-1), linear d = base * attempt."""
    n = max(1, attempt)
    grown = base_s * n if kind == LINEAR else base_s * 2 ** min(n - 1, 64)
    ceiling = min(BACKOFF_MAX_S, grown)
    return ceiling * (0.5 + 0.5 * (rand or _RANDOM).random())


def attempt_entry(
    attempt: int, runner: str, status: str, reason: str, started_at: int, ended_at: int = 0
) -> str:
    """The record of one ended attempt, appended to ``attempts:<job>``; '' (nothing recorded)
    for a first attempt that finished the job: its hash says all of it (``attempt`` 1, status,
    ``runner``, ``updated_at``), so the common job writes no history. A job retried or failed
    has every attempt recorded. ``ended_at`` 0: now. JSON as a script argument is written
    (:func:`bus.core.models.json_arg`)."""
    if attempt == 1 and status == "finished":
        return ""
    record = {
        "attempt": attempt,
        "runner": runner,
        "status": status,
        "reason": reason,
        "started_at": started_at,
        "ended_at": ended_at or now(),
    }
    return json_arg(record)


# -- the plan --------------------------------------------------------------------------------


class Attempt(msgspec.Struct, frozen=True):
    """The attempt that ended: its number (the fencing token), the lease token of whoever ran
    it, and when it started and ended (wall-clock seconds; 0: unknown)."""

    number: int
    token: str
    started_at: int
    ended_at: int


class Retry(msgspec.Struct, frozen=True):
    """Record the failed attempt and queue the next one on ``queue`` after ``delay_s``."""

    cause: str  # the failed attempt's reason: the job's reason while the retry waits
    delay_s: float
    queue: str
    entry: str  # the attempt's record (:func:`attempt_entry`)


class AnswerHere(msgspec.Struct, frozen=True):
    """The job's final state and its client's reply, on this node (no result message)."""

    body: ResultBody
    entry: str
    reply_to: str  # the inbox the request named ("": its own reply list)

    @property
    def reply(self) -> str:
        """What the waiting client reads (bus/core/envelope.py reply_text)."""
        return self.body.reply()


class AnswerRemote(msgspec.Struct, frozen=True):
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
    policy: RetryPolicy | None,
    *,
    request: Message,
    here: str,
    rand: random.Random | None = None,
) -> Plan:
    """What ending ``attempt`` of ``job`` with ``outcome`` writes, under the job's retry
    ``policy`` (None: the one it signed, read only for an attempt that did not finish): a
    retry, or the answer to ``request`` (here when its origin is this node, ``here``, or
    unnamed; else remote). ``rand`` draws the retry's jitter."""
    status, reason = outcome.status, outcome.reason
    entry = attempt_entry(
        attempt.number, attempt.token, status.value, reason, attempt.started_at, attempt.ended_at
    )
    if policy is None:  # a finished attempt is never retried: its policy is not read
        policy = DEFAULT_POLICY if status is JobStatus.FINISHED else RetryPolicy.of(job)
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
