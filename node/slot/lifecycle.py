"""What happens to a job after an attempt: pure decisions, no I/O.

An attempt ends ``finished`` or ``error``. An error is retried, after a backoff with jitter,
while the job has retries left; a job that was stopped, or whose type has no runner, is never
retried. ``runner_lost`` (the process running it died) counts as a failed attempt.

A job may name the failures worth a retry (its signed ``retry_on``, fractor's ``retry_on``):
``timeout``, ``runner_lost``, ``exit:<code>`` or ``exit:any``; any other failure then ends the
job at once, retries left or not. Without ``retry_on`` every failure is retried. The backoff
is exponential (the default) or linear from the job's ``backoff_ms`` (default 500 ms).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from bus.core.models import JobStatus, RunnerJob
from bus.core.reasons import Reason

NEVER_RETRY = (Reason.STOPPED, Reason.UNKNOWN_SCRIPT_TYPE, Reason.ISOLATION_REFUSED)
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0
EXPONENTIAL, LINEAR = "exponential", "linear"
# The reason of an attempt whose script exited non-zero (node/slot/outcomes.py: outcome_of).
_EXIT = re.compile(r"exit code (\d+)")


@dataclass(frozen=True)
class Next:
    retry: bool
    delay_s: float = 0.0


@dataclass(frozen=True)
class RetryPolicy:
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
        return Next(retry=False)
    if not policy.covers(reason):
        return Next(retry=False)
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
